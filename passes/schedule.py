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
operation are in memory together) plus the node's ``workspace`` (temporary
bytes of the operation, default 0). This module is the common ground truth of
the solvers in ``passes/`` (Checkmate, TWRemat, Rotor's plans).

*Tied* nodes model an operation with two outputs of which the second may be
kept or dropped, such as a forward stage that also records what its backward
needs (Rotor's ``F_all`` against ``F_ck``; :mod:`passes.chain_dag`). A node
``x`` tied to ``f`` (``tied={x: f}``, ``f`` an input of ``x``, listed right
before it) can only be computed directly after ``f`` (no compute in between:
the same operation), and while ``x`` is resident none of its inputs may be
freed (``x`` references them, as saved tensors do).

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
    workspace: temporary bytes of a node's operation, counted while it is computed
        (on top of its inputs and output); missing nodes have none.
    tied: ``{x: f}``: ``x`` is a second output of ``f``'s operation (see the module
        docstring). ``f`` must be an input of ``x`` and come right before it in
        ``nodes``; every user of ``x`` must also read every input of ``x`` (so that
        freeing values after their last use never frees an input of a resident ``x``).

    Graph inputs held by the caller anyway are best given size 0 and cost 0:
    they then cost nothing to hold or to "compute" (read).
    """

    nodes: Sequence[str]
    edges: Sequence[tuple[str, str]]
    cost: dict[str, float]
    size: dict[str, int]
    outputs: frozenset[str] | set[str] = frozenset()
    workspace: dict[str, int] = dataclasses.field(default_factory=dict)
    tied: dict[str, str] = dataclasses.field(default_factory=dict)

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
        for v, w in self.workspace.items():
            if v not in index or w < 0:
                raise ValueError(f"workspace of {v!r}: needs a known node and bytes >= 0")
        for x, f in self.tied.items():
            if x not in index or f not in index:
                raise ValueError(f"tied ({x!r}, {f!r}) names an unknown node")
            if index[x] != index[f] + 1 or index[f] not in self.preds[index[x]]:
                raise ValueError(f"tied node {x!r} must read {f!r} and come right after it in the node order")
            if f in self.tied or x in self.tied.values():
                raise ValueError(f"tied ({x!r}, {f!r}): an operation has at most two outputs")
            for u in self.users[index[x]]:
                missing = [self.nodes[q] for q in self.preds[index[x]] if q not in self.preds[u]]
                if missing:
                    raise ValueError(f"{self.nodes[u]!r} reads the tied node {x!r} but not its inputs {missing!r}")

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
    def tied_to(self) -> list[int | None]:
        """``tied_to[x]``: the index of the node ``x`` is tied to, or None."""
        out: list[int | None] = [None] * len(self.nodes)
        for x, f in self.tied.items():
            out[self.index[x]] = self.index[f]
        return out

    @functools.cached_property
    def pinned_by(self) -> list[list[int]]:
        """``pinned_by[q]``: the tied nodes that read ``q`` (``q`` stays while one is resident)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for x, f in enumerate(self.tied_to):
            if f is not None:
                for q in self.preds[x]:
                    out[q].append(x)
        return out

    @functools.cached_property
    def work(self) -> list[int]:
        """Workspace bytes by node index."""
        return [self.workspace.get(v, 0) for v in self.nodes]

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
            outputs=frozenset(self.outputs),
            workspace={v: w for v, w in self.workspace.items() if v in kept},
            tied={x: f for x, f in self.tied.items() if x in kept})


def simulate(problem: RematProblem, schedule: Iterable[Op]) -> Simulation:
    """Check ``schedule`` and return its total cost and peak bytes; raise ScheduleError if invalid."""
    index, preds, size = problem.index, problem.preds, problem.size
    tied_to, pinned_by, work = problem.tied_to, problem.pinned_by, problem.work
    resident = [False] * len(problem.nodes)
    live = 0
    peak = 0
    total = 0
    last = None  # the node of the latest compute
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
            if tied_to[i] is not None and last != tied_to[i]:
                raise ScheduleError(f"op {step} {op!r}: {node!r} is tied to {problem.nodes[tied_to[i]]!r} "
                                    f"and must be computed right after it")
            live += size[node]
            peak = max(peak, live + work[i])
            total += problem.cost[node]
            resident[i] = True
            last = i
        elif kind == FREE:
            if not resident[i]:
                raise ScheduleError(f"op {step} {op!r}: {node!r} is not resident")
            pins = [problem.nodes[x] for x in pinned_by[i] if resident[x]]
            if pins:
                raise ScheduleError(f"op {step} {op!r}: {node!r} is read by the resident tied node(s) {pins!r}")
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
        dead.sort(key=lambda d: problem.tied_to[d] is None)  # a tied node before the inputs it pins
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
    compute (its inputs, its output and its workspace), and the bytes of all outputs
    (resident together at the last compute)."""
    size = [problem.size[v] for v in problem.nodes]
    working = max((size[v] + problem.work[v] + sum(size[p] for p in problem.preds[v]) for v in problem.needed),
                  default=0)
    return max(working, sum(size[o] for o in problem.output_ids))
