"""Checkmate by exhaustive search: the references the ILP is tested against.

Problem
-------
The cheapest schedule of a :class:`~passes.remat_problem.RematProblem` whose peak (as
:func:`passes.schedule.simulate` counts it) is at most a budget: among all schedules
(:func:`brute_force`), or among the staged schedules the ILP of
:mod:`passes.checkmate_milp` ranges over (:func:`brute_force_staged`). The two differ
when a better schedule first-computes nodes in another order, or computes a node
twice between two first computations.

Method
------
:func:`brute_force`: Dijkstra over resident sets (and, with tied nodes, the latest
compute), one move a ``compute`` or a ``free``. :func:`brute_force_staged`: every
0/1 ``S`` of the model, each with the least ``R`` it allows
(:func:`passes.checkmate_rounding.recompute_given_storage`), simulated.

Complexity: exponential: ``2^n`` resident sets for ``n`` nodes (times ``n`` with tied
nodes); ``2^(n(n-1)/2)`` storage matrices for the staged search. Tests only.

Example
-------
Keeping both ends of a chain within 3 bytes needs ``v0`` recomputed after ``v3``: no
staged schedule does that (stage 3 computes its nodes in node order).

>>> from fxremat.passes.schedule import RematProblem
>>> p = RematProblem(nodes=["v0", "v1", "v2", "v3"], edges=[("v0", "v1"), ("v1", "v2"), ("v2", "v3")],
...                  cost={"v0": 2, "v1": 3, "v2": 1, "v3": 4}, size={"v0": 1, "v1": 1, "v2": 2, "v3": 1},
...                  outputs={"v0", "v3"})
>>> cost, schedule = brute_force(p, 3)
>>> cost, [op.node for op in schedule if op.kind == "compute"]
(12, ['v0', 'v1', 'v2', 'v3', 'v0'])
>>> try:
...     brute_force_staged(p, 3)
... except InfeasibleBudget as err:
...     print(err)
no staged schedule fits 3 bytes
>>> brute_force_staged(p, 4)[0]
10
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from .checkmate_milp import InfeasibleBudget, _schedule, stages_of
from .checkmate_rounding import recompute_given_storage
from .schedule import Op, RematProblem, ScheduleError, memory_lower_bound


def brute_force(problem: RematProblem, budget: float) -> tuple[float, list[Op]]:
    """The cheapest schedule of all (not only staged ones) with peak <= ``budget``.

    Dijkstra over resident sets (and, with tied nodes, the latest compute), one move a
    ``compute`` or a ``free``.

    Parameters
    ----------
    problem : RematProblem
    budget : float
        Bytes.

    Returns
    -------
    cost : float
    schedule : list of Op
        A cheapest valid schedule whose peak is at most ``budget``.

    Raises
    ------
    InfeasibleBudget
        If there is none.

    Complexity
    ----------
    ``2^n`` resident sets for ``n`` needed nodes (times ``n`` with tied nodes), ``O(n)``
    moves each: tests only.
    """
    sub = problem.restricted()
    n = len(sub.nodes)
    size = [sub.size[v] for v in sub.nodes]
    cost = [sub.cost[v] for v in sub.nodes]
    work = sub.work
    tied_to = sub.tied_to
    track_last = any(f is not None for f in tied_to)
    pred_mask = [sum(1 << p for p in ps) for ps in sub.preds]
    pin_mask = [sum(1 << x for x in xs) for xs in sub.pinned_by]
    goal = sum(1 << o for o in sub.output_ids)
    start = (0, -1)
    mem = {start: 0}
    dist = {start: 0}
    parent: dict[tuple[int, int], tuple[tuple[int, int], Op]] = {}
    counter = itertools.count()
    heap = [(0, next(counter), start)]
    while heap:
        d, _, key = heapq.heappop(heap)
        if d > dist[key]:
            continue
        state, last = key
        if state & goal == goal:
            ops = []
            while key in parent:
                key, op = parent[key]
                ops.append(op)
            return d, ops[::-1]
        used = mem[key]
        for v in range(n):
            bit = 1 << v
            if state & bit:
                if state & pin_mask[v]:
                    continue
                nxt, step, op = (state & ~bit, last), 0, Op("free", sub.nodes[v])
                nmem = used - size[v]
            elif (state & pred_mask[v] == pred_mask[v] and used + size[v] + work[v] <= budget
                  and (tied_to[v] is None or tied_to[v] == last)):
                nxt, step, op = (state | bit, v if track_last else -1), cost[v], Op("compute", sub.nodes[v])
                nmem = used + size[v]
            else:
                continue
            if d + step < dist.get(nxt, float("inf")):
                dist[nxt] = d + step
                mem[nxt] = nmem
                parent[nxt] = (key, op)
                heapq.heappush(heap, (d + step, next(counter), nxt))
    raise InfeasibleBudget(f"no schedule fits {budget:g} bytes", budget=budget,
                           lower_bound=memory_lower_bound(problem))


def brute_force_staged(problem: RematProblem, budget: float) -> tuple[float, list[Op]]:
    """The cheapest staged schedule with peak <= ``budget``: what the ILP optimizes over.

    Every 0/1 ``S`` with the least ``R`` for each
    (:func:`~passes.checkmate_rounding.recompute_given_storage`), simulated.

    Parameters
    ----------
    problem : RematProblem
    budget : float
        Bytes.

    Returns
    -------
    cost : float
    schedule : list of Op

    Raises
    ------
    InfeasibleBudget
        If no staged schedule fits.

    Complexity
    ----------
    Exponential in the number of ``S`` variables (``n(n-1)/2`` for ``n`` needed nodes
    without tied nodes), a rounding and a simulation each: tests only.
    """
    sub = problem.restricted()
    n = len(sub.nodes)
    nodes = list(sub.nodes)
    stages = stages_of(sub)
    P = len(stages)
    free_bits = [(p, i) for p in range(1, P) for i in range(stages[p][0])]
    best = None
    S = np.zeros((P + 1, n), dtype=bool)
    S[P, sub.output_ids] = True
    for bits in itertools.product((False, True), repeat=len(free_bits)):
        for (p, i), b in zip(free_bits, bits):
            S[p, i] = b
        R = recompute_given_storage(sub, S)
        try:
            schedule, cost, peak = _schedule(problem, nodes, R)
        except ScheduleError:
            continue  # a tied node needed while its owner is resident
        if peak <= budget and (best is None or cost < best[0]):
            best = (cost, schedule)
    if best is None:
        raise InfeasibleBudget(f"no staged schedule fits {budget:g} bytes", budget=budget,
                               lower_bound=memory_lower_bound(problem))
    return best
