"""What other budgets would buy: the plans of one graph at a sweep of budgets, each with its
predicted peak and estimated step time (``Context.estimate``, by which ``auto`` compares
solvers' plans), and PyTorch's default partition of the same graph measured with
the same models. Made for reports (``fxremat.explain``) when ``debug_dir`` is set: each
point is a whole search of the solver on light graphs (``lite``), none is compiled."""

from __future__ import annotations

import warnings
from typing import Any

import torch.fx as fx

from . import _compat
from .candidate import Candidate, Context, make_candidate
from .plans import BudgetError
from .strategies import SOLVERS

# Budgets swept, as fractions of the min-cut plan's predicted peak (and the least budget
# the solver reaches, found from the first one it cannot meet); fewer on a graph of more
# than LARGE_GRAPH nodes, where each search takes seconds (a 32-layer transformer, 8,000
# steps, op by op, budget 0.5: planned in 9 s without a sweep, 86 s with eight fractions,
# 57 s with four; bench/results/cpu/explain).
FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
FRACTIONS_LARGE = (0.8, 0.6, 0.4, 0.2)
LARGE_GRAPH = 3000


def point(label: str, candidate: Candidate, ctx: Context, budget: int | None) -> dict[str, Any]:
    """One point of the curve: ``label``, the budget asked, and the plan's solver,
    predicted peak, estimated step time and saved-activation bytes."""
    return {"label": label, "budget_bytes": budget, "solver": candidate.plan.solver,
            "predicted_peak_bytes": candidate.peak, "estimated_step_s": ctx.estimate(candidate),
            "saved_activation_bytes": candidate.plan.saved_activation_bytes}


def sweep(ctx: Context, mincut_plan: Candidate, chosen: Candidate, joint_inputs: Any = None) -> dict[str, Any]:
    """The trade-off curve of the graph of ``ctx``: ``{"solver", "points", "pytorch_default",
    "notes"}``. ``points`` has the min-cut plan, the plan chosen (``"this plan"``), the
    solver's plans at ``FRACTIONS`` of the min-cut plan's peak down to the least budget it
    reaches (``"least-memory plan"``) and, when the chosen plan was planned within a budget,
    the solver's plan at that budget found again (which equals the chosen plan: a check).
    ``pytorch_default``: PyTorch's ``min_cut_rematerialization_partition`` of the same joint
    graph, predicted and estimated by fxremat's models (None, with a note, when it cannot be
    run on it). A solver that does not recompute further (``"mincut"``) is swept as ``"auto"``."""
    name = ctx.options.solver if ctx.options.solver != "mincut" else "auto"
    solver = SOLVERS[name]
    points = [point("min-cut plan", mincut_plan, ctx, None), point("this plan", chosen, ctx, chosen.plan.budget_bytes)]
    notes: list[str] = []
    fractions = FRACTIONS_LARGE if len(ctx.by_name) > LARGE_GRAPH else FRACTIONS
    budgets = [int(f * mincut_plan.peak) for f in fractions]
    if chosen.plan.budget_bytes is not None and chosen.plan.budget_bytes < mincut_plan.peak:
        budgets.append(chosen.plan.budget_bytes)
    least: int | None = None
    for budget in sorted(set(budgets), reverse=True):
        if least is not None and budget < least:
            continue
        found = _plan(ctx, solver, mincut_plan, budget)
        if isinstance(found, BudgetError):
            least = found.least_bytes if least is None or found.least_bytes is None else min(least, found.least_bytes)
            if least is None:
                notes.append(f"{name} found no plan within {budget} bytes and named no least budget")
                break
            continue
        label = "at this plan's budget" if budget == chosen.plan.budget_bytes else f"budget {budget}"
        points.append(point(label, found, ctx, budget))
    if least is not None:
        found = _plan(ctx, solver, mincut_plan, least)
        if isinstance(found, BudgetError):
            notes.append(f"{name}'s least budget ({least} bytes) gave no plan when asked again: {found}")
        else:
            points.append(point("least-memory plan", found, ctx, least))
    default, why = pytorch_default(ctx, joint_inputs)
    if why:
        notes.append(why)
    return {"solver": name, "points": points, "pytorch_default": default, "notes": notes}


def _plan(ctx: Context, solver, mincut_plan: Candidate, budget: int) -> Candidate | BudgetError:
    try:
        with _compat.lazy_graph_modules(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the chosen plan's warnings were given already
            return solver.plan(ctx, mincut_plan, budget, True)
    except BudgetError as error:
        return error


def pytorch_default(ctx: Context, joint_inputs: Any) -> tuple[dict[str, Any] | None, str]:
    """PyTorch's default partition (``min_cut_rematerialization_partition``, no budget) of
    the prepared joint graph, as a point of the curve, and "" ; or None and why not."""
    if joint_inputs is None:
        return None, "PyTorch's default partition: not estimated (no joint inputs)"
    graph = fx.Graph()
    graph.output(graph.graph_copy(ctx.joint.graph, {}))  # its partitioner edits the graph it gets
    joint = fx.GraphModule(ctx.joint, graph)
    try:
        fwd, bwd = _compat.default_partition_fn()(joint, joint_inputs, num_fwd_outputs=ctx.num_fwd_outputs,
                                                  compiler="inductor")
        inputs = {n.name for n in bwd.graph.find_nodes(op="placeholder")}
        saved = [n for n in ctx.joint.graph.nodes if n.name in inputs]
        candidate = make_candidate(ctx, "pytorch", fwd, bwd, saved, 0.0, foreign=True)
    except Exception as error:  # noqa: BLE001 - a report's comparison, never the plan: said in the report
        return None, f"PyTorch's default partition: not estimated ({type(error).__name__}: {error})"
    return point("PyTorch default", candidate, ctx, None), ""


def curve(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other point beats on both predicted peak and estimated time, by peak."""
    ordered = sorted(points, key=lambda p: (p["predicted_peak_bytes"], p["estimated_step_s"]))
    frontier: list[dict[str, Any]] = []
    for p in ordered:
        if not frontier or p["estimated_step_s"] < frontier[-1]["estimated_step_s"]:
            frontier.append(p)
    return frontier
