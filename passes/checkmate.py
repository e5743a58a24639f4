"""Checkmate: optimal rematerialization under a memory budget by integer programming.

Problem
-------
Given a :class:`~passes.remat_problem.RematProblem` (a DAG in topological order,
compute costs, output bytes, outputs to hold at the end) and a budget in bytes,
find a schedule of least total cost whose peak (as :func:`passes.schedule.simulate`
counts it) is at most the budget.

Method
------
Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization", MLSys 2020 (arXiv 1910.02653). The schedule is cut into
*frontier-advancing stages* (stage ``t`` computes node ``t`` for the first time,
possibly after recomputing earlier nodes, each at most once, in node order) and the
cheapest staged schedule is a mixed-integer program: binary ``R[t,i]`` (``i``
computed in stage ``t``) and ``S[t,i]`` (``i`` resident when stage ``t`` starts), the
frees and the memory as linear constraints. :mod:`passes.checkmate_milp` states the
model, its cuts and two additions (workspace, tied nodes); :mod:`passes.chain_dag`
maps Rotor's chains to such problems, and the tests check the ILP against Rotor's
DPs there.

The ILP is exact *over staged schedules for the given node order*; a schedule
that first-computes nodes in another order, or computes a node twice between
two first computations, may do better (:func:`brute_force` searches all
schedules). Solved with HiGHS (``scipy.optimize.milp``) under a time limit: the
answer says whether HiGHS stopped early, with the incumbent and its dual bound.
For graphs too large for the ILP, :func:`solve_lp` is the paper's two-phase LP
rounding, with a greedy repair and a local search.

This module is the entry point (:func:`solve`, :func:`min_budget`) and re-exports the
rest, one part a module:

* :mod:`passes.checkmate_milp`: the MILP, the result and error types;
* :mod:`passes.checkmate_rounding`: two-phase LP rounding (:func:`solve_lp`);
* :mod:`passes.checkmate_brute_force`: exhaustive search, the tests' references.

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

from .checkmate_brute_force import brute_force, brute_force_staged
from .checkmate_milp import CheckmateSolution, InfeasibleBudget, NoScheduleFound, _empty, _Model, _schedule, stages_of
from .checkmate_rounding import recompute_given_storage, solve_lp
from .schedule import RematProblem, memory_lower_bound

__all__ = [
    "CheckmateSolution", "InfeasibleBudget", "NoScheduleFound", "brute_force", "brute_force_staged", "min_budget",
    "recompute_given_storage", "solve", "solve_lp", "stages_of",
]


def _infeasible(problem: RematProblem, budget: float, time_limit: float | None, why: str,
                search: bool = True) -> InfeasibleBudget:
    """The InfeasibleBudget to raise, with the smallest feasible budget when ``search``.

    ``search`` solves :func:`min_budget` (one more ILP, under ``time_limit``).
    """
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


def solve(problem: RematProblem, budget: float, *, time_limit: float | None = 60.0,
          mip_rel_gap: float = 0.0, report_min_budget: bool = True,
          node_limit: int | None = None) -> CheckmateSolution:
    """The Checkmate ILP: the cheapest staged schedule with peak <= ``budget`` bytes.

    Returns the incumbent even when HiGHS stops at ``time_limit`` or after ``node_limit``
    branch-and-bound nodes (``stopped_early``, ``bound``, ``gap`` say how far from proven
    it is). A node limit stops at the same incumbent on any machine, a time limit does
    not: reproducible plans need the node limit to be the one that binds. HiGHS accepts
    memory rows up to its feasibility tolerance: a schedule whose exact peak overshoots
    is solved again with the overshoot taken off the budget (three tries).

    Parameters
    ----------
    problem : RematProblem
    budget : float
        Bytes.
    time_limit : float or None, optional
        Seconds, for each ILP solved.
    mip_rel_gap : float, optional
        HiGHS's relative gap to stop at (0: prove optimality).
    report_min_budget : bool, optional
        On an infeasible budget, solve a second ILP (:func:`min_budget`) so that the
        error says the smallest feasible budget.
    node_limit : int or None, optional
        Branch-and-bound nodes of HiGHS.

    Returns
    -------
    CheckmateSolution
        ``method="ilp"``; ``status`` ``"optimal"`` or ``"time_limit"``.

    Raises
    ------
    InfeasibleBudget
        When no staged schedule fits, with the smallest budget that does (unless
        ``report_min_budget`` is false).
    NoScheduleFound
        When HiGHS stopped before finding any schedule, or its schedules overshoot the
        budget three times.

    Complexity
    ----------
    NP-hard in general (HiGHS branch and bound) on ``O(n^2)`` binary variables and
    ``O(n (n + m) d)`` constraints.

    References
    ----------
    Jain et al., MLSys 2020 (arXiv 1910.02653).
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


def min_budget(problem: RematProblem, *, time_limit: float | None = 60.0, node_limit: int | None = None
               ) -> tuple[float, float | None, bool]:
    """The smallest peak of a staged schedule (the same ILP, minimizing the peak).

    Parameters
    ----------
    problem : RematProblem
    time_limit : float or None, optional
        Seconds.
    node_limit : int or None, optional
        Branch-and-bound nodes of HiGHS.

    Returns
    -------
    lower : float
        Bytes no staged schedule goes below (HiGHS's dual bound, at least
        :func:`~passes.schedule.memory_lower_bound`).
    upper : float or None
        The peak of a schedule found (simulated), or None.
    exact : bool
        ``upper`` is proven optimal (by HiGHS, or because it meets the working-set bound).

    Raises
    ------
    Nothing

    Complexity
    ----------
    As :func:`solve`: one ILP.
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
