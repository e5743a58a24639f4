"""Checkmate: optimal rematerialization under a memory budget by integer programming.

Problem
-------
Given a :class:`~passes.schedule.RematProblem` (a DAG in topological order,
compute costs, output bytes, outputs to hold at the end) and a budget in bytes,
find a schedule of least total cost whose peak (as :func:`passes.schedule.simulate`
counts it) is at most the budget.

Method
------
Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization", MLSys 2020 (arXiv 1910.02653). The schedule is
cut into *frontier-advancing stages*: stage ``t`` computes node ``t`` for the
first time, possibly after recomputing earlier nodes, each at most once, in
node order. Binary variables: ``R[t,i]`` (node ``i`` computed in stage ``t``),
``S[t,i]`` (``i`` resident when stage ``t`` starts; ``S[n,.]`` is the state at
the end, where the outputs must be resident); ``FREE[t,i,k]`` (``i`` freed just
after computing ``k`` in stage ``t``, with ``i`` an input of ``k`` or ``k``
itself); continuous ``U[t,k]`` (bytes resident while ``k`` is computed in stage
``t``). Minimize ``sum C_i R[t,i]`` subject to

* ``R[t,t] = 1``; ``R`` lower triangular, ``S`` strictly lower triangular;
* ``R[t,j] <= R[t,i] + S[t,i]`` for every edge ``(i, j)`` (inputs available);
* ``S[t+1,i] <= R[t,i] + S[t,i]`` (only computed or kept values are kept);
* ``FREE[t,i,k] = R[t,k] (1 - S[t+1,i]) prod_{j users of i, k<j<=t} (1 - R[t,j])``,
  linearized with one inequality per factor and one for the sum (exact for 0/1 ``R, S``);
* ``U[t,0] = M_0 R[t,0] + sum_i M_i S[t,i]``,
  ``U[t,k] = U[t,k-1] - sum_{i in in(k-1) + {k-1}} M_i FREE[t,i,k-1] + M_k R[t,k]``,
  ``U[t,k] <= budget``.

Added cuts, all satisfied by some optimal solution (drop what is kept but never
read, and recomputations never read: cost and memory only go down):
``R[t,i] + S[t,i] <= 1`` (never recompute a resident value), and for ``i < t``
``S[t,i] <= S[t+1,i] + sum_{j users of i, j<=t} R[t,j]`` and the same bound on
``R[t,i]``. They make the LP relaxation much tighter. (Fixing ``S[t,i] = 0`` when
every user of ``i`` precedes ``t`` would *not* be safe: a user recomputed in
stage ``t`` may read a kept ``i``.)

Two additions to the paper's model (fields of :class:`~passes.schedule.RematProblem`):
a node's ``workspace`` ``W_k`` adds ``U[t,k] + W_k R[t,k] <= budget``; a node ``x``
*tied* to ``f`` (a second output of ``f``'s operation, such as the state a forward
records for its backward) has no stage of its own -- it may be computed in ``f``'s
first stage, right after ``f`` -- is computed only together with ``f``
(``R[t,x] <= R[t,f]``, no ``S`` term) and pins its inputs while resident
(``S[t,x] <= S[t,q]`` for every input ``q`` of ``x``). Stages are then numbered by
their first-computed ("head") node and ``R``, ``S`` have one row per stage.
:mod:`passes.chain_dag` maps Rotor's chains to such problems; the tests check the
ILP against Rotor's DPs there.

The ILP is exact *over staged schedules for the given node order*; a schedule
that first-computes nodes in another order, or computes a node twice between
two first computations, may do better (:func:`brute_force` searches all
schedules). Solved with HiGHS (``scipy.optimize.milp``) under a time limit: the
answer says whether HiGHS stopped early, with the incumbent and its dual bound.

For graphs too large for the ILP, :func:`solve_lp` is the paper's *two-phase
rounding*: solve the LP relaxation, round ``S`` (at several thresholds, and at random
with probability ``S`` -- the paper's deterministic and randomized roundings, seeded),
then take the least ``R`` that ``S`` allows (a node is recomputed in stage ``t``
exactly when a later computation of the stage reads it or the next stage keeps it, and
it is not resident) -- one backward sweep per stage. Two additions make it reach the
ILP's cost far more often (``bench/checkmate_zoo.py``): a rounding over the budget is
repaired greedily (stop keeping, until it is next read, a value resident where the
memory overflows), and the cheapest fitting rounding is improved by local search
('keep instead of recompute' moves, each repaired if it overflows, while the cost
drops). The LP is solved at the budget and at a few smaller budgets, whose roundings
are candidates too.

Complexity: ``O(n^2)`` binary variables and ``O(n (n + m) d)`` constraints for
``n`` nodes, ``m`` edges, out-degree ``d``; the ILP is NP-hard in general
(HiGHS branch and bound), the LP is polynomial, one rounding is ``O(n (n + m))``
and every repair or improvement move costs one rounding plus a simulation (the
local search stops when no move helps, or at the time limit).

Every returned schedule is checked with :func:`passes.schedule.simulate`.

Example
-------
A chain ``a -> b -> c`` and a backward ``c -> gb <- b``, ``gb -> ga <- a``:
holding ``a`` and ``b`` throughout needs 4 units; with 3, ``a`` is recomputed.

>>> from fxremat.passes.schedule import RematProblem
>>> p = RematProblem(nodes=["a", "b", "c", "gb", "ga"],
...                  edges=[("a", "b"), ("b", "c"), ("c", "gb"), ("b", "gb"), ("gb", "ga"), ("a", "ga")],
...                  cost={"a": 1, "b": 10, "c": 1, "gb": 1, "ga": 1},
...                  size={"a": 1, "b": 1, "c": 1, "gb": 1, "ga": 1}, outputs={"ga"})
>>> sol = solve(p, budget=3)
>>> sol.status, sol.cost, sol.peak_bytes
('optimal', 15, 3)
>>> [op.node for op in sol.schedule if op.kind == "compute"]
['a', 'b', 'c', 'gb', 'a', 'ga']
>>> solve_lp(p, budget=3).cost  # two-phase rounding finds the same schedule here
15
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .schedule import Op, RematProblem, ScheduleError, from_computes, memory_lower_bound, simulate


class NoScheduleFound(RuntimeError):
    """No schedule under the budget was found (not proven impossible: see InfeasibleBudget)."""


class InfeasibleBudget(NoScheduleFound):
    """No staged schedule fits the budget (proven by the solver).

    budget: the budget asked for.
    lower_bound: bytes every schedule needs (largest working set, all outputs together).
    min_feasible: the smallest budget with a staged schedule for this node order, if found;
        ``min_feasible_range`` is ``(lower, upper)`` when the search stopped early.
    """

    def __init__(self, message, *, budget, lower_bound, min_feasible=None, min_feasible_range=None):
        super().__init__(message)
        self.budget = budget
        self.lower_bound = lower_bound
        self.min_feasible = min_feasible
        self.min_feasible_range = min_feasible_range


@dataclasses.dataclass
class CheckmateSolution:
    schedule: list[Op]
    cost: float          # total cost of ``schedule`` (simulate)
    peak_bytes: int      # peak of ``schedule`` (simulate), <= budget
    budget: float
    method: str          # "ilp" or "lp-rounding"
    status: str          # "optimal", "time_limit" (incumbent, not proven optimal), "rounded"
    stopped_early: bool  # the solver hit its time limit
    objective: float     # HiGHS's objective (equals ``cost`` up to its tolerances)
    bound: float         # lower bound on the staged optimum (MIP dual bound; LP value)
    gap: float           # (objective - bound) / objective; 0 when proven optimal
    solve_seconds: float
    nodes: list[str]     # the nodes some output needs, in order (stage heads and tied nodes)
    R: np.ndarray        # R[t, i]: nodes[i] computed in stage t, shape (stages, n)
    S: np.ndarray        # S[t, i]: nodes[i] resident when stage t starts, shape (stages + 1, n)


# ----------------------------------------------------------------------------- the model


def stages_of(sub: RematProblem) -> list[tuple[int, int]]:
    """The stages of ``sub`` as ``(head, top)`` node indices: stage ``p`` computes ``head`` for
    the first time and may compute any node ``<= top``; ``top`` is ``head`` or the node tied
    to it (a tied node shares its owner's stage)."""
    tied_to = sub.tied_to
    out = []
    for i in range(len(sub.nodes)):
        if tied_to[i] is None:
            top = i + 1 if i + 1 < len(sub.nodes) and tied_to[i + 1] == i else i
            out.append((i, top))
    return out


class _Model:
    """The MILP in scipy.optimize.milp's form: variables, bounds, sparse rows."""

    def __init__(self, problem: RematProblem, budget: float | None):
        sub = problem.restricted()
        self.sub = sub
        self.n = n = len(sub.nodes)
        self.stages = stages = stages_of(sub)
        P = self.P = len(stages)
        preds, users, tied_to = sub.preds, sub.users, sub.tied_to
        cost = np.array([float(sub.cost[v]) for v in sub.nodes])
        size = np.array([float(sub.size[v]) for v in sub.nodes])
        work = np.array([float(w) for w in sub.work])
        self.scale = max(float((size + work).max(initial=0.0)), 1.0)
        mem = size / self.scale
        wmem = work / self.scale
        is_output = np.zeros(n, dtype=bool)
        is_output[sub.output_ids] = True

        c, lb, ub, integ = [], [], [], []

        def var(cost_=0.0, lo=0.0, hi=1.0, integer=True):
            c.append(cost_)
            lb.append(lo)
            ub.append(hi)
            integ.append(1 if integer else 0)
            return len(c) - 1

        self.r = {}
        for p, (head, top) in enumerate(stages):
            for i in range(top + 1):
                self.r[p, i] = var(cost[i], 1.0 if i == head else 0.0, 1.0)
        self.s = {}  # S[p, i]: i resident when stage p starts (i before its head); S[P, .]: the end
        for p in range(1, P + 1):
            for i in range(stages[p - 1][1] + 1):
                if p == P:
                    fixed = 1.0 if is_output[i] else 0.0
                    self.s[p, i] = var(0.0, fixed, fixed)
                else:
                    self.s[p, i] = var(0.0, 0.0, 1.0)
        self.free = {}
        for p, (_, top) in enumerate(stages):
            for k in range(top + 1):
                for i in preds[k] + [k]:
                    self.free[p, i, k] = var(0.0, 0.0, 1.0, integer=False)
        self.budget_var = None
        if budget is None:  # minimize the peak instead
            self.budget_var = var(1.0, 0.0, np.inf, integer=False)
            c[:self.budget_var] = [0.0] * self.budget_var
        u_hi = np.inf if budget is None else budget / self.scale
        self.u = {}
        for p, (_, top) in enumerate(stages):
            for k in range(top + 1):
                self.u[p, k] = var(0.0, 0.0, u_hi, integer=False)

        rows, cols, vals, lo_, hi_ = [], [], [], [], []

        def row(terms, lo=-np.inf, hi=np.inf):
            r = len(lo_)
            for col, val in terms:
                rows.append(r)
                cols.append(col)
                vals.append(val)
            lo_.append(lo)
            hi_.append(hi)

        R, S, F, U = self.r, self.s, self.free, self.u
        for p, (head, top) in enumerate(stages):
            # Inputs available: R[p,j] <= R[p,i] + S[p,i] (S only for values from earlier
            # stages); a tied node only with its owner: R[p,x] <= R[p,f].
            for j in range(top + 1):
                for i in preds[j]:
                    terms = [(R[p, j], 1.0), (R[p, i], -1.0)]
                    if i < head and tied_to[j] != i:
                        terms.append((S[p, i], -1.0))
                    row(terms, hi=0.0)
            for i in range(top + 1):
                readers = [(R[p, j], -1.0) for j in users[i] if j <= top]
                if i < head:
                    # Kept only if computed or kept; no recompute of a resident value.
                    row([(S[p + 1, i], 1.0), (R[p, i], -1.0), (S[p, i], -1.0)], hi=0.0)
                    row([(R[p, i], 1.0), (S[p, i], 1.0)], hi=1.0)
                    # Cut: what is kept into stage p is read in the stage or kept on.
                    row([(S[p, i], 1.0), (S[p + 1, i], -1.0)] + readers, hi=0.0)
                else:
                    if i != head:  # a tied node computed in its owner's first stage
                        row([(S[p + 1, i], 1.0), (R[p, i], -1.0)], hi=0.0)
                if i != head:
                    # Cut: what is recomputed is read in the stage or kept on.
                    row([(R[p, i], 1.0), (S[p + 1, i], -1.0)] + readers, hi=0.0)
            # FREE[p,i,k] = R[p,k] (1 - S[p+1,i]) prod (1 - R[p,j]), j users of i in (k, top].
            for k in range(top + 1):
                for i in preds[k] + [k]:
                    f = F[p, i, k]
                    later = [j for j in users[i] if k < j <= top]
                    row([(f, 1.0), (R[p, k], -1.0)], hi=0.0)
                    row([(f, 1.0), (S[p + 1, i], 1.0)], hi=1.0)
                    for j in later:
                        row([(f, 1.0), (R[p, j], 1.0)], hi=1.0)
                    row([(R[p, k], 1.0), (S[p + 1, i], -1.0), (f, -1.0)] + [(R[p, j], -1.0) for j in later],
                        hi=0.0)
            # Memory: U[p,k] is resident bytes after computing k (when computed).
            row([(U[p, 0], 1.0), (R[p, 0], -mem[0])] + [(S[p, i], -mem[i]) for i in range(head)],
                lo=0.0, hi=0.0)
            for k in range(1, top + 1):
                terms = [(U[p, k], 1.0), (U[p, k - 1], -1.0), (R[p, k], -mem[k])]
                terms += [(F[p, i, k - 1], mem[i]) for i in preds[k - 1] + [k - 1]]
                row(terms, lo=0.0, hi=0.0)
            for k in range(top + 1):
                if work[k] > 0:  # the workspace while k is computed
                    terms = [(U[p, k], 1.0), (R[p, k], wmem[k])]
                    if self.budget_var is None:
                        row(terms, hi=budget / self.scale)
                    else:
                        row(terms + [(self.budget_var, -1.0)], hi=0.0)
                elif self.budget_var is not None:
                    row([(U[p, k], 1.0), (self.budget_var, -1.0)], hi=0.0)
        # Tied nodes pin their inputs: S[p,x] <= S[p,q] for every input q of x.
        for p in range(1, P + 1):
            for x in range(stages[p - 1][1] + 1):
                if tied_to[x] is not None:
                    for q in preds[x]:
                        row([(S[p, x], 1.0), (S[p, q], -1.0)], hi=0.0)

        self.c = np.array(c)
        self.bounds = Bounds(np.array(lb), np.array(ub))
        self.integrality = np.array(integ)
        nvar = len(c)
        self.A = coo_matrix((vals, (rows, cols)), shape=(len(lo_), nvar)).tocsr()
        self.lo = np.array(lo_)
        self.hi = np.array(hi_)

    def run(self, *, integral: bool, time_limit: float | None, mip_rel_gap: float = 0.0,
            node_limit: int | None = None):
        options = {"disp": False, "presolve": True}
        if time_limit is not None:
            options["time_limit"] = float(time_limit)
        if node_limit is not None and integral:
            options["node_limit"] = int(node_limit)
        if integral:
            options["mip_rel_gap"] = float(mip_rel_gap)
        start = time.perf_counter()
        res = milp(self.c, integrality=self.integrality if integral else None, bounds=self.bounds,
                   constraints=LinearConstraint(self.A, self.lo, self.hi), options=options)
        return res, time.perf_counter() - start

    def matrices(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """R (stages, n) and S (stages + 1, n) as arrays of floats (0 outside the model)."""
        R = np.zeros((self.P, self.n))
        S = np.zeros((self.P + 1, self.n))
        for (p, i), col in self.r.items():
            R[p, i] = x[col]
        for (p, i), col in self.s.items():
            S[p, i] = x[col]
        return R, S


def _computes(nodes: list[str], R: np.ndarray) -> list[str]:
    return [nodes[i] for p in range(R.shape[0]) for i in range(R.shape[1]) if R[p, i]]


def _schedule(problem: RematProblem, nodes: list[str], R: np.ndarray) -> tuple[list[Op], float, int]:
    schedule = from_computes(problem, _computes(nodes, R))
    cost, peak = simulate(problem, schedule)
    return schedule, cost, peak


def recompute_given_storage(sub: RematProblem, S: np.ndarray) -> np.ndarray:
    """Phase two of two-phase rounding: the least ``R`` that a 0/1 ``S`` allows.

    ``sub`` must be restricted (every node needed); ``S`` has one row per stage of
    :func:`stages_of` plus the final state. In stage ``p``, ``R[p,i] = 1`` when ``i`` is the
    stage's head, or ``i`` is not resident at the start of the stage and either the next
    stage keeps it or a node computed later in the stage reads it. Users come after their
    inputs, so one backward sweep over each stage settles it. (With tied nodes the result
    may be invalid -- a tied node needed while its owner is resident -- which
    :func:`passes.schedule.simulate` reports.)
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


# ----------------------------------------------------------------------------- solvers


def _infeasible(problem: RematProblem, budget: float, time_limit: float | None, why: str,
                search: bool = True) -> InfeasibleBudget:
    lower = memory_lower_bound(problem)
    if not search:
        return InfeasibleBudget(f"{why} (every schedule needs at least {lower:g} bytes)",
                                budget=budget, lower_bound=lower)
    lo, hi, exact = min_budget(problem, time_limit=time_limit)
    if exact:
        detail = f"the smallest budget with a staged schedule in this node order is {hi:g} bytes"
        return InfeasibleBudget(f"{why}: {detail} (every schedule needs at least {lower:g} bytes)",
                                budget=budget, lower_bound=lower, min_feasible=hi, min_feasible_range=(hi, hi))
    if hi is None:
        detail = "the smallest feasible budget could not be determined in the time limit"
    else:
        detail = f"the smallest budget with a staged schedule is between {lo:g} and {hi:g} bytes"
    return InfeasibleBudget(f"{why}: {detail} (every schedule needs at least {lower:g} bytes)",
                            budget=budget, lower_bound=lower, min_feasible_range=(lo, hi))


def _empty(budget: float, method: str) -> CheckmateSolution:
    z = np.zeros((0, 0))
    return CheckmateSolution([], 0, 0, budget, method, "optimal", False, 0.0, 0.0, 0.0, 0.0, [], z,
                             np.zeros((1, 0)))


def solve(problem: RematProblem, budget: float, *, time_limit: float | None = 60.0,
          mip_rel_gap: float = 0.0, report_min_budget: bool = True,
          node_limit: int | None = None) -> CheckmateSolution:
    """The Checkmate ILP: the cheapest staged schedule with peak <= ``budget`` bytes.

    Returns the incumbent even when HiGHS stops at ``time_limit`` or after ``node_limit``
    branch-and-bound nodes (``stopped_early``, ``bound``, ``gap`` say how far from proven
    it is). A node limit stops at the same incumbent on any machine, a time limit does
    not: reproducible plans need the node limit to be the one that binds. Raises InfeasibleBudget when no
    staged schedule fits -- with the smallest budget that does, from :func:`min_budget`
    (a second ILP, under the same time limit), unless ``report_min_budget`` is false --
    and NoScheduleFound when the time ran out before any schedule was found.
    """
    if not problem.needed:
        return _empty(budget, "ilp")
    if budget < memory_lower_bound(problem):
        raise _infeasible(problem, budget, time_limit, f"budget {budget:g} bytes is below the working-set bound",
                          report_min_budget)
    # HiGHS accepts memory rows up to its feasibility tolerance (on sizes scaled by the
    # largest): if the exact simulation overshoots, solve again with the overshoot removed.
    model_budget, seconds = budget, 0.0
    for _ in range(3):
        model = _Model(problem, model_budget)
        res, took = model.run(integral=True, time_limit=time_limit, mip_rel_gap=mip_rel_gap, node_limit=node_limit)
        seconds += took
        if res.status == 2:
            raise _infeasible(problem, budget, time_limit, f"budget {budget:g} bytes is infeasible for staged "
                              "schedules", report_min_budget)
        if res.x is None:
            raise NoScheduleFound(f"HiGHS found no schedule within {time_limit} s ({res.message}); "
                                  f"the budget may be infeasible: try solve_lp or a longer time limit")
        R, S = model.matrices(res.x)
        R, S = R > 0.5, S > 0.5
        nodes = list(model.sub.nodes)
        schedule, cost, peak = _schedule(problem, nodes, R)
        if peak <= budget:
            break
        model_budget -= peak - budget
    else:
        raise NoScheduleFound(f"the ILP's schedules overshoot {budget:g} bytes by HiGHS's tolerance")
    objective = float(res.fun)
    stopped = res.status != 0
    bound = float(res.mip_dual_bound) if res.mip_dual_bound is not None else objective
    bound = min(bound, objective)
    gap = 0.0 if not stopped else (objective - bound) / objective if objective else 0.0
    return CheckmateSolution(
        schedule=schedule, cost=cost, peak_bytes=peak, budget=budget, method="ilp",
        status="time_limit" if stopped else "optimal", stopped_early=stopped, objective=objective,
        bound=bound, gap=gap, solve_seconds=seconds, nodes=nodes, R=R, S=S)


class _Rounder:
    """Phase two and the local moves of :func:`solve_lp` on one problem (``S`` is 0/1)."""

    def __init__(self, problem: RematProblem, sub: RematProblem, budget: float):
        self.problem, self.sub, self.budget = problem, sub, budget
        self.nodes = list(sub.nodes)
        self.stages = stages_of(sub)
        self.P = len(self.stages)
        self.evaluations = 0

    def evaluate(self, S: np.ndarray):
        """``(cost, peak, schedule, R, S)`` of the least ``R`` for ``S``, or None if invalid."""
        self.evaluations += 1
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

    Deterministic for a given ``seed``. ``bound`` is the LP value at the full budget, a
    lower bound on the staged ILP optimum. Raises InfeasibleBudget when even the LP has
    no solution, NoScheduleFound when no rounding fits (``time_limit`` stops the search
    between steps, keeping the best schedule found so far).
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


def min_budget(problem: RematProblem, *, time_limit: float | None = 60.0, node_limit: int | None = None
               ) -> tuple[float, float | None, bool]:
    """The smallest peak of a staged schedule (the same ILP, minimizing the peak).

    Returns ``(lower, upper, exact)``: bytes, with ``upper`` the peak of a schedule found
    (simulated) or None, and ``exact`` when it is proven optimal (by HiGHS, or because it
    meets :func:`passes.schedule.memory_lower_bound`).
    """
    if not problem.needed:
        return 0.0, 0.0, True
    model = _Model(problem, None)
    res, _ = model.run(integral=True, time_limit=time_limit, node_limit=node_limit)
    lower = float(memory_lower_bound(problem))
    if res.x is None:
        return lower, None, False
    R, _ = model.matrices(res.x)
    _, _, peak = _schedule(problem, list(model.sub.nodes), R > 0.5)
    if res.status == 0 or peak <= lower:  # proven, or at the working-set bound
        return float(peak), float(peak), True
    if res.mip_dual_bound is not None:
        lower = max(lower, float(res.mip_dual_bound) * model.scale)
    return min(lower, float(peak)), float(peak), False


# ----------------------------------------------------------------------------- brute force (tests)


def brute_force(problem: RematProblem, budget: float) -> tuple[float, list[Op]]:
    """The cheapest schedule of all (not only staged ones) with peak <= budget: Dijkstra over
    resident sets (and, with tied nodes, the latest compute) -- tests only: ``2^n`` states.
    Raises InfeasibleBudget if there is none."""
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
    """The cheapest staged schedule with peak <= budget, by enumerating every 0/1 ``S``
    (with the least ``R`` for each): what the ILP optimizes over. Tests only: exponential
    in the number of ``S`` variables (``n(n-1)/2`` without tied nodes)."""
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
