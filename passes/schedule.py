"""Rematerialization problems, schedules, and the simulator that judges them.

Problem
-------
A computation DAG whose nodes are listed in a topological order; each node has
a compute cost and an output of some bytes. A *schedule* is a sequence of
operations ``compute(v)`` and ``free(v)``; it may compute a node several times
(rematerialization). It is valid when every ``compute(v)`` finds the outputs of
all predecessors of ``v`` resident and ``v`` itself not resident, every
``free(v)`` finds ``v`` resident, and every node of ``outputs`` is resident when
the schedule ends. Its cost is the sum of the costs of its computes; its peak is
the largest, over its computes, of the bytes resident just before the compute
plus the bytes of the output being computed (the inputs and the output of an
operation are in memory together). This module is the common ground truth of
the solvers in ``passes/`` (Checkmate, TWRemat, Rotor's plans).

Method
------
The memory model is the one of Checkmate (Jain et al., MLSys 2020, the ``U``
variables) and of TWRemat (Kumar et al., NeurIPS 2019, the sets ``U_i``).
:func:`from_computes` turns a sequence of computes into a schedule by freeing
each value right after its last use before it is computed again (or never, for
an output computed for the last time): for a fixed sequence of computes no
schedule holds less at any point.

Complexity: :func:`simulate` is ``O(len(schedule) * max in-degree)``;
:func:`from_computes` is ``O(len(computes) * max in-degree)``.

Example
-------
>>> problem = RematProblem(nodes=["a", "b", "c"], edges=[("a", "b"), ("b", "c"), ("a", "c")],
...                        cost={"a": 1, "b": 1, "c": 1}, size={"a": 4, "b": 8, "c": 2},
...                        outputs={"c"})
>>> no_remat(problem)
[compute('a'), compute('b'), compute('c'), free('a'), free('b')]
>>> simulate(problem, no_remat(problem))
Simulation(total_cost=3, peak_bytes=14)
>>> try:
...     simulate(problem, [compute("a"), compute("c")])
... except ScheduleError as err:
...     print(err)
op 1 compute('c'): inputs ['b'] are not resident
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from typing import NamedTuple

COMPUTE = "compute"
FREE = "free"


class ScheduleError(ValueError):
    """The schedule is not valid for the problem."""


class Op(NamedTuple):
    """One operation of a schedule: ``Op("compute", v)`` or ``Op("free", v)``."""

    kind: str
    node: str

    def __repr__(self) -> str:
        return f"{self.kind}({self.node!r})"


def compute(node: str) -> Op:
    return Op(COMPUTE, node)


def free(node: str) -> Op:
    return Op(FREE, node)


class Simulation(NamedTuple):
    total_cost: float
    peak_bytes: int


@dataclasses.dataclass(frozen=True)
class RematProblem:
    """The abstract rematerialization problem.

    nodes: every node, in a topological order (producers before users).
    edges: (producer, user) pairs; the user reads the producer's output.
    cost: cost of one computation of each node (time, FLOPs, any additive unit, >= 0).
    size: bytes of each node's output (>= 0).
    outputs: nodes that must be resident when the schedule ends. Nodes that are
        not ancestors of an output are never computed by the solvers.

    Graph inputs held by the caller anyway are best given size 0 and cost 0:
    they then cost nothing to hold or to "compute" (read).
    """

    nodes: Sequence[str]
    edges: Sequence[tuple[str, str]]
    cost: dict[str, float]
    size: dict[str, int]
    outputs: frozenset[str] | set[str] = frozenset()

    def __post_init__(self):
        index = {}
        for i, v in enumerate(self.nodes):
            if v in index:
                raise ValueError(f"node {v!r} listed twice")
            index[v] = i
        for u, v in self.edges:
            if u not in index or v not in index:
                raise ValueError(f"edge ({u!r}, {v!r}) names an unknown node")
            if index[u] >= index[v]:
                raise ValueError(f"edge ({u!r}, {v!r}) goes against the node order (not topological)")
        for v in self.nodes:
            if self.cost.get(v, -1) < 0 or self.size.get(v, -1) < 0:
                raise ValueError(f"node {v!r} needs a cost >= 0 and a size >= 0")
        unknown = [o for o in self.outputs if o not in index]
        if unknown:
            raise ValueError(f"unknown outputs {sorted(unknown)!r}")
        object.__setattr__(self, "_index", index)

    # Index views (node i is self.nodes[i]); lists keep node order for reproducibility.
    @property
    def index(self) -> dict[str, int]:
        return self._index  # type: ignore[attr-defined]

    @functools.cached_property
    def preds(self) -> list[list[int]]:
        preds: list[list[int]] = [[] for _ in self.nodes]
        for u, v in self.edges:
            if self.index[u] not in preds[self.index[v]]:
                preds[self.index[v]].append(self.index[u])
        return [sorted(p) for p in preds]

    @functools.cached_property
    def users(self) -> list[list[int]]:
        users: list[list[int]] = [[] for _ in self.nodes]
        for v, ps in enumerate(self.preds):
            for p in ps:
                users[p].append(v)
        return users

    @functools.cached_property
    def output_ids(self) -> list[int]:
        return [i for i, v in enumerate(self.nodes) if v in self.outputs]

    @functools.cached_property
    def needed(self) -> list[int]:
        """Indices of the ancestors of the outputs (outputs included), in node order."""
        mark = [False] * len(self.nodes)
        for o in self.output_ids:
            mark[o] = True
        for v in range(len(self.nodes) - 1, -1, -1):
            if mark[v]:
                for p in self.preds[v]:
                    mark[p] = True
        return [v for v in range(len(self.nodes)) if mark[v]]

    def restricted(self) -> RematProblem:
        """The same problem without the nodes no output depends on."""
        keep = [self.nodes[i] for i in self.needed]
        kept = set(keep)
        return RematProblem(
            nodes=keep,
            edges=[(u, v) for u, v in self.edges if u in kept and v in kept],
            cost={v: self.cost[v] for v in keep}, size={v: self.size[v] for v in keep},
            outputs=frozenset(self.outputs))


def simulate(problem: RematProblem, schedule: Iterable[Op]) -> Simulation:
    """Check ``schedule`` and return its total cost and peak bytes; raise ScheduleError if invalid."""
    index, preds, size = problem.index, problem.preds, problem.size
    resident = [False] * len(problem.nodes)
    live = 0
    peak = 0
    total = 0
    for step, op in enumerate(schedule):
        kind, node = op
        i = index.get(node)
        if i is None:
            raise ScheduleError(f"op {step} {op!r}: unknown node")
        if kind == COMPUTE:
            if resident[i]:
                raise ScheduleError(f"op {step} {op!r}: {node!r} is already resident")
            missing = [problem.nodes[p] for p in preds[i] if not resident[p]]
            if missing:
                raise ScheduleError(f"op {step} {op!r}: inputs {missing!r} are not resident")
            live += size[node]
            peak = max(peak, live)
            total += problem.cost[node]
            resident[i] = True
        elif kind == FREE:
            if not resident[i]:
                raise ScheduleError(f"op {step} {op!r}: {node!r} is not resident")
            live -= size[node]
            resident[i] = False
        else:
            raise ScheduleError(f"op {step} {op!r}: unknown kind {kind!r}")
    missing = [problem.nodes[o] for o in problem.output_ids if not resident[o]]
    if missing:
        raise ScheduleError(f"outputs {missing!r} are not resident at the end of the schedule")
    return Simulation(total_cost=total, peak_bytes=peak)


def from_computes(problem: RematProblem, computes: Iterable[str]) -> list[Op]:
    """A schedule running ``computes`` in this order, each value freed right after its last
    use before it is computed again; outputs stay after their last computation.

    Raises ScheduleError if a compute comes before any computation of one of its inputs.
    """
    index, preds = problem.index, problem.preds
    seq = [index[v] for v in computes]
    # Backward pass: for each compute, which inputs (and itself) are read for the last time
    # before their next computation.
    n = len(problem.nodes)
    is_output = [False] * n
    for o in problem.output_ids:
        is_output[o] = True
    pending = list(is_output)  # will the current value of v be read (or kept) later?
    frees_after: list[list[int]] = [[] for _ in seq]
    for pos in range(len(seq) - 1, -1, -1):
        v = seq[pos]
        dead: list[int] = []
        for p in preds[v]:
            if not pending[p]:
                dead.append(p)
                pending[p] = True
        if not pending[v]:
            dead.append(v)  # computed for nothing: freed at once
        pending[v] = False  # earlier values of v die before this compute
        frees_after[pos] = dead
    schedule: list[Op] = []
    computed = [False] * n
    for pos, v in enumerate(seq):
        for p in preds[v]:
            if not computed[p]:
                raise ScheduleError(
                    f"compute {pos} ({problem.nodes[v]!r}) reads {problem.nodes[p]!r} before it is computed")
        computed[v] = True
        schedule.append(compute(problem.nodes[v]))
        schedule.extend(free(problem.nodes[d]) for d in frees_after[pos])
    return schedule


def no_remat(problem: RematProblem) -> list[Op]:
    """Every needed node once, in node order, each freed after its last use."""
    return from_computes(problem, [problem.nodes[i] for i in problem.needed])


def memory_lower_bound(problem: RematProblem) -> int:
    """A lower bound on the peak of every valid schedule: the largest working set of one
    compute (its inputs and its output), and the bytes of all outputs (resident together
    at the last compute)."""
    size = [problem.size[v] for v in problem.nodes]
    working = max((size[v] + sum(size[p] for p in problem.preds[v]) for v in problem.needed), default=0)
    return max(working, sum(size[o] for o in problem.output_ids))
