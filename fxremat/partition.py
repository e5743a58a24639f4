"""The fxremat partitioner: joint graph -> (forward graph, backward graph, plan).

Read top to bottom, ``partition`` is the pipeline:

1. ``joint.prepare``, ``joint.classify``: the joint graph cleaned up, and which nodes
   the forward can compute, which its outputs need, which the backward needs.
2. ``joint.mincut_problem``: the graph as an abstract min-cut problem, with bans and
   capacities from the fusion-aware cost model.
3. ``strategies.mincut``: the saved set of least traffic (``passes.mincut``), its forward
   and backward graphs (torch's extractor, recomputations placed before first use), and
   its predicted memory timeline (``timeline.predict``).
4. The budget in bytes: as given, or for a fraction between the solver's least-memory
   plan (``_least_plan``) and the min-cut plan. Fits the budget? Then that is the plan.
   Otherwise (or when a staged solver was asked for by name) the solver in the registry
   (``strategies.SOLVERS``) plans within it.
5. The chosen graphs carry the predicted levels Inductor's buffer reuse is held to.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any, Iterator

import torch.fx as fx

from . import _compat, costmodel, dynamic, joint as joint_graph, memo, ranks, sizes, tradeoff
from .candidate import Candidate, Context, log
from .fx_passes import mark_call_windows, mark_predicted_levels
from .options import Options, format_bytes
from .floor import graph_floor
from .plans import BudgetError, BudgetWarning, Plan, below_floor, graph_fingerprint, with_floor  # noqa: F401 (re-exported)
from .strategies import SOLVERS
from .timeline import step_modules
from .strategies import mincut as mincut_strategy

# A graph whose least-memory plan predicts at least this fraction of its min-cut plan has
# no activations worth trading (HF GPT-2's loss graph: 0.9995); see ``_least_plan``.
UNTRADEABLE = 0.95


def partition(
    joint: fx.GraphModule,
    joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    options: Options,
    static_lifetime_input_indices: list[int] | None = None,
    **_: Any,
) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    """Inductor's partition step (``custom_partitioner_fn``): the forward and backward graphs
    of the joint graph ``joint`` under ``options``, and the ``Plan`` that made them. Raises
    ``BudgetError`` when no solver's plan fits ``options.memory_budget``."""
    with _collector_while_planning():
        return _compat.on_fresh_stack(_partition, joint, num_fwd_outputs, options, static_lifetime_input_indices,
                                      joint_inputs)


# Objects allocated (net of those freed) between two collections of the youngest generation
# while planning; Python's default is 700.
YOUNG_COLLECTION_THRESHOLD = 50_000


