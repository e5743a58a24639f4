"""Checkmate's two-phase LP rounding: near-optimal staged schedules for large graphs.

Problem
-------
The problem of :mod:`passes.checkmate` (the cheapest staged schedule of a
:class:`~passes.remat_problem.RematProblem` under a budget) on graphs too large for the
ILP: a schedule that fits, as cheap as can be found in polynomial time.

Method
------
The paper's *two-phase rounding* (Jain et al., MLSys 2020, arXiv 1910.02653): solve the LP
relaxation of :mod:`passes.checkmate_milp`, round ``S`` (at several thresholds, and at
random with probability ``S`` -- the paper's deterministic and randomized roundings,
seeded), then take the least ``R`` that ``S`` allows (:func:`recompute_given_storage`:
a node is recomputed in stage ``t`` exactly when a later computation of the stage
reads it or the next stage keeps it, and it is not resident) -- one backward sweep
per stage. Two additions make it reach the ILP's cost far more often
(``bench/checkmate_zoo.py``): a rounding over the budget is repaired greedily (stop
keeping, until it is next read, a value resident where the memory overflows), and
the cheapest fitting rounding is improved by local search ('keep instead of
recompute' moves, each repaired if it overflows, while the cost drops). The LP is
solved at the budget and at a few smaller budgets, whose roundings are candidates
too. Every returned schedule is checked with :func:`passes.schedule.simulate`.

Complexity: the LP is polynomial (HiGHS); one rounding is ``O(n (n + m))`` for ``n``
nodes and ``m`` edges, and every repair or improvement move costs one rounding plus a
simulation (the local search stops when no move helps, or at the time limit).

Example
-------
Keeping nothing from one stage to the next, each stage recomputes all it needs:

>>> import numpy as np
>>> from fxremat.passes.schedule import RematProblem
>>> p = RematProblem(nodes=["a", "b", "c", "gb", "ga"],
...                  edges=[("a", "b"), ("b", "c"), ("c", "gb"), ("b", "gb"), ("gb", "ga"), ("a", "ga")],
...                  cost={"a": 1, "b": 10, "c": 1, "gb": 1, "ga": 1},
...                  size={"a": 1, "b": 1, "c": 1, "gb": 1, "ga": 1}, outputs={"ga"})
>>> S = np.zeros((6, 5), dtype=bool)
>>> S[5, 4] = True  # the end state: the output ga
>>> recompute_given_storage(p, S).astype(int)
array([[1, 0, 0, 0, 0],
       [1, 1, 0, 0, 0],
       [1, 1, 1, 0, 0],
       [1, 1, 1, 1, 0],
       [1, 1, 1, 1, 1]])
>>> solve_lp(p, budget=3).cost  # the ILP's optimum here
15
"""

from __future__ import annotations

import time

import numpy as np

from .checkmate_milp import CheckmateSolution, InfeasibleBudget, NoScheduleFound, _empty, _Model, _schedule, stages_of
from .schedule import RematProblem, ScheduleError, memory_lower_bound


def recompute_given_storage(sub: RematProblem, S: np.ndarray) -> np.ndarray:
    """Phase two of two-phase rounding: the least ``R`` that a 0/1 ``S`` allows.

    In stage ``p``, ``R[p,i] = 1`` when ``i`` is the stage's head, or ``i`` is not
    resident at the start of the stage and either the next stage keeps it or a node
    computed later in the stage reads it. Users come after their inputs, so one backward
    sweep over each stage settles it.

    Parameters
    ----------
    sub : RematProblem
        Restricted (every node needed).
    S : numpy.ndarray of bool
        One row per stage of :func:`~passes.checkmate_milp.stages_of` plus the final
        state, one column per node.

    Returns
    -------
    numpy.ndarray of bool
        ``R``, one row per stage. With tied nodes it may be invalid -- a tied node needed
        while its owner is resident -- which :func:`passes.schedule.simulate` reports.

    Raises
    ------
    IndexError
        If ``S`` has fewer rows or columns than the stages and nodes of ``sub``.

    Complexity
    ----------
    ``O(P (n + m))`` for ``P`` stages, ``n`` nodes and ``m`` edges.

    References
    ----------
    Jain et al., MLSys 2020 (arXiv 1910.02653): two-phase rounding.
    """
    users = sub.users
    stages = stages_of(sub)
    R = np.zeros((len(stages), len(sub.nodes)), dtype=bool)
    for p, (head, top) in enumerate(stages):
        R[p, head] = True
        for i in range(top, -1, -1):
            if i == head or (i < head and S[p, i]):
                continue
            R[p, i] = bool(S[p + 1, i]) or any(R[p, j] for j in users[i] if j <= top)
    return R


