"""The knapsack (``passes/knapsack.py``): the min-cut plan with single values given up,
cheapest to recompute per byte first, until the plan fits. Where Rotor drops a whole
stage (an attention block's QKV projection with its scores), this drops single values
(the scores alone)."""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from ..candidate import Candidate, Context, extract_placed, make_candidate
from ..fx_passes import mark_recomputation_windows
from ..passes import knapsack, mincut
from ..plans import below_minimum
from ..sizes import node_bytes

# Bans a budget may lift: the op is deterministic, and the traffic-optimal cut bans it
# only because recomputing it costs time (a matmul) or saves no traffic.
TRADEABLE_BANS = ("compute_intensive", "unfusible", "unfusible_backward_user", "small_reduction")


def plan(ctx: Context, mincut_plan: Candidate, budget: int, over: bool, solver) -> Candidate:
    """``solver="knapsack"``: the shortest prefix of the ranked values whose plan fits the
    budget (``search``). Raises the BudgetError naming its least-memory plan."""
    found, probes = search(ctx, budget)
    if found is None:
        least = min(probes, key=lambda probe: probe.peak)
        candidates = probes[0].plan.notes["candidates"]
        raise below_minimum(ctx.options, ctx.graph_id, budget, least.peak,
                            f"the least-memory plan that gives up values ({candidates} may be recomputed)",
                            below="what the knapsack reaches",
                            alternative="; or solver='auto' or 'rotor', which recompute whole stages",
                            least_candidate=least)
    found.plan.notes["why"] = (f"solver='knapsack' was asked for; giving up "
                               f"{len(found.plan.notes['given_up'])} values fits")
    return found


def search(ctx: Context, budget: int) -> tuple[Candidate | None, list[Candidate]]:
    """The knapsack's plan within ``budget`` (None when no probe fits), and every plan it
    probed. Ranked by recompute time per byte, a prefix of the values whose bans may be
    lifted must be recomputed in the backward, the traffic-optimal cut is solved again,
    and each recomputation is placed just before its first use."""
    problem, banned = ctx.problem, ctx.banned
    cost = ctx.costs()
    # Every value whose ban may be lifted, saved or not: giving up a saved softmax output
    # makes the cut save the (banned) scores it is computed from instead, which frees
    # nothing until the scores are given up too.
    items = knapsack.rank([knapsack.Item(n.name, cost.get(n, 0.0), node_bytes(n)) for n in ctx.joint.graph.nodes
                           if banned.get(n.name) in TRADEABLE_BANS and node_bytes(n) > 0])
    # Shared with this graph's other knapsack searches (``Context.memo``): a prefix's saved set
    # does not depend on the budget. ``asked``: the prefixes this search asked for, in order.
    ranked = tuple(item.name for item in items)
    cuts: dict[int, tuple[list[fx.Node], int] | None] = ctx.memo.setdefault(("knapsack cuts", ranked), {})
    built: dict[int, Candidate] = {}  # scored on light graphs (``lite``)
    scored: dict[int, Candidate] = ctx.memo.setdefault(("knapsack probes", ranked), {})
    asked: list[int] = []

    def cut(k: int) -> tuple[list[fx.Node], int] | None:
        """The saved set with the first ``k`` items given up, and the bytes alive as its
        backward begins (``Context.backward_start_bytes``, a lower bound of its plan's peak);
        None when that cut is infeasible."""
        if k not in asked:
            asked.append(k)
        if k not in cuts:
            lifted = {item.name for item in items[:k]}
            # A given-up value is recomputed from what the cut saves; the bans of the
            # others stay: lifting them lets the traffic-optimal cut save a block's
            # input alone and recompute the whole forward at the start of the backward.
            try:
                solution = mincut.solve(dataclasses.replace(problem, banned=problem.banned - lifted,
                                                            must_recompute=problem.must_recompute | lifted))
            except mincut.InfeasibleCut:  # a given-up value cannot be recomputed from saveable ones
                cuts[k] = None
                return None
            saved = ctx.saved_nodes(solution.saved)
            cuts[k] = saved, ctx.backward_start_bytes(saved)
        return cuts[k]

    def make(k: int, light: bool) -> Candidate:
        saved = cut(k)[0]
        fwd, bwd, fwd_names = extract_placed(ctx, saved, light=light)
        if not light:
            mark_recomputation_windows(bwd, fwd_names)
        lifted = {item.name for item in items[:k]}
        found = make_candidate(ctx, "knapsack", fwd, bwd, saved, 0.0)
        found.plan = dataclasses.replace(found.plan,
                                         banned={name: why for name, why in banned.items() if name not in lifted})
        found.plan.budget_bytes = budget
        found.plan.notes = {"given_up": [item.name for item in items[:k]], "candidates": len(items)}
        return found

    def build(k: int) -> Candidate:
        if k not in built:
            known = scored.get(k)
            if known is None or known.forward is None:  # a light candidate released by an earlier search
                known = scored[k] = make(k, light=True)
                known.rebuild = lambda: make(k, light=False)  # the torch.fx graphs, if it is chosen
            known.plan.budget_bytes = budget
            built[k] = known
            # Graphs are kept for the probes the caller may read: the shortest fitting prefix
            # (the plan) and the least predicted (Rotor plans around its saved set).
            fitting = [j for j in built if built[j].peak <= budget]
            least = min(probe.peak for probe in built.values())
            for j in built:
                if built[j].peak != least and (not fitting or j != min(fitting)):
                    built[j].release()
        return built[k]

    def fits(k: int) -> bool:
        ctx.progress(f"knapsack: giving up the first {k} of {len(items)} values")
        # Extracting and predicting a plan is the expensive part: skipped when what is alive
        # as its backward begins is over the budget.
        if cut(k) is None or cut(k)[1] > budget:
            return False
        return build(k).peak <= budget

    k = knapsack.least_prefix(len(items), fits)
    if k is not None:
        found = build(k)
        found.plan.cut_cost = ctx.estimate(found)  # estimated only once found: most probes do not fit
        return found, [built[j] for j in asked if j in built]
    # None fits: the probe that predicts least is still wanted (the error names it, Rotor plans
    # around its saved set). Build the skipped ones while their bound is under the least so far.
    least = min((probe.peak for probe in built.values()), default=None)
    for j in sorted((j for j in asked if cuts[j] is not None and j not in built), key=lambda j: cuts[j][1]):
        if least is not None and cuts[j][1] > least:
            break
        peak = build(j).peak
        least = peak if least is None else min(least, peak)
    return None, [built[j] for j in asked if j in built]