@contextlib.contextmanager
def _collector_while_planning() -> Iterator[None]:
    """Python's collector while planning: what was alive before is left alone (``gc.freeze``),
    and the youngest generation is collected every ``YOUNG_COLLECTION_THRESHOLD`` allocations,
    not 700; the process's settings are back afterwards.

    Why: planning allocates many short-lived objects (light graphs, timeline steps). Full
    collections walked the whole compiling process (Dynamo's objects, fake tensors) until the
    heap was frozen, and then still walked the planner's own candidate graphs, which live just
    long enough to reach the oldest generation at Python's threshold (16-layer transformer
    inside ``torch.compile``: 32 full collections, 2.1-2.8 s of a 12-14 s plan; 0.75-1.1 s at
    50,000). The price is the planner's peak memory, garbage waiting longer (48 layers: 191 to
    238 MB; docs/planning-at-scale.md). A process that froze objects itself, or turned
    automatic collection off, is left as it is: unfreezing would undo its freeze."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    threshold = gc.get_threshold()
    if threshold[0]:  # (0: the process turned automatic collection off; it stays off)
        gc.set_threshold(max(threshold[0], YOUNG_COLLECTION_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _partition(joint: fx.GraphModule, num_fwd_outputs: int, options: Options,
               static_lifetime_input_indices: list[int] | None, joint_inputs: Any = None
               ) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    started = time.perf_counter()
    _compat.register_torch_log(log.name)  # TORCH_LOGS="fxremat": each plan's summary, at INFO
    sizes.reset_assumed()
    ctx = context(joint, num_fwd_outputs, options, static_lifetime_input_indices)
    try:
        return ranks.same_plan(ctx, lambda ctx: _plan(ctx, joint_inputs, started))
    except BudgetError as error:
        raise dynamic.with_sizes(error, ctx) from None


def _plan(ctx: Context, joint_inputs: Any, started: float) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    """The plan of the prepared graph ``ctx`` (``_partition``'s steps 3 to 5)."""
    with memo.planning():  # each node's bytes and scratch found once for all candidates
        return _plan_memoized(ctx, joint_inputs, started)


def _plan_memoized(ctx: Context, joint_inputs: Any, started: float) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    options = ctx.options
    mincut_plan = mincut_strategy.traffic_optimal(ctx)
    peak = mincut_plan.peak
    classes = ctx.classes
    floor = graph_floor(ctx.joint, ctx.input_names, mincut_plan.plan.timeline.end_bytes, forward=classes.forward,
                        gradients=classes.bwd_outputs,
                        held=sizes.held_outputs(classes.fwd_outputs[:ctx.num_fwd_outputs], options.hold_outputs),
                        inlines=options.compiler == "inductor", outputs=classes.fwd_outputs[:ctx.num_fwd_outputs],
                        later_graphs=options.later_graphs_bytes)
    solver = SOLVERS[options.solver]
    asked = options.memory_budget
    least = None  # a fraction's least-memory plan
    if asked is None:
        budget = None
    elif asked.fraction is None:
        budget = asked.bytes
        if peak > budget and budget < floor.bytes:
            raise below_floor(options, ctx.graph_id, budget, floor)
    elif asked.fraction >= 1.0:
        budget = peak
    else:
        searching = time.perf_counter()
        least = _least_plan(ctx, solver, mincut_plan)
        least_seconds = time.perf_counter() - searching
        budget = asked.between(least.peak, peak)
    mincut_plan.plan.budget_bytes = budget
    over = budget is not None and peak > budget
    if over:
        ctx.progress(f"the min-cut plan predicts {format_bytes(peak)}, over the budget of {format_bytes(budget)}: "
                     f"solver {solver.name!r} searches")
    if least is not None and (asked.fraction == 0.0 or least is mincut_plan):
        chosen = least  # the fraction's own end: no search
    elif over or solver.staged:
        try:
            chosen = _plan_within(ctx, solver, mincut_plan, budget if budget is not None else peak, over)
        except BudgetError as error:
            if least is None:
                raise with_floor(error, floor) from None
            # The searches assume that a larger budget never loses a plan; where that fails,
            # the least-memory plan still fits the fraction's budget.
            chosen = least
            chosen.plan.notes["why"] = (f"{solver.name} found no plan within {format_bytes(budget)} searching "
                                        f"again: the least-memory plan, which fits")
    else:
        chosen = mincut_plan
        chosen.plan.notes["why"] = ("no budget: the min-cut plan" if budget is None else
                                    f"the min-cut plan fits the budget ({format_bytes(peak)} <= "
                                    f"{format_bytes(budget)})")
    chosen.plan.budget_bytes = budget
    if least is not None:
        chosen.plan.notes["fraction_between"] = {"least_bytes": least.peak, "unconstrained_bytes": peak}
        chosen.plan.notes["least_plan_seconds"] = least_seconds  # of solve_seconds: finding the least plan
    # The searches are over: what they kept for one another (scored probes, the DP's answers)
    # and the least-memory plan's light graphs go before the chosen plan's torch.fx graphs
    # are built, the planner's peak (48-layer transformer: 274 MB, 190 MB of it search
    # state). The report's sweep (debug_dir) searches again and reuses them.
    if options.debug_dir is None:
        ctx.memo.clear()
    if least is not None and least is not chosen:
        least.release()  # built again if a dynamic-shape bound asks for it (``realize``)
    with _compat.lazy_graph_modules():  # their code is made where they first run
        chosen.realize()  # searches score light graphs; the plan chosen gets torch.fx ones
    fwd, bwd, plan = chosen.forward, chosen.backward, chosen.plan
    plan.notes["floor_bytes"] = floor.bytes
    # Planning builds many candidate graphs: their Python code is made only for the one that runs.
    plan.forward_code, plan.backward_code = _compat.graph_source(fwd), _compat.graph_source(bwd)
    mark_predicted_levels(fwd, bwd, plan.timeline)
    mark_call_windows(fwd)
    mark_call_windows(bwd)
    plan.step_modules = step_modules(fwd, bwd, plan.timeline)
    joint_graph.add_modules(plan.saved, plan.recomputed, ctx.joint, bwd)
    dynamic.warn_assumed(ctx, plan)
    if budget is not None:
        # Dynamic sizes: the plan is kept to the sizes where it meets the budget (a guard;
        # elsewhere Dynamo compiles again and fxremat plans for those sizes).
        dynamic.bound(ctx, chosen, mincut_plan, budget, least)
    if options.debug_dir is not None:
        # For the report (fxremat.explain): what other budgets would buy, and what each
        # recomputed op is estimated to cost.
        ctx.progress("sweeping budgets for the report's trade-off curve (debug_dir is set)")
        plan.notes["tradeoff"] = tradeoff.sweep(ctx, mincut_plan, chosen, joint_inputs)
        costs = ctx.costs()
        for entry in plan.recomputed:
            node = ctx.by_name.get(entry.get("source", ""))
            entry["estimated_s"] = costs.get(node, 0.0) if node is not None else 0.0
    plan.solve_seconds = time.perf_counter() - started
    log.info("graph %s (%d nodes): %s plan, predicted peak %s%s, saves %s, recomputes %d ops; planned in %.2f s",
             ctx.graph_id, len(ctx.by_name), plan.solver, format_bytes(plan.predicted_peak_bytes),
             f" (budget {format_bytes(plan.budget_bytes)})" if plan.budget_bytes is not None else "",
             format_bytes(plan.saved_activation_bytes), len(plan.recomputed), plan.solve_seconds)
    return fwd, bwd, plan


def context(joint: fx.GraphModule, num_fwd_outputs: int, options: Options,
            static_lifetime_input_indices: list[int] | None = None) -> Context:
    """The prepared joint graph, its classes and its traffic-optimal min-cut problem."""
    joint = joint_graph.prepare(joint)
    graph_id = graph_fingerprint(joint)
    joint_graph.warn_on_checkpoint_preferences(joint, graph_id)
    classes = joint_graph.classify(joint, num_fwd_outputs)
    problem, banned = joint_graph.mincut_problem(joint, classes)
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and _compat.is_primal(n)]
    static = {primals[i] for i in (static_lifetime_input_indices or []) if i < len(primals)}
    timer = costmodel.OpTimer(joint_graph.graph_device(joint)) if options.cost_model == "measured" else None
    return Context(joint, classes, num_fwd_outputs, static, options, graph_id,
                   {n.name: n for n in joint.graph.nodes}, {n.name for n in classes.inputs}, banned, problem,
                   timer=timer)