class _Rounder:
    """Phase two and the local moves of :func:`solve_lp` on one problem (``S`` is 0/1)."""

    def __init__(self, problem: RematProblem, sub: RematProblem, budget: float):
        self.problem, self.sub, self.budget = problem, sub, budget
        self.nodes = list(sub.nodes)
        self.stages = stages_of(sub)
        self.P = len(self.stages)

    def evaluate(self, S: np.ndarray):
        """``(cost, peak, schedule, R, S)`` of the least ``R`` for ``S``, or None if invalid."""
        R = recompute_given_storage(self.sub, S)
        try:
            schedule, cost, peak = _schedule(self.problem, self.nodes, R)
        except ScheduleError:
            return None  # a tied node needed while its owner is resident
        return cost, peak, schedule, R, S

    def _overflow(self, found) -> tuple[float, tuple[int, int, list[int]] | None]:
        """The bytes over the budget summed over the computes, and the stage ``p``, node ``k``
        and resident nodes of the first compute over the budget (None if it fits)."""
        _, _, schedule, R, _ = found
        sub, index = self.sub, self.sub.index
        order = [(p, i) for p in range(self.P) for i in range(R.shape[1]) if R[p, i]]
        resident: set[int] = set()
        live, c, total, first = 0, -1, 0.0, None
        for op in schedule:
            i = index[op.node]
            if op.kind == "compute":
                c += 1
                resident.add(i)
                live += sub.size[op.node]
                over = live + sub.work[i] - self.budget
                if over > 0:
                    total += over
                    if first is None:
                        first = (*order[c], sorted(resident))
            else:
                resident.discard(i)
                live -= sub.size[op.node]
        return total, first

    def drops(self, found, point) -> list[np.ndarray]:
        """Moves that lower the memory at ``point`` (stage ``p``, node ``k``, resident nodes):
        a value resident there that comes after ``k`` in the node order (kept into stage
        ``p``) is no longer kept into stage ``p``, so that the stage recomputes it after ``k``
        if it needs it; a value kept into the next stage and not read later in stage ``p`` is
        not kept until the next stage that reads it (which recomputes it)."""
        R, S = found[3], found[4]
        p, k, resident = point
        users, preds = self.sub.users, self.sub.preds
        out = []
        for i in resident:
            if i == k or i in preds[k]:
                continue
            if i > k:
                T = S.copy()
                T[p, i] = False
                out.append(T)
                continue
            if p + 1 >= self.P or not S[p + 1, i] or any(R[p, j] for j in users[i] if j > k):
                continue
            r = next((q for q in range(p + 1, self.P) if any(R[q, j] for j in users[i] if j <= self.stages[q][1])),
                     self.P - 1)
            T = S.copy()
            T[p + 1:r + 1, i] = False
            out.append(T)
        return out

    def repair(self, found, deadline):
        """Greedy: while over the budget, of the drops at the first compute over the budget
        and the keeps of values recomputed in its stage (keeping one may spare a long
        recomputation's memory), apply the move that lowers the bytes over budget (summed
        over all computes) at the least cost. Returns a fitting ``found`` or None."""
        while found is not None and found[1] > self.budget:
            if deadline is not None and time.perf_counter() > deadline:
                return None
            overflow, point = self._overflow(found)
            trials = []
            for T in self.drops(found, point) + self.keeps(found, stage=point[0]):
                trial = self.evaluate(T)
                if trial is not None:
                    over = self._overflow(trial)[0]
                    if over < overflow:
                        trials.append((trial[0], over, trial))
            found = min(trials, key=lambda t: t[:2], default=(None, None, None))[2]
        return found

    def keeps(self, found, stage: int | None = None) -> list[np.ndarray]:
        """Moves that save a recomputation: for a recomputation of ``i`` in stage ``p`` (only
        ``stage``, if given), keep ``i`` from its previous computation through stage ``p``
        (costliest ``i`` first)."""
        R, S = found[3], found[4]
        moves = []
        for i in range(R.shape[1]):
            last = None
            for p in range(self.P):
                if R[p, i]:
                    if last is not None and stage in (None, p):
                        moves.append((-float(self.sub.cost[self.nodes[i]]), p, i, last))
                    last = p
        out = []
        for _, p, i, q in sorted(moves):
            T = S.copy()
            T[q + 1:p + 1, i] = True
            out.append(T)
        return out

    def improve(self, found, deadline):
        """First improvement over the keep moves, each followed by a repair when it no longer
        fits, until no move lowers the cost."""
        improved = True
        while improved:
            improved = False
            for T in self.keeps(found):
                if deadline is not None and time.perf_counter() > deadline:
                    return found
                trial = self.evaluate(T)
                if trial is not None and trial[0] < found[0] - 1e-12:
                    trial = self.repair(trial, deadline)
                    if trial is not None and trial[0] < found[0] - 1e-12:
                        found, improved = trial, True
                        break
        return found


