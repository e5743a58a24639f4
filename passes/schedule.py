"""Schedules of a DAG problem, and the simulator that judges them.

Problem
-------
Given a :class:`~passes.remat_problem.RematProblem` (a DAG in topological order with
costs, output bytes, workspaces, outputs and tied nodes), a *schedule* is a sequence
of operations ``compute(v)`` and ``free(v)``; it may compute a node several times
(rematerialization). It is valid when every ``compute(v)`` finds the outputs of
all predecessors of ``v`` resident and ``v`` itself not resident, every
``free(v)`` finds ``v`` resident, and every node of ``outputs`` is resident when
the schedule ends; a node tied to ``f`` must be computed right after ``f``, and
while it is resident none of its inputs may be freed. Its cost is the sum of the
costs of its computes; its peak is
the largest, over its computes, of the bytes resident just before the compute
plus the bytes of the output being computed (the inputs and the output of an
operation are in memory together) plus the node's ``workspace`` (temporary
bytes of the operation, default 0). This module is the common ground truth of
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

from collections.abc import Iterable
from typing import NamedTuple

from .remat_problem import RematProblem

__all__ = [
    "COMPUTE", "FREE", "Op", "RematProblem", "ScheduleError", "Simulation", "compute", "free", "from_computes",
    "memory_lower_bound", "no_remat", "simulate",
]

COMPUTE = "compute"
FREE = "free"


class ScheduleError(ValueError):
    """The schedule is not valid for the problem.

    Parameters
    ----------
    message : str
        The first broken rule, with the operation's position.

    Returns
    -------
    ScheduleError

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """


class Op(NamedTuple):
    """One operation of a schedule: ``Op("compute", v)`` or ``Op("free", v)``.

    Parameters
    ----------
    kind : str
        ``"compute"`` or ``"free"``.
    node : str

    Returns
    -------
    Op
        A named tuple, shown as ``compute('v')`` or ``free('v')``.

    Raises
    ------
    Nothing
        The kind is checked by :func:`simulate`.

    Complexity
    ----------
    ``O(1)``.
    """

    kind: str
    node: str

    def __repr__(self) -> str:
        return f"{self.kind}({self.node!r})"


def compute(node: str) -> Op:
    """``Op("compute", node)``.

    Parameters
    ----------
    node : str

    Returns
    -------
    Op

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """
    return Op(COMPUTE, node)


def free(node: str) -> Op:
    """``Op("free", node)``.

    Parameters
    ----------
    node : str

    Returns
    -------
    Op

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """
    return Op(FREE, node)


class Simulation(NamedTuple):
    """What :func:`simulate` measures of a valid schedule.

    Parameters
    ----------
    total_cost : float
        The summed cost of the computes.
    peak_bytes : int
        The largest resident bytes at a compute (its output and workspace included).

    Returns
    -------
    Simulation
        A named tuple.

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """

    total_cost: float
    peak_bytes: int


def simulate(problem: RematProblem, schedule: Iterable[Op]) -> Simulation:
    """Check ``schedule`` against the rules of the module docstring; return its cost and peak.

    Parameters
    ----------
    problem : RematProblem
    schedule : iterable of Op

    Returns
    -------
    Simulation
        ``(total_cost, peak_bytes)``.

    Raises
    ------
    ScheduleError
        At the first operation that breaks a rule (unknown node or kind, missing input,
        recompute of a resident value, free of a value not resident or pinned by a
        resident tied node, a tied node not computed right after its owner), or when an
        output is not resident at the end.

    Complexity
    ----------
    ``O(len(schedule) * d)`` for in-degree ``d``.

    References
    ----------
    The memory model of Checkmate (Jain et al., MLSys 2020, the ``U`` variables) and of
    TWRemat (Kumar et al., NeurIPS 2019, section 2.1).
    """
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
    """A schedule running ``computes`` in this order, each value freed as early as it can be.

    Each value is freed right after its last use before it is computed again (a value
    computed and never used is freed at once); outputs stay after their last
    computation. For this sequence of computes, no schedule holds less at any point.

    Parameters
    ----------
    problem : RematProblem
    computes : iterable of str
        Node names, each compute after a compute of every input of the node.

    Returns
    -------
    list of Op

    Raises
    ------
    ScheduleError
        If a compute comes before any computation of one of its inputs.
    KeyError
        If a name is not a node of ``problem``.

    Complexity
    ----------
    ``O(len(computes) * d)`` for in-degree ``d``.
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
    """The schedule without rematerialization: every needed node once, in node order.

    Parameters
    ----------
    problem : RematProblem

    Returns
    -------
    list of Op
        :func:`from_computes` of the ancestors of the outputs (outputs included).

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(n + m)``.
    """
    return from_computes(problem, [problem.nodes[i] for i in problem.needed])


def memory_lower_bound(problem: RematProblem) -> int:
    """A lower bound on the peak of every valid schedule.

    The largest working set of one compute (its inputs, its output and its workspace),
    and the bytes of all outputs (resident together at the last compute).

    Parameters
    ----------
    problem : RematProblem

    Returns
    -------
    int

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(n + m)``.
    """
    size = [problem.size[v] for v in problem.nodes]
    working = max((size[v] + problem.work[v] + sum(size[p] for p in problem.preds[v]) for v in problem.needed),
                  default=0)
    return max(working, sum(size[o] for o in problem.output_ids))