def _least_plan(ctx: Context, solver, mincut_plan: Candidate) -> Candidate:
    """The least-memory plan of ``solver``: the lower end of a fraction budget (``Budget.between``).

    Found by asking the solver for a plan within no memory at all: its search ends at its
    least-memory plan, which the ``BudgetError`` carries (``least_candidate``). A graph
    whose least-memory plan predicts ``UNTRADEABLE`` of its min-cut plan or more has
    nothing worth trading (HF GPT-2's loss graph: 0.9995): its min-cut plan stands for both
    ends, and every fraction keeps it."""
    ctx.progress(f"a fraction budget: solver {solver.name!r} looks for its least-memory plan")
    least = mincut_plan
    if solver.name != "mincut":  # the min-cut solver recomputes nothing further: its plan is its least
        try:
            with _compat.lazy_graph_modules():
                least = solver.plan(ctx, mincut_plan, 0, True)
        except BudgetError as error:
            if error.least_candidate is None:
                raise  # the solver found no plan at any budget
            least = error.least_candidate
    if least.peak >= UNTRADEABLE * mincut_plan.peak:
        mincut_plan.plan.notes["nothing_to_trade"] = True
        mincut_plan.plan.notes["why"] = (
            "solver='mincut' recomputes nothing further: its plan is its least-memory plan, at every fraction"
            if least is mincut_plan else
            f"{solver.name} finds no plan predicting much less than the min-cut plan "
            f"({format_bytes(mincut_plan.peak)}; its least-memory plan {format_bytes(least.peak)}, at least "
            f"{UNTRADEABLE:g} of it): it is this graph's plan at every fraction"
            + ("" if solver.name == "auto" else " (another solver may go lower)"))
        least = mincut_plan
    else:
        least.plan.notes["why"] = (f"memory_budget={ctx.options.memory_budget.fraction:g}: {solver.name}'s "
                                   f"least-memory plan")
    return least


def _plan_within(ctx: Context, solver, mincut_plan: Candidate, budget: int, over: bool) -> Candidate:
    """``solver``'s plan within ``budget``; a graph no plan gets meaningfully below its
    min-cut plan raises naming that plan's peak (``_unreachable``)."""
    try:
        with _compat.lazy_graph_modules():
            return solver.plan(ctx, mincut_plan, budget, over)
    except BudgetError as error:
        if (ctx.options.memory_budget is None or ctx.options.memory_budget.fraction is not None
                or error.least_bytes is None or error.least_bytes < UNTRADEABLE * mincut_plan.peak):
            raise
        raise _unreachable(ctx, mincut_plan, error) from None


def _unreachable(ctx: Context, mincut_plan: Candidate, error: BudgetError) -> BudgetError:
    """The error for a byte budget below the min-cut plan's peak on a graph where no
    recomputing plan predicts less than ``UNTRADEABLE`` of it (a loss graph: the logits and
    their gradient are the peak whatever is saved): it names the lower of the two."""
    least = min(mincut_plan.peak, error.least_bytes)
    return BudgetError(
        f"fxremat: memory_budget={ctx.options.memory_budget.describe(mincut_plan.plan.budget_bytes)} is below the "
        f"minimum feasible budget for graph {ctx.graph_id}: no plan that recomputes predicts less than "
        f"{format_bytes(error.least_bytes)}, and the min-cut plan predicts {format_bytes(mincut_plan.peak)}. "
        f"Allowed: a budget of at least {least} bytes.", least)
