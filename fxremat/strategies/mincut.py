"""The min-cut plan (Yu & He 2023): the saved set of least memory traffic, every other
forward value recomputed in the backward where it fuses. Every strategy starts from it;
``solver="mincut"`` keeps it, and over the budget says so."""

from __future__ import annotations

import torch.fx as fx

from ..candidate import Candidate, Context, extract_placed, make_candidate
from ..joint import mincut_problem
from ..passes import mincut
from ..plans import over_budget


def candidate(ctx: Context, saved: list[fx.Node], cut_cost: float, light: bool = True) -> Candidate:
    """The candidate that saves ``saved``, recomputations placed before their first use;
    on light graphs (``lite``) until ``Candidate.realize`` (over the budget, it is only
    scored)."""
    fwd, bwd, _ = extract_placed(ctx, saved, light=light)
    found = make_candidate(ctx, "mincut", fwd, bwd, saved, cut_cost)
    if light:
        found.rebuild = lambda: candidate(ctx, saved, cut_cost, light=False)
    return found


def traffic_optimal(ctx: Context) -> Candidate:
    """The min-cut plan of ``ctx.problem``: the saved set of least memory traffic."""
    solution = mincut.solve(ctx.problem)
    return candidate(ctx, ctx.saved_nodes(solution.saved), solution.cost)


def lean(ctx: Context) -> tuple[list[fx.Node], dict[str, str]]:
    """The lean saved set (fewest bytes, ``joint.mincut_problem(lean=True)``), in graph
    order, and its bans."""
    problem, banned = mincut_problem(ctx.joint, ctx.classes, lean=True)
    solution = mincut.solve(problem)
    return [ctx.by_name[name] for name in problem.nodes if name in solution.saved], banned


def plan(ctx: Context, mincut_plan: Candidate, budget: int, over: bool, solver) -> Candidate:
    """``solver="mincut"``: the min-cut plan, or a BudgetError when it is over the budget."""
    if over:
        raise over_budget(mincut_plan.plan, ctx.options, mincut_plan.peak, "min-cut (solver='mincut')")
    return mincut_plan
