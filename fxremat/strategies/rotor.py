"""Rotor (Beaumont et al., ACM TOMS) over the chain of stages: ``solver="rotor"`` (the
persistent DP, Algorithm 3) and ``solver="rotor_exact"`` (the weakly persistent DP,
Algorithm 1: exact, O(L^4 S), fewer stages)."""

from __future__ import annotations

from .. import chain
from ..candidate import Candidate
from ..passes import rotor as rotor_dp
from ..plans import BudgetError
from ..sizes import is_tensor_node, node_bytes, storage_bytes, storage_of
from .staged import Schedule, StagedProblem, search_faster_than, search_model_budget, tangent_bytes


def search(problem: StagedProblem) -> Candidate:
    lin, ctx = problem.lin, problem.ctx
    # The chain counts the gradients its stages make from when they are made.
    in_chain = chain.gradients_in_chain(lin, problem.gradients)
    problem.outside -= sum(node_bytes(g) for g in in_chain)
    # and the incoming gradients from the backward's start (the loss stage's B), and, when
    # the caller does not hold the outputs, those outputs until the turn: counted throughout
    # (``outside``), GPT-2's logits and their gradient (1.65 GB each at batch 8) stood at the
    # turn beside the later graphs' need, and the DP's least plan moved every recomputation
    # after it (its backward then predicted 4.39 GB where the DP saw room).
    outputs = ctx.user_outputs
    tangents = tangent_bytes(ctx)
    problem.outside -= tangents
    need, kept = ctx.options.later_graphs_bytes
    if not ctx.options.hold_outputs:
        in_stages = {storage_of(n) for st in lin.stages for n in st.boundary + st.saved}
        problem.outside -= storage_bytes(outputs, ctx.input_names)
        need += storage_bytes([n for n in outputs if storage_of(n) not in in_stages], ctx.input_names)
    handed = [n for n in outputs if is_tensor_node(n) and n.meta["val"].dtype.is_floating_point]
    persistent = problem.solver.name == "rotor"
    # Two views of a stage's temporaries: every value it makes (an upper bound of what the
    # emitted graphs write), and, under Inductor, only those Inductor writes (what the
    # timeline counts). Neither is the timeline, which judges every plan; each leads the DP
    # to plans the other misses. Counting every value, the DP's least plan is set by an MLP
    # backward's overhead that Inductor fuses away, and keeps values elsewhere that make the
    # real peak (Hugging Face GPT-2's least plan 17% above the fused chain's, ViT's 6%);
    # counting fused values only, the 16-layer decoder's least is 5% above the other's.
    # So both are searched and the faster plan within the budget is kept; with none, the
    # lower least-memory plan is the one the error names. Once one view has a plan, the
    # other's search builds only the schedules faster than it (``search_faster_than``).
    views = [False, True] if ctx.options.compiler == "inductor" else [False]

    def view_chain(fused: bool) -> rotor_dp.Chain:
        # The same for every budget: built once per linearization and view (a fraction's
        # least-memory search and its search within the budget both ask).
        key = ("rotor chain", id(lin), fused, need, kept)
        if key not in ctx.memo:
            ctx.memo[key] = chain.rotor_chain(lin, problem.cost, ctx.input_names, in_chain,
                                              later_graphs=(need, kept), incoming=(handed, tangents), fused=fused)
        return ctx.memo[key]

    if problem.beat is not None and all(_ends(problem, view_chain(fused), persistent)[1].makespan >= problem.beat
                                        for fused in views):
        # No schedule of either view is faster than the plan to beat (a keep-all schedule is
        # the fastest there is): whatever fits would lose to it (the earlier set's, on ties).
        return None
    found, refused = [], []
    for fused in views:
        rchain = view_chain(fused)
        beat = found[0].plan.cut_cost if found else None
        try:
            plan, keeps_every_stage = _search_chain(problem, rchain, persistent, beat)
        except BudgetError as error:
            refused.append(error)
            continue
        if plan is None:
            continue  # nothing faster than the other view's plan fits
        found.append(plan)
        if keeps_every_stage:  # the fastest sequence there is, the same in both views
            break
    if not found:
        raise min(refused, key=lambda e: e.least_bytes if e.least_bytes is not None else float("inf"))
    return min(found, key=lambda c: c.plan.cut_cost)  # the first on ties: the upper-bound view's


def _ends(problem: StagedProblem, rchain: rotor_dp.Chain, persistent: bool) -> tuple[float, rotor_dp.Solution]:
    """The chain's least model budget, and its fastest schedule (which keeps every stage):
    the ends of the model budgets searched, found once per chain."""
    key = ("rotor ends", id(rchain), persistent)
    if key not in problem.ctx.memo:
        # A chain whose every byte lives outside it (one linear layer) needs a budget of 0,
        # which the DP does not take: ask for one byte.
        problem.ctx.memo[key] = (max(rotor_dp.min_budget(rchain, persistent=persistent), 1.0),
                                 rotor_dp.solve(rchain, 1e30, persistent=persistent))
    return problem.ctx.memo[key]


def _search_chain(problem: StagedProblem, rchain: rotor_dp.Chain, persistent: bool,
                  beat: float | None = None) -> tuple[Candidate | None, bool]:
    """The fastest plan within the budget over ``rchain``'s model budgets, and whether it is
    the sequence that keeps every stage (none is faster). Raises BudgetError. With ``beat``
    (model seconds), only a plan faster than that, or None."""
    lin = problem.lin
    # The DP's answers, shared by the searches of this chain (a fraction asks twice).
    solved: dict[float, Schedule | None] = problem.ctx.memo.setdefault(("rotor schedules", id(rchain), persistent), {})

    def solve_at(model_budget: float) -> Schedule | None:
        if model_budget not in solved:
            try:
                solution = rotor_dp.solve(rchain, model_budget, persistent=persistent)
                solved[model_budget] = Schedule(solution.sequence, solution.makespan,
                                                chain.kept_after_forward(lin, solution.sequence))
            except rotor_dp.InfeasibleBudget:
                solved[model_budget] = None
        return solved[model_budget]

    least_model, keep_all = _ends(problem, rchain, persistent)
    most_model = max(keep_all.peak, least_model)  # keeps every stage: more never helps
    slack = (1.0001, 1.01, 1.03, 1.1)  # the DP rounds sizes up into bins
    if beat is not None:
        plan = search_faster_than(problem, solve_at, least_model, most_model, beat)
        return plan, plan is not None and plan.plan.sequence == rotor_dp.format_sequence(keep_all.sequence)
    plan = search_model_budget(problem, solve_at, least_model, most_model, slack)
    return plan, plan.plan.sequence == rotor_dp.format_sequence(keep_all.sequence)
