"""``solver="auto"`` over the budget: Rotor, which is optimal on chains of stages (and
Checkmate too where the stages form a small DAG), and the knapsack, which gives up
single values where the staged solvers drop whole stages; the faster estimate wins."""

from __future__ import annotations

import dataclasses

from .. import stage_graph
from ..candidate import Candidate, Context
from ..options import format_bytes
from ..plans import BudgetError, below_minimum
from . import SOLVERS, knapsack, staged

CHECKMATE_MAX_STAGES = 8  # Checkmate's ILP runs only on DAGs this small (fast)


def plan(ctx: Context, mincut_plan: Candidate, budget: int, over: bool, solver) -> Candidate:
    why = f"the min-cut plan ({format_bytes(mincut_plan.peak)}) is over the budget ({format_bytes(budget)})"
    knapsack_found, probes = knapsack.search(ctx, budget)
    traffic = staged.traffic(ctx, mincut_plan)
    sets = staged.saved_sets(ctx, traffic)
    if "knapsack" in staged.SAVED_SETS:
        # Rotor also plans around the knapsack's saved set (its plan, or the probe that
        # predicted least): a stage kept whole then holds no attention scores.
        base = knapsack_found or min(probes, key=lambda p: p.peak)
        kept = {d["name"] for d in base.plan.saved}
        saved = [n for n in ctx.joint.graph.nodes if n.name in kept]
        # A saved set already planned around (the lean one, often, on CNNs) would give the
        # same plans again, and lose the tie to the first.
        if base.plan.notes["given_up"] and all(set(saved) != set(s.saved) for s in sets):
            sets.append(staged.SavedSet("knapsack", dataclasses.replace(ctx, banned=base.plan.banned), base.backward,
                                        saved))
    try:
        rotor = SOLVERS["rotor"]
        found, sets_why = staged.fastest(sets, lambda s, beat: staged.plan_around(s, budget, rotor, beat=beat))
        found, staged_why = _with_checkmate(traffic, found, budget)
        why += f"{sets_why}; {staged_why}"
    except BudgetError as error:
        found, why = error, f"{why}; Rotor found no plan within it{_least_said(error)}"
    winner, lighter_why = _staged_or_knapsack(ctx, found, knapsack_found, probes, budget)
    winner.plan.notes["why"] = f"{why}; {lighter_why}"
    return winner


def _least_said(error: BudgetError) -> str:
    """What a staged solver's refusal found, for the plan's why: its least-memory plan's
    predicted peak and its number of stages (a chain of few stages cannot go low)."""
    least = error.least_candidate
    if error.least_bytes is None or least is None:
        return ""
    stages = least.plan.notes.get("stages")
    merged = least.plan.notes.get("stages_merged")
    return f" (its least-memory plan predicts {format_bytes(error.least_bytes)}" + (
        f" over {stages} stages" + (f"; {merged[0]}" if merged else "") + ")" if stages is not None else ")")


def _with_checkmate(traffic: staged.SavedSet, rotor_result: Candidate, budget: int) -> tuple[Candidate, str]:
    """Rotor's plan, or Checkmate's where the stages form a small DAG and its plan is
    estimated faster; and why."""
    ctx = traffic.ctx
    # The same for every budget: found once per graph (a fraction's two searches ask both).
    key = ("checkmate's stages", tuple(n.name for n in traffic.saved))
    if key not in ctx.memo:
        lin, cost = staged.linearize(ctx, traffic.backward, traffic.saved, CHECKMATE_MAX_STAGES)
        ctx.memo[key] = len(lin.stages), stage_graph.build(lin, cost, ctx.input_names).skips if lin.stages else 0
    stages, skips = ctx.memo[key]
    if skips == 0 or stages > CHECKMATE_MAX_STAGES:
        shape = ("a chain of stages" if skips == 0 else
                 f"a DAG that does not merge into {CHECKMATE_MAX_STAGES} stages or fewer (Checkmate's ILP "
                 f"would be slow to compile; ask for solver='checkmate' to use it)")
        return rotor_result, f"the graph is {shape}: Rotor"
    try:
        checkmate_result = staged.plan_around(traffic, budget, SOLVERS["checkmate"], max_stages=CHECKMATE_MAX_STAGES)
    except BudgetError:
        checkmate_result = None
    r = rotor_result.plan.cut_cost  # both makespans in the stage model's seconds (one model)
    c = checkmate_result.plan.cut_cost if checkmate_result else float("inf")
    winner = checkmate_result if c < r else rotor_result
    return winner, (f"the stages form a DAG ({skips} skip edges): Rotor and Checkmate both planned it, model "
                    f"makespans {r * 1e3:.3f} ms and {'no plan' if checkmate_result is None else f'{c * 1e3:.3f} ms'}: "
                    f"{winner.plan.solver}")


def _staged_or_knapsack(ctx: Context, found: Candidate | BudgetError, knapsack_found: Candidate | None,
                        probes: list[Candidate], budget: int) -> tuple[Candidate, str]:
    """The staged solvers' plan (or their BudgetError: none fits), or the knapsack's when
    that one fits with a smaller estimated step time (``Context.estimate``): near the
    min-cut plan's peak, giving up a few values beats dropping whole stages; and why.
    When neither fits, raises the BudgetError that names the lower minimum."""
    staged_failed = isinstance(found, BudgetError)
    if knapsack_found is None:
        if staged_failed:
            least = min(probes, key=lambda probe: probe.peak)
            if found.least_bytes is None or least.peak < found.least_bytes:
                raise below_minimum(ctx.options, ctx.graph_id, budget, least.peak,
                                    "Rotor found no plan within it, and the knapsack's least-memory plan",
                                    least_candidate=least)
            raise found
        return found, f"the knapsack found no plan within the budget: {found.plan.solver}"
    k = ctx.estimate(knapsack_found)
    given_up = (f"estimated step times (fxremat's cost model): the knapsack's plan (giving up "
                f"{len(knapsack_found.plan.notes['given_up'])} values) {k * 1e3:.3f} ms")
    if staged_failed:
        return knapsack_found, f"{given_up}: knapsack"
    s = ctx.estimate(found)
    winner = found if s <= k else knapsack_found
    return winner, f"{given_up} against {found.plan.solver}'s {s * 1e3:.3f} ms: {winner.plan.solver}"