def solve_lp(problem: RematProblem, budget: float, *,
             thresholds=(0.5, 0.25, 0.75, 0.1, 0.9, 0.01, 0.99), random_roundings: int = 16,
             seed: int = 0, budget_scales=(1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5), always_scales: int = 5,
             repair: bool = True, improve: bool = True, time_limit: float | None = 60.0
             ) -> CheckmateSolution:
    """Two-phase LP rounding: an approximate Checkmate schedule with peak <= ``budget``.

    1. Solve the LP relaxation under ``budget * scale`` for each of the first
       ``always_scales`` of ``budget_scales`` (a smaller LP budget often rounds to a
       cheaper fitting schedule), and for the following ones only while no scale has given
       a fitting schedule.
    2. Round each LP's ``S``: at each of ``thresholds`` (``S >= threshold``), and
       ``random_roundings`` times at random (``S[t,i] = 1`` with probability ``S[t,i]``,
       the paper's randomized rounding; a NumPy generator seeded with ``seed``). Each
       rounding gets the least ``R`` it allows (:func:`recompute_given_storage`) and is
       simulated.
    3. With ``repair``, a rounding over the budget is repaired greedily: while it does not
       fit, at the first compute over the budget, of the values resident there that are
       kept into the next stage without being read again in that stage, stop keeping
       (until the next stage that reads it, which recomputes it) the one that lowers the
       bytes over budget (summed over all computes) at the least cost.
    4. With ``improve``, each scale's cheapest fitting schedule is improved locally: take
       the first 'keep instead of recompute' move (for a recomputation of ``i`` in stage
       ``p``, keep ``i`` from its previous computation through stage ``p``; costliest
       ``i`` first) that, repaired as in 3 if it no longer fits, lowers the cost; until
       no move does. The cheapest schedule over the scales is returned.

    Parameters
    ----------
    problem : RematProblem
    budget : float
        Bytes.
    thresholds : sequence of float, optional
        The deterministic roundings.
    random_roundings : int, optional
        The randomized roundings of each LP.
    seed : int, optional
        Of the randomized roundings: the answer is deterministic for a given seed.
    budget_scales : sequence of float, optional
        The LP budgets, as fractions of ``budget``.
    always_scales : int, optional
        How many of ``budget_scales`` are always tried.
    repair, improve : bool, optional
        Steps 3 and 4.
    time_limit : float or None, optional
        Seconds; stops the search between steps, keeping the best schedule found so far.

    Returns
    -------
    CheckmateSolution
        ``method="lp-rounding"``, ``status="rounded"``; ``bound`` is the LP value at the full
        budget, a lower bound on the staged ILP optimum.

    Raises
    ------
    InfeasibleBudget
        If ``budget`` is below :func:`~passes.schedule.memory_lower_bound`, or even the LP
        relaxation has no solution at ``budget``.
    NoScheduleFound
        If no rounding fits.

    Complexity
    ----------
    One LP a scale (polynomial); ``O(P (n + m))`` a rounding, and a simulation; each
    repair or improvement move costs one rounding and a simulation.

    References
    ----------
    Jain et al., MLSys 2020 (arXiv 1910.02653): two-phase rounding (deterministic and
    randomized); the repair and the local search are fxremat's.
    """
    if not problem.needed:
        return _empty(budget, "lp-rounding")
    if budget < memory_lower_bound(problem):
        raise InfeasibleBudget(
            f"budget {budget:g} bytes is below the working-set bound {memory_lower_bound(problem):g}",
            budget=budget, lower_bound=memory_lower_bound(problem))
    start = time.perf_counter()
    deadline = None if time_limit is None else start + time_limit
    rng = np.random.default_rng(seed)
    per_scale = []  # the cheapest fitting rounding of each scale: (cost, peak, schedule, R, S)
    bound = None
    tried = 0
    rounder = None
    for n_scale, scale in enumerate(budget_scales):
        if n_scale >= always_scales and per_scale:
            break
        remaining = None if deadline is None else deadline - time.perf_counter()
        if remaining is not None and remaining <= 0:
            break
        model = _Model(problem, budget * scale)
        res, _ = model.run(integral=False, time_limit=remaining)
        if res.status == 2:
            if bound is None:
                lower = memory_lower_bound(problem)
                raise InfeasibleBudget(
                    f"budget {budget:g} bytes is infeasible: even the LP relaxation has no staged "
                    f"schedule (every schedule needs at least {lower:g} bytes; min_budget() finds "
                    f"the smallest feasible budget)", budget=budget, lower_bound=lower)
            break  # smaller budgets are infeasible too
        if res.x is None:
            break
        if bound is None:
            bound = float(res.fun)
        rounder = rounder or _Rounder(problem, model.sub, budget)
        _, S_frac = model.matrices(res.x)
        S_frac = np.clip(S_frac, 0.0, 1.0)
        roundings = [S_frac >= threshold for threshold in thresholds]
        roundings += [rng.random(S_frac.shape) < S_frac for _ in range(random_roundings)]
        seen = set()
        best = None
        for S in roundings:
            S[model.P] = False
            S[model.P, model.sub.output_ids] = True
            key = S.tobytes()
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            found = rounder.evaluate(S)
            if found is not None and found[1] > budget and repair:
                found = rounder.repair(found, deadline)
            if found is not None and found[1] <= budget and (best is None or found[0] < best[0]):
                best = found
        if best is not None:
            per_scale.append(best)
    if improve:
        done = set()
        for i, found in enumerate(per_scale):
            if found[4].tobytes() not in done:
                done.add(found[4].tobytes())
                per_scale[i] = rounder.improve(found, deadline)
    stopped = deadline is not None and time.perf_counter() > deadline
    seconds = time.perf_counter() - start
    if not per_scale:
        raise NoScheduleFound(f"two-phase rounding found no schedule under {budget:g} bytes "
                              f"({tried} roundings tried{', time limit hit' if stopped else ''}); "
                              f"try solve() (the ILP) or a larger budget")
    cost, peak, schedule, R, S = min(per_scale, key=lambda f: f[0])
    return CheckmateSolution(
        schedule=schedule, cost=cost, peak_bytes=peak, budget=budget, method="lp-rounding",
        status="rounded", stopped_early=stopped, objective=cost, bound=bound,
        gap=(cost - bound) / cost if cost else 0.0, solve_seconds=seconds, nodes=list(rounder.sub.nodes),
        R=R, S=S)
