"""The fxremat partitioner: joint graph -> (forward graph, backward graph, plan).

Small steps, each doing one thing:

1. ``classify``: which nodes the forward can compute (V_f), which the forward
   outputs need, which the backward needs.
2. ``mincut_problem``: the joint graph as an abstract min-cut problem, with
   bans and capacities from the fusion-aware cost model.
3. ``passes.mincut.solve``: the saved set.
4. ``_compat.extract_fwd_bwd_modules``: forward and backward graphs with
   AOTAutograd's calling convention.
5. ``place_recomputations``: every recomputed node just before its first use.
6. ``timeline.predict``: the predicted memory timeline, checked against the budget.

Over the budget, ``_auto`` plans with Rotor over a chain of stages (``_staged``; Checkmate
too on a small DAG) and with the knapsack, which gives up single saved values
(``_knapsack``), and keeps the faster estimate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import warnings
from typing import Any

import torch
import torch.fx as fx

from . import _compat, oplib
from .options import Options, format_bytes
from .passes import mincut
from .passes.memory import Timeline
from .sizes import (describe, handed_over_bytes, is_multi_output, is_tensor_node, node_bytes, storage_bytes,
                    storage_node, storage_of)
from .timeline import predict, relaid_inputs

# Saving a node ``d`` ops away from the backward costs (1 + REWEIGHT * d) times its
# bytes: a tie-break that prefers saving values close to the backward, which need
# the shortest recomputation (Yu & He, section 3.4).
REWEIGHT = 0.01
REWEIGHT_MAX_DISTANCE = 100
# Reductions whose output is this many times smaller than their input are saved,
# never recomputed (Yu & He, section 3.4).
SMALL_REDUCTION_RATIO = 4
# The lean cut (for budgets the traffic-optimal plan does not fit) prices a saved byte at
# this many reads: bytes decide, traffic breaks ties.
LEAN_BYTE_PENALTY = 8.0
LEAN_CUT = True  # chain solvers over budget also plan around the lean cut (``_cuts``)


class BudgetError(ValueError):
    """The memory budget cannot be met by the available solvers. ``least_bytes``: the
    least predicted peak the solver found for the graph, when it got that far."""

    def __init__(self, message: str, least_bytes: int | None = None):
        super().__init__(message)
        self.least_bytes = least_bytes


class BudgetWarning(UserWarning):
    """The budget may not hold as asked: a fraction budget that a compiled graph cannot
    reach at all (no plan predicts meaningfully less than its unconstrained one: a loss
    computed in a graph of its own, after a graph break; the graph keeps that plan, the
    other graphs get the fraction), or Inductor settings that keep memory the plan frees."""


# A graph whose least-memory plan predicts at least this fraction of its min-cut plan has
# no activations worth trading (HF GPT-2's loss graph: 0.9995); see ``_unreachable``.
UNTRADEABLE = 0.95


@dataclasses.dataclass
class NodeClasses:
    forward: set[fx.Node]  # V_f: computable from the forward inputs alone
    required_forward: set[fx.Node]  # needed by the forward's outputs
    inputs: list[fx.Node]  # primals and forward RNG seeds
    fwd_outputs: list[fx.Node]
    bwd_outputs: list[fx.Node]
    distance_to_backward: dict[fx.Node, int]


def classify(joint: fx.GraphModule, num_fwd_outputs: int) -> NodeClasses:
    fwd_outputs, bwd_outputs = _compat.fwd_bwd_outputs(joint, num_fwd_outputs)
    forward: set[fx.Node] = set()
    inputs: list[fx.Node] = []
    for node in joint.graph.nodes:
        if node.op == "placeholder":
            if _compat.is_primal(node) or _compat.is_fwd_seed_offset(node):
                forward.add(node)
                inputs.append(node)
        elif node.op == "get_attr":
            forward.add(node)
        elif node.op == "call_function":
            if all(a in forward for a in node.all_input_nodes) and not _compat.must_be_in_backward(node):
                forward.add(node)
    required: set[fx.Node] = set()
    stack = [n for n in fwd_outputs if isinstance(n, fx.Node)]
    while stack:
        node = stack.pop()
        if node in required or node not in forward:
            continue
        required.add(node)
        stack.extend(node.all_input_nodes)
    distance: dict[fx.Node, int] = {}
    for node in reversed(joint.graph.nodes):
        if node not in forward:
            distance[node] = 0
        else:
            distance[node] = min((distance[u] + 1 for u in node.users if u.op != "output"),
                                 default=REWEIGHT_MAX_DISTANCE)
    return NodeClasses(forward, required, inputs, list(fwd_outputs), list(bwd_outputs), distance)


def ban_reason(node: fx.Node, classes: NodeClasses, lean: bool = False) -> str | None:
    """Why a forward node must not be recomputed in the backward, or None if it may be.
    ``lean``: for the saved set of fewest bytes, a node the backward materializes anyway
    may be recomputed (it saves no traffic, but it saves memory)."""
    if _compat.is_must_save(node):
        return "must_save"
    if oplib.is_random(node):
        return "random"  # recomputing would draw new numbers
    if _compat.is_sym_node(node):
        return "symint"  # a few bytes; recomputing shape arithmetic buys nothing
    if node not in classes.required_forward:
        # Only the backward uses it: computing it there is not a recomputation.
        return None
    if oplib.is_getitem(node) or oplib.is_view(node):
        return None  # free to take again from what it aliases: never worth a ban
    if oplib.is_compute_intensive(node):
        return "compute_intensive"
    if not oplib.is_fusible(node):
        return "unfusible"
    if not lean and any(u not in classes.forward and not oplib.fusible_pair(node, u) for u in _consumers(node)):
        # The backward materializes it anyway (Lemma 3.1): recomputing saves no traffic.
        return "unfusible_backward_user"
    if oplib.is_reduction(node):
        in_bytes = max((node_bytes(a) for a in node.all_input_nodes), default=0)
        if node_bytes(node) * SMALL_REDUCTION_RATIO <= in_bytes:
            return "small_reduction"
    return None


def _consumers(node: fx.Node) -> list[fx.Node]:
    """The ops that read ``node``'s data, looking through views (a view reads nothing)."""
    found = []
    for user in node.users:
        if user.op == "output":
            continue
        if oplib.is_view(user):
            found.extend(_consumers(user))
        else:
            found.append(user)
    return found


def is_materialized(node: fx.Node, classes: NodeClasses) -> bool:
    """Algorithm 2: written to memory by the forward whatever the plan."""
    if node.op == "placeholder" or node in classes.fwd_outputs:
        return True
    if not oplib.is_fusible(node):
        return True
    return any(not oplib.fusible_pair(node, u) for u in _consumers(node))


def mincut_problem(joint: fx.GraphModule, classes: NodeClasses, lean: bool = False
                   ) -> tuple[mincut.MinCutProblem, dict[str, str]]:
    """The min-cut problem of the joint graph and why each banned node is banned.
    ``lean``: the problem whose cut saves the fewest bytes (``LEAN_BYTE_PENALTY``),
    recomputing in the backward the cheap ops the traffic-optimal cut saves because the
    backward would write them anyway (a GELU, a layer norm feeding a matmul)."""
    nodes = [n for n in joint.graph.nodes if n.op != "output"]
    banned: dict[str, str] = {}
    weight: dict[str, float] = {}
    unsaveable: set[str] = set()
    must_recompute: set[str] = set()
    materialized: set[str] = set()
    input_names = {n.name for n in classes.inputs}
    for node in nodes:
        if node not in classes.forward:
            continue
        reason = None if node.op in ("placeholder", "get_attr") else ban_reason(node, classes, lean)
        if reason:
            banned[node.name] = reason
        if node.op == "get_attr" or is_multi_output(node):
            unsaveable.add(node.name)  # constants are in both graphs; tuples are saved item by item
        elif oplib.is_view(node) and storage_of(node) not in input_names:
            # Save the base, not the view: two saved tensors sharing a storage would let
            # Inductor's backward reuse (donate) one buffer while the other still reads it.
            unsaveable.add(node.name)
        elif not is_tensor_node(node) and not _compat.is_sym_node(node):
            unsaveable.add(node.name)
        if _compat.is_must_recompute(node) and not reason:
            must_recompute.add(node.name)
        if is_materialized(node, classes):
            materialized.add(node.name)
        size = max(node_bytes(node), 1)  # symints weigh a byte: cheap to save, never free
        weight[node.name] = size * (1 + REWEIGHT * min(classes.distance_to_backward[node], REWEIGHT_MAX_DISTANCE))
    problem = mincut.MinCutProblem(
        nodes=[n.name for n in nodes],
        edges=[(a.name, n.name) for n in nodes for a in n.all_input_nodes],
        forward={n.name for n in classes.forward},
        inputs={n.name for n in classes.inputs},
        weight=weight,
        materialized=materialized,
        banned=set(banned),
        must_recompute=must_recompute,
        unsaveable=unsaveable,
        byte_penalty=LEAN_BYTE_PENALTY if lean else 0.0,
    )
    return problem, banned


def place_recomputations(bwd: fx.GraphModule, forward_names: set[str]) -> fx.GraphModule:
    """Move each node the backward recomputes to just before its first user, so a
    recomputed value is alive only while it is needed (and Inductor, which keeps
    the order it is given, frees it as early). Linear in the graph's size."""
    graph = bwd.graph
    deferred = {n for n in graph.nodes if n.op == "call_function" and n.name in forward_names and n.users}
    position = {n: i for i, n in enumerate(graph.nodes)}
    order: list[fx.Node] = []
    emitted: set[fx.Node] = set()
    for node in graph.nodes:
        if node in deferred:
            continue
        # Emit the deferred producers this node needs, depth first, then the node.
        # Sibling chains go latest-first: on the GPT demo this keeps fewer recomputed
        # values alive at once than original order (predicted peak 12.7 vs 13.7 MiB).
        stack = [(node, False)]
        while stack:
            current, inputs_done = stack.pop()
            if current in emitted:
                continue
            if inputs_done:
                emitted.add(current)
                order.append(current)
                continue
            stack.append((current, True))
            pending = sorted((a for a in current.all_input_nodes if a not in emitted), key=position.__getitem__)
            stack.extend((a, False) for a in pending)
    for before, after in zip(order, order[1:]):
        before.append(after)
    graph.lint()
    bwd.recompile()
    return bwd


def mark_recomputation_windows(bwd: fx.GraphModule, forward_names: set[str]) -> None:
    """Number the backward's windows, each a run of recomputed nodes and the backward
    ops after it up to the next such run, on every node (``_compat.SEGMENT_KEY``):
    Inductor then fuses only within a window (``_compat.install_segment_fusion_guard``),
    so a recomputed matmul's softmax is not fused into, and run at, an earlier kernel."""
    window, recomputing = 0, False
    for node in bwd.graph.nodes:
        if node.op != "call_function":
            continue
        recomputed = node.name in forward_names
        if recomputed and not recomputing:
            window += 1
        recomputing = recomputed
        node.meta[_compat.SEGMENT_KEY] = window


@dataclasses.dataclass
class Plan:
    """What fxremat decided for one compiled graph."""

    graph_id: str
    solver: str
    saved: list[dict]  # name, shape, dtype, bytes: values handed from forward to backward
    saved_activation_bytes: int  # saved values' bytes, less those aliasing the step's inputs
    recomputed: list[dict]  # name, op: forward nodes the backward computes again
    banned: dict[str, str]  # node -> why it may not be recomputed
    cut_cost: float
    timeline: Timeline
    budget_bytes: int | None
    forward_code: str = ""
    backward_code: str = ""
    sequence: str | None = None  # Rotor's operation sequence
    stages: int | None = None  # Rotor's chain length
    solve_seconds: float = 0.0  # wall time of planning this graph (all solvers tried)
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)  # solver choice and solver details

    @property
    def predicted_peak_bytes(self) -> int:
        return self.timeline.peak_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "graph_id": self.graph_id,
            "solver": self.solver,
            "saved": self.saved,
            "saved_activation_bytes": self.saved_activation_bytes,
            "recomputed": self.recomputed,
            "banned": self.banned,
            "cut_cost": self.cut_cost,
            "budget_bytes": self.budget_bytes,
            "sequence": self.sequence,
            "stages": self.stages,
            "solve_seconds": self.solve_seconds,
            "notes": self.notes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_peak_at": self.timeline.peak_step,
            "timeline": self.timeline.as_records(),
        }


def graph_fingerprint(joint: fx.GraphModule) -> str:
    return hashlib.sha256(joint.code.encode()).hexdigest()[:12]


@dataclasses.dataclass
class _Context:
    """What every solver's plan is built from: the prepared joint graph and its classes."""

    joint: fx.GraphModule
    classes: NodeClasses
    num_fwd_outputs: int
    static_nodes: set[fx.Node]
    options: Options
    graph_id: str
    by_name: dict[str, fx.Node]
    input_names: set[str]
    banned: dict[str, str]
    costs: dict[fx.Node, float] | None = None  # each op's estimated seconds (``_linearize``)
    problem: mincut.MinCutProblem | None = None  # the traffic-optimal min-cut problem (``_knapsack_search``)


def partition(
    joint: fx.GraphModule,
    joint_inputs: Any,
    *,
    num_fwd_outputs: int,
    options: Options,
    static_lifetime_input_indices: list[int] | None = None,
    **_: Any,
) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    started = time.perf_counter()
    joint.graph.eliminate_dead_code()
    joint.recompile()
    joint = _compat.cse(joint)
    joint.recompile()
    _compat.force_save_special_ops(joint)
    graph_id = graph_fingerprint(joint)
    _warn_on_checkpoint_preferences(joint, graph_id)
    classes = classify(joint, num_fwd_outputs)
    problem, banned = mincut_problem(joint, classes)
    solution = mincut.solve(problem)
    by_name = {n.name: n for n in joint.graph.nodes}
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and _compat.is_primal(n)]
    ctx = _Context(joint, classes, num_fwd_outputs,
                   {primals[i] for i in (static_lifetime_input_indices or []) if i < len(primals)},
                   options, graph_id, by_name, {n.name for n in classes.inputs}, banned, problem=problem)
    chosen = [by_name[name] for name in problem.nodes if name in solution.saved]  # graph order: reproducible
    fwd, bwd, _ = _extract_placed(ctx, chosen)
    plan = _plan(ctx, "mincut", fwd, bwd, chosen, solution.cost)
    budget = options.memory_budget.resolve(plan.predicted_peak_bytes) if options.memory_budget else None
    plan.budget_bytes = budget
    over = budget is not None and plan.predicted_peak_bytes > budget
    if options.solver == "mincut" and over:
        raise BudgetError(_budget_message(plan, options, plan.predicted_peak_bytes, "min-cut (solver='mincut')"))
    target = budget if budget is not None else plan.predicted_peak_bytes
    # Planning builds many candidate graphs: their Python code is made only for the one
    # that runs.
    staged = options.solver in MAX_STAGES  # a staged solver was asked for
    if staged or over:
        mincut_result = fwd, bwd, plan
        try:
            with _compat.lazy_graph_modules():
                if options.solver == "knapsack":
                    fwd, bwd, plan = _knapsack(ctx, target)
                    plan.notes["why"] = (f"solver='knapsack' was asked for; giving up "
                                         f"{len(plan.notes['given_up'])} values fits")
                elif staged:
                    cuts = _cuts(ctx, bwd, chosen) if over and options.solver in CHAIN_SOLVERS else \
                        [("traffic", ctx, bwd, chosen)]
                    (fwd, bwd, plan), cuts_why = _fastest_over_cuts(
                        cuts, lambda c, b, s: _staged(c, b, s, target, options.solver))
                    plan.notes["why"] = f"solver={options.solver!r} was asked for{cuts_why}"
                else:
                    fwd, bwd, plan = _auto(ctx, bwd, chosen, target, plan.predicted_peak_bytes)
        except BudgetError as error:
            unconstrained = mincut_result[2].predicted_peak_bytes
            if error.least_bytes is None or error.least_bytes < UNTRADEABLE * unconstrained:
                raise
            fwd, bwd, plan = _unreachable(ctx, options, *mincut_result, error)
    else:
        plan.notes["why"] = ("no budget: the min-cut plan" if budget is None else
                             f"the min-cut plan fits the budget ({_fmt(plan.predicted_peak_bytes)} <= {_fmt(budget)})")
    plan.forward_code, plan.backward_code = plan.forward_code or fwd.code, plan.backward_code or bwd.code
    mark_predicted_levels(fwd, bwd, plan.timeline)
    plan.solve_seconds = time.perf_counter() - started
    return fwd, bwd, plan


def mark_predicted_levels(fwd: fx.GraphModule, bwd: fx.GraphModule, timeline: Timeline) -> None:
    """Put on each node of the graphs that run the predicted live bytes while it runs
    and the predicted peak (``_compat.LIVE_BYTES_KEY``): the bound within which
    Inductor may hold a dead buffer for reuse (``_compat.install_planned_reuse_bound``)."""
    level = {(step.phase, step.name): live for step, live in zip(timeline.steps, timeline.live_bytes)}
    for phase, gm in (("forward", fwd), ("backward", bwd)):
        for node in gm.graph.nodes:
            live = level.get((phase, node.name))
            if live is not None:
                node.meta[_compat.LIVE_BYTES_KEY] = (live, timeline.peak_bytes)


def _unreachable(ctx: _Context, options: Options, fwd: fx.GraphModule, bwd: fx.GraphModule, plan: Plan,
                 error: BudgetError) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    """The min-cut plan is about this graph's least-memory plan: no recomputing plan
    predicts less than ``UNTRADEABLE`` of it (a loss graph: the logits and their gradient
    are the peak whatever is saved).
    A fraction budget cannot apply to such a graph, which keeps its plan with a warning
    (the model's other graphs get the fraction); a byte budget below it is an error that
    names the min-cut plan's peak as the minimum."""
    least = plan.predicted_peak_bytes
    if options.memory_budget.fraction is None:
        raise BudgetError(
            f"fxremat: memory_budget={options.memory_budget.describe(plan.budget_bytes)} is below the "
            f"minimum feasible budget for graph {ctx.graph_id}: no plan that recomputes predicts less than "
            f"{_fmt(error.least_bytes)}, and the min-cut plan predicts {_fmt(least)}. Allowed: a budget of at least "
            f"{min(least, error.least_bytes)} bytes.", min(least, error.least_bytes))
    why = (f"no plan predicts much less than the min-cut plan ({_fmt(least)}; recomputing plans "
           f"{_fmt(error.least_bytes)} or more), so memory_budget={options.memory_budget.describe()} cannot apply "
           f"to this graph: it keeps the min-cut plan")
    warnings.warn(f"fxremat (graph {ctx.graph_id}): {why}. A fraction applies to each compiled graph on its "
                  f"own; the model's other graphs get it. A byte budget applies to every graph.",
                  BudgetWarning, stacklevel=2)
    plan.notes["why"] = why
    plan.notes["budget_unreachable"] = True
    return fwd, bwd, plan


def _auto(ctx: _Context, mincut_bwd: fx.GraphModule, mincut_saved: list[fx.Node], budget: int,
          mincut_peak: int) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    """solver="auto" over budget: Rotor, which is optimal on chains of stages. When the
    stages form a DAG (values skip stages, as in a U-Net) and it is small enough for
    Checkmate's ILP, Checkmate plans it too -- it may free and recompute a skipped
    value where Rotor carries it -- and the plan with the smaller estimated time wins.
    Then the knapsack (``_staged_or_knapsack``), which gives up single values where the staged
    solvers drop whole stages, and the faster estimate of the two wins."""
    why = f"the min-cut plan ({_fmt(mincut_peak)}) is over the budget ({_fmt(budget)})"
    knapsack_found, probes = _knapsack_search(ctx, budget)
    cuts = _cuts(ctx, mincut_bwd, mincut_saved)
    if KNAPSACK_CUT:
        # Rotor also plans around the knapsack's saved set (its plan, or the probe that
        # predicted least): a stage kept whole then holds no attention scores.
        base = knapsack_found or min(probes, key=lambda p: p[2].predicted_peak_bytes)
        if base[2].notes["given_up"]:
            kept = {d["name"] for d in base[2].saved}
            cuts.append(("knapsack", dataclasses.replace(ctx, banned=base[2].banned), base[1],
                         [n for n in ctx.joint.graph.nodes if n.name in kept]))
    try:
        staged, cuts_why = _fastest_over_cuts(cuts, lambda c, b, s: _staged(c, b, s, budget, "rotor"))
        staged, staged_why = _with_checkmate(ctx, staged, mincut_bwd, mincut_saved, budget)
        why += f"{cuts_why}; {staged_why}"
    except BudgetError as error:
        staged, why = error, f"{why}; Rotor found no plan within it"
    winner, lighter_why = _staged_or_knapsack(ctx, staged, knapsack_found, probes, budget)
    winner[2].notes["why"] = f"{why}; {lighter_why}"
    return winner


def _with_checkmate(ctx: _Context, rotor_result: tuple, mincut_bwd: fx.GraphModule, mincut_saved: list[fx.Node],
                    budget: int) -> tuple[tuple[fx.GraphModule, fx.GraphModule, Plan], str]:
    """Rotor's plan, or Checkmate's where the stages form a small DAG and its plan is
    estimated faster; and why."""
    from . import stage_graph

    lin, cost = _linearize(ctx, mincut_bwd, mincut_saved, AUTO_CHECKMATE_MAX_STAGES)
    skips = stage_graph.build(lin, cost, ctx.input_names).skips if lin.stages else 0
    if skips == 0 or len(lin.stages) > AUTO_CHECKMATE_MAX_STAGES:
        shape = ("a chain of stages" if skips == 0 else
                 f"a DAG that does not merge into {AUTO_CHECKMATE_MAX_STAGES} stages or fewer (Checkmate's ILP "
                 f"would be slow to compile; ask for solver='checkmate' to use it)")
        return rotor_result, f"the graph is {shape}: Rotor"
    try:
        checkmate_result = _staged(ctx, mincut_bwd, mincut_saved, budget, "checkmate",
                                   max_stages=AUTO_CHECKMATE_MAX_STAGES)
    except BudgetError:
        checkmate_result = None
    r = rotor_result[2].cut_cost
    c = checkmate_result[2].cut_cost if checkmate_result else float("inf")
    winner = checkmate_result if c < r else rotor_result
    return winner, (f"the stages form a DAG ({skips} skip edges): Rotor and Checkmate both planned it, estimated "
                    f"{r * 1e3:.3f} ms and {'no plan' if checkmate_result is None else f'{c * 1e3:.3f} ms'}: "
                    f"{winner[2].solver}")


# Bans a budget may lift: the op is deterministic, and the traffic-optimal cut bans it
# only because recomputing it costs time (a matmul) or saves no traffic.
TRADEABLE_BANS = ("compute_intensive", "unfusible", "unfusible_backward_user", "small_reduction")
KNAPSACK_CUT = True  # solver="auto": Rotor also plans around the knapsack's saved set
KNAPSACK_BOUND = True  # skip building probes whose saved values alone are over the budget (same plans)


def _knapsack(ctx: _Context, budget: int) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    """The min-cut plan with values given up (passes/knapsack.py): ranked by recompute
    time per byte, a prefix of the values whose bans may be lifted must be recomputed
    in the backward, the traffic-optimal cut is solved again, and each recomputation
    is placed just before its first use. The shortest prefix whose predicted peak fits
    the budget. Where Rotor drops a whole stage (an attention block's QKV projection
    with its scores), this drops single values (the scores alone)."""
    found, probes = _knapsack_search(ctx, budget)
    if found is None:
        least = min(probe[2].predicted_peak_bytes for probe in probes)
        candidates = probes[0][2].notes["candidates"]
        raise _below_minimum(ctx, budget, least, f"the least-memory plan that gives up values ({candidates} may be "
                             f"recomputed)", below="what the knapsack reaches",
                             alternative="; or solver='auto' or 'rotor', which recompute whole stages")
    return found


def _knapsack_search(ctx: _Context, budget: int) -> tuple[tuple | None, list[tuple]]:
    """``_knapsack``'s plan (None when no probe fits), and every plan it probed."""
    from .passes import knapsack

    problem, banned = ctx.problem, ctx.banned
    cost = _costs(ctx)
    # Every value whose ban may be lifted, saved or not: giving up a saved softmax output
    # makes the cut save the (banned) scores it is computed from instead, which frees
    # nothing until the scores are given up too.
    items = knapsack.rank([knapsack.Item(n.name, cost.get(n, 0.0), node_bytes(n)) for n in ctx.joint.graph.nodes
                           if banned.get(n.name) in TRADEABLE_BANS and node_bytes(n) > 0])
    cuts: dict[int, tuple[list[fx.Node], int] | None] = {}  # in the order asked
    built: dict[int, tuple] = {}

    def cut(k: int) -> tuple[list[fx.Node], int] | None:
        """The saved set with the first ``k`` items given up, and the bytes it hands over
        (a lower bound of its plan's peak); None when that cut is infeasible."""
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
            saved = [ctx.by_name[name] for name in problem.nodes if name in solution.saved]
            cuts[k] = saved, handed_over_bytes(saved, ctx.input_names)
        return cuts[k]

    def build(k: int) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
        if k not in built:
            saved = cut(k)[0]
            fwd, bwd, fwd_names = _extract_placed(ctx, saved)
            mark_recomputation_windows(bwd, fwd_names)
            lifted = {item.name for item in items[:k]}
            plan = dataclasses.replace(_plan(ctx, "knapsack", fwd, bwd, saved, 0.0, with_code=False),
                                       banned={name: why for name, why in banned.items() if name not in lifted})
            plan.budget_bytes = budget
            plan.notes = {"given_up": [item.name for item in items[:k]], "candidates": len(items)}
            built[k] = fwd, bwd, plan
        return built[k]

    def fits(k: int) -> bool:
        # Extracting and predicting a plan is the expensive part: skipped when the saved
        # values alone are over the budget.
        if cut(k) is None or (KNAPSACK_BOUND and cut(k)[1] > budget):
            return False
        return build(k)[2].predicted_peak_bytes <= budget

    k = knapsack.least_prefix(len(items), fits)
    if k is not None:
        found = build(k)
        found[2].cut_cost = _estimate(ctx, *found[:2])  # estimated only once found: most probes do not fit
        return found, [built[j] for j in cuts if j in built]
    # None fits: the probe that predicts least is still wanted (the error names it, Rotor plans
    # around its saved set). Build the skipped ones while their bound is under the least so far.
    least = min((plan.predicted_peak_bytes for *_, plan in built.values()), default=None)
    for j in sorted((j for j in cuts if cuts[j] is not None and j not in built), key=lambda j: cuts[j][1]):
        if least is not None and KNAPSACK_BOUND and cuts[j][1] > least:
            break
        peak = build(j)[2].predicted_peak_bytes
        least = peak if least is None else min(least, peak)
    return None, [built[j] for j in cuts if j in built]


def _estimate(ctx: _Context, fwd: fx.GraphModule, bwd: fx.GraphModule) -> float:
    """The cost model's seconds for a step of the planned graphs (``costmodel.estimate_step``,
    the model that costs Rotor's stages): one yardstick for plans of different solvers."""
    from . import costmodel

    device = _graph_device(ctx.joint)
    timer = costmodel.OpTimer(device) if ctx.options.cost_model == "measured" else None
    return costmodel.estimate_step(fwd, bwd, device, timer=timer).total_s


def _staged_or_knapsack(ctx: _Context, staged: tuple | BudgetError, knapsack_result: tuple | None, probes: list[tuple],
             budget: int) -> tuple[tuple[fx.GraphModule, fx.GraphModule, Plan], str]:
    """The staged solvers' plan (or their BudgetError: none fits), or the knapsack's
    (``_knapsack``) when that one fits with a smaller estimated step time
    (``_estimate``): near the min-cut plan's peak, giving up a few values beats
    dropping whole stages; and why. When neither fits, raises the BudgetError that
    names the lower minimum."""
    staged_failed = isinstance(staged, BudgetError)
    if knapsack_result is None:
        if staged_failed:
            least = min(probe[2].predicted_peak_bytes for probe in probes)
            if staged.least_bytes is None or least < staged.least_bytes:
                raise _below_minimum(ctx, budget, least, "Rotor found no plan within it, and the knapsack's "
                                     "least-memory plan")
            raise staged
        return staged, f"the knapsack found no plan within the budget: {staged[2].solver}"
    k = knapsack_result[2].cut_cost
    knapsack_result[2].notes["estimated_step_s"] = k
    given_up = (f"the knapsack (giving up {len(knapsack_result[2].notes['given_up'])} values) is estimated "
                f"{k * 1e3:.3f} ms")
    if staged_failed:
        return knapsack_result, f"{given_up}: knapsack"
    s = _estimate(ctx, staged[0], staged[1])
    staged[2].notes["estimated_step_s"] = s
    winner = staged if s <= k else knapsack_result
    return winner, f"{given_up} against {staged[2].solver}'s {s * 1e3:.3f} ms: {winner[2].solver}"


def _cuts(ctx: _Context, mincut_bwd: fx.GraphModule, mincut_saved: list[fx.Node]) -> list[tuple]:
    """The saved sets a chain solver plans around when the min-cut plan is over the
    budget: the traffic-optimal one, and the lean one (fewest bytes, ``mincut_problem``)
    when it differs. A stage Rotor keeps whole holds its part of the saved set: the lean
    one costs some recomputation in the stage's backward but lets more stages be kept.
    Each: (label, context, backward graph of the min-cut plan, saved nodes)."""
    cuts = [("traffic", ctx, mincut_bwd, mincut_saved)]
    if not LEAN_CUT:
        return cuts
    problem, banned = mincut_problem(ctx.joint, ctx.classes, lean=True)
    solution = mincut.solve(problem)
    saved = [ctx.by_name[name] for name in problem.nodes if name in solution.saved]
    if set(saved) != set(mincut_saved):
        _, bwd = _extract(ctx, saved)
        _costs(ctx)  # one cost model for every cut
        cuts.append(("lean", dataclasses.replace(ctx, banned=banned), bwd, saved))
    return cuts


def _fastest_over_cuts(cuts: list[tuple], plan_one) -> tuple[tuple[fx.GraphModule, fx.GraphModule, Plan], str]:
    """``plan_one(context, backward, saved)`` around each cut of ``_cuts``: the plan with the
    least estimated time (the chain solvers' makespans share one cost model; the first on
    ties), and what each cut gave, for the plan's ``why`` ("" for one cut). Raises the
    BudgetError naming the least minimum when no cut has a plan within the budget."""
    found, errors = [], []
    for label, context, bwd, saved in cuts:
        try:
            result = plan_one(context, bwd, saved)
        except BudgetError as error:
            errors.append(error)
            continue
        result[2].notes["saved_set"] = label
        found.append((label, result))
    if not found:
        raise min(errors, key=lambda e: e.least_bytes if e.least_bytes is not None else float("inf"))
    label, best = min(found, key=lambda f: f[1][2].cut_cost)
    if len(cuts) == 1:
        return best, ""
    estimates = ", ".join(f"{lab} {res[2].cut_cost * 1e3:.3f} ms" for lab, res in found)
    failed = "".join(f"; {lab}: no plan within the budget" for lab, *_ in cuts if lab not in dict(found))
    names = {"traffic": "the traffic-optimal", "lean": "the lean (fewest bytes)", "knapsack": "the knapsack's"}
    sets = [names.get(lab, lab) for lab, *_ in cuts]
    return best, (f"; planned around {', '.join(sets[:-1])} and {sets[-1]} saved sets, "
                  f"estimated {estimates}{failed}: {label}")


def _extract(ctx: _Context, saved: list[fx.Node], backward_template: bool = False
             ) -> tuple[fx.GraphModule, fx.GraphModule]:
    tuples = [n.name for n in saved if is_multi_output(n)]
    if tuples:  # torch's extractor would make them forward outputs, which Inductor rejects
        raise AssertionError(f"fxremat bug: saved values {tuples} are tuples (multi-output ops): save their items")
    return _compat.extract_fwd_bwd_modules(
        ctx.joint, [n for n in saved if not _compat.is_sym_node(n)], [n for n in saved if _compat.is_sym_node(n)],
        num_fwd_outputs=ctx.num_fwd_outputs, static_lifetime_input_nodes=ctx.static_nodes,
        backward_template=backward_template)


def _extract_placed(ctx: _Context, saved: list[fx.Node]) -> tuple[fx.GraphModule, fx.GraphModule, set[str]]:
    """The forward and backward graphs of a saved set, each recomputation placed just
    before its first use; and the names of the forward's ops (what counts as recomputed)."""
    fwd, bwd = _extract(ctx, saved)
    fwd_names = {n.name for n in fwd.graph.nodes if n.op == "call_function"}
    bwd = place_recomputations(bwd, fwd_names | {n.name for n in ctx.classes.forward})
    return fwd, bwd, fwd_names


def _plan(ctx: _Context, solver: str, fwd: fx.GraphModule, bwd: fx.GraphModule, saved: list[fx.Node],
          cut_cost: float, recomputed: list[dict] | None = None, with_code: bool = True, **extra: Any) -> Plan:
    bwd_inputs = {n.name for n in bwd.graph.find_nodes(op="placeholder")}
    saved_final = [n for n in saved if n.name in bwd_inputs and not _compat.is_sym_node(n)]  # torch drops unused
    saved_sym = [n for n in saved if n.name in bwd_inputs and _compat.is_sym_node(n)]
    _check_no_aliasing(saved_final, ctx.input_names)
    fwd_names = {n.name for n in fwd.graph.nodes if n.op == "call_function"}
    if recomputed is None:
        recomputed = [{"name": n.name, "op": str(n.target)} for n in bwd.graph.nodes
                      if n.op == "call_function" and n.name in fwd_names]
    inductor = ctx.options.compiler == "inductor"
    timeline = predict(fwd, bwd, ctx.num_fwd_outputs, relaid_inputs(fwd) if inductor else set(), fusion=inductor,
                       hold_outputs=ctx.options.hold_outputs)
    return Plan(
        graph_id=ctx.graph_id,
        solver=solver,
        saved=[describe(n) for n in saved_final + saved_sym],
        saved_activation_bytes=storage_bytes(saved_final, ctx.input_names),
        recomputed=recomputed,
        banned=ctx.banned,
        cut_cost=cut_cost,
        timeline=timeline,
        budget_bytes=None,
        forward_code=fwd.code if with_code else "",  # candidates: filled in for the plan chosen
        backward_code=bwd.code if with_code else "",
        **extra,
    )


# What a staged solver gives the common search: its operation sequence (Rotor's
# operations over the linearization's stages), its cost in the cost model's seconds,
# and the values its forward phase leaves in memory.
_Candidate = tuple  # (sequence: list[rotor.Op], makespan: float, kept: list[fx.Node])

# Stages each solver plans over at most (the linearization merges the rest). The
# Checkmate ILP has O(n^2) binaries for n = 3 x stages nodes; beyond its limit (or a
# linearization that did not get down to it) it falls back to two-phase LP rounding.
MAX_STAGES = {"rotor": 64, "rotor_exact": 24, "checkmate": 16, "twremat": 32}
CHAIN_SOLVERS = ("rotor", "rotor_exact")  # merge by time plus memory (chain.linearize's weigh_memory)
CHECKMATE_ILP_MAX_STAGES = MAX_STAGES["checkmate"]  # the merge gets there unless it cannot
# Each ILP solve stops after this many branch-and-bound nodes: the same incumbent on any
# machine, so the same plan (a wall-clock limit stopped the U-Net's solves at different
# incumbents under load). The time limit is only a safety net; stopping early (either
# way) is noted in the plan.
CHECKMATE_NODE_LIMIT = 500
CHECKMATE_TIME_LIMIT = 120.0
LEAST_LADDER = 4  # model budgets probed above the least one when its plan does not fit
AUTO_CHECKMATE_MAX_STAGES = 8  # solver="auto" tries Checkmate's ILP only on DAGs this small (fast)


def _differentiable_inputs(ctx: _Context) -> set[fx.Node] | None:
    """The primals that get a gradient (the joint's gradient outputs are one per primal,
    None where there is none); None if that correspondence does not hold."""
    primals = [n for n in ctx.joint.graph.nodes if n.op == "placeholder" and _compat.is_primal(n)]
    grads = ctx.classes.bwd_outputs
    if len(grads) != len(primals):
        return None
    return {p for p, g in zip(primals, grads) if g is not None}


def _linearize(ctx: _Context, mincut_bwd: fx.GraphModule, mincut_saved: list[fx.Node], max_stages: int,
               weigh_memory: bool = False):
    """The joint graph's chain of stages (fxremat/chain.py) around the min-cut plan, and
    each op's estimated seconds (``costmodel.node_costs``: Inductor-like kernels on the
    device the graph runs on), which cost the stages. ``weigh_memory``: stages of
    similar time plus memory, for the chain solvers (``chain.linearize``)."""
    from . import chain

    in_backward = {n.name for n in mincut_bwd.graph.nodes if n.op == "call_function"}
    backward = [n for n in ctx.joint.graph.nodes if n.name in in_backward]
    cost = _costs(ctx)
    lin = chain.linearize(ctx.joint, ctx.classes.forward, ctx.classes.required_forward, ctx.input_names, backward,
                          set(mincut_saved), cost, max_stages=max_stages, differentiable=_differentiable_inputs(ctx),
                          weigh_memory=weigh_memory)
    return lin, cost


def _costs(ctx: _Context) -> dict[fx.Node, float]:
    """Each op's estimated seconds, found once per graph (solver="auto" linearizes more
    than once, around more than one saved set)."""
    from . import costmodel

    if ctx.costs is None:
        device = _graph_device(ctx.joint)
        timer = costmodel.OpTimer(device) if ctx.options.cost_model == "measured" else None
        ctx.costs = costmodel.node_costs(ctx.joint, device, timer)
    return ctx.costs


def _graph_device(joint: fx.GraphModule) -> str:
    for n in joint.graph.find_nodes(op="placeholder"):
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return "cuda"
    return "cpu"


def _staged(ctx: _Context, mincut_bwd: fx.GraphModule, mincut_saved: list[fx.Node], budget: int,
            solver: str, max_stages: int | None = None) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
    """The fastest plan of ``solver`` ("rotor", "rotor_exact", "checkmate", "twremat") over the
    linearization's stages whose predicted peak fits ``budget`` (fxremat/chain.py,
    fxremat/stage_graph.py)."""
    from . import chain, stage_graph
    from .passes import checkmate, rotor, twremat
    from .passes.schedule import memory_lower_bound, no_remat, simulate

    joint, classes = ctx.joint, ctx.classes
    lin, cost = _linearize(ctx, mincut_bwd, mincut_saved, max_stages or MAX_STAGES[solver],
                           weigh_memory=solver in CHAIN_SOLVERS)
    # Memory outside the chain, counted as alive throughout (an upper bound): the
    # forward's outputs, the parameter gradients (Rotor's chain counts those its stages
    # make), the tangents and the pinned values.
    gradients = [n for n in classes.bwd_outputs if isinstance(n, fx.Node)]
    outside = (storage_bytes([n for n in classes.fwd_outputs if isinstance(n, fx.Node)], ctx.input_names)
               + sum(node_bytes(n) for n in gradients)
               + sum(node_bytes(n) for n in joint.graph.nodes if _compat.is_tangent(n))
               + storage_bytes(lin.pinned, ctx.input_names))
    syms = [n for n in mincut_saved if _compat.is_sym_node(n)]
    notes: dict[str, Any] = {"stages": len(lin.stages), "pinned_bytes": storage_bytes(lin.pinned, ctx.input_names),
                             "cost_model": ctx.options.cost_model}

    def build(candidate: _Candidate) -> tuple[fx.GraphModule, fx.GraphModule, Plan]:
        sequence, makespan, kept_values = candidate
        # Keep storages, not views (views are made again where read; see _check_no_aliasing).
        kept = {n if storage_of(n) in ctx.input_names else (storage_node(n) or n) for n in kept_values + lin.pinned}
        # Save what the backward reads of what the sequence keeps (kept values no op
        # reads are not saved), the step inputs it reads, and the symbolic sizes.
        reads, alive = chain.backward_reads(joint, lin, sequence, gradients)
        missing = sorted(n.name for n in reads if n.op != "placeholder" and (n not in kept or n in lin.free))
        if missing:
            raise KeyError(f"fxremat {solver}: the backward reads {missing}, which the forward does not keep")
        saved = [n for n in joint.graph.nodes if n in syms or (n in reads and (n in kept or _compat.is_primal(n)))]
        fwd, template = _extract(ctx, saved, backward_template=True)
        bwd, recomputed, _ = chain.emit_backward(template, joint, lin, sequence, classes.bwd_outputs, alive)
        plan = _plan(ctx, solver, fwd, bwd, saved, makespan, recomputed, with_code=False,
                     sequence=rotor.format_sequence(sequence), stages=len(lin.stages))
        plan.budget_bytes = budget
        plan.notes = dict(notes)
        return fwd, bwd, plan

    built: dict[str, tuple] = {}  # sequence -> build(): nearby model budgets share plans

    def make(candidate: _Candidate | None):
        if candidate is None:
            return None
        key = rotor.format_sequence(candidate[0])
        if key not in built:
            built[key] = (candidate, build(candidate))
        return built[key]

    def fits(found) -> bool:
        return found is not None and found[1][2].predicted_peak_bytes <= budget

    def too_small(least) -> BudgetError:
        return _below_minimum(ctx, budget, least[1][2].predicted_peak_bytes,
                              f"the least-memory {solver} plan ({len(lin.stages)} stages)")

    if solver == "twremat":
        # TWRemat has no budget: its parameter k trades memory for time. Keep the
        # cheapest k whose plan's predicted peak fits.
        graph = stage_graph.build(lin, cost, ctx.input_names, tied=False)
        prepared = twremat.TWRemat(graph.problem)
        ks = sorted({1 << e for e in range(max(prepared.bags, 1).bit_length() + 1)} | {prepared.bags + 1})
        found_all = []
        for k in ks:
            computes = prepared.computes(k)
            sol = simulate(graph.problem, stage_graph.from_computes(graph.problem, computes))
            found_all.append(make((stage_graph.to_sequence(graph, computes), sol.total_cost,
                                   stage_graph.kept_after_forward(graph, computes))))
            notes.setdefault("twremat_k", {})[k] = found_all[-1][1][2].predicted_peak_bytes
        fitting = [f for f in found_all if fits(f)]
        if not fitting:
            raise too_small(min(found_all, key=lambda f: f[1][2].predicted_peak_bytes))
        return min(fitting, key=lambda f: f[0][1])[1]

    if solver in ("rotor", "rotor_exact"):
        # The chain counts the gradients its stages make from when they are made.
        in_chain = chain.gradients_in_chain(lin, gradients)
        rchain = chain.rotor_chain(lin, cost, ctx.input_names, in_chain)
        outside -= sum(node_bytes(g) for g in in_chain)
        # rotor_exact: the weakly persistent DP (Algorithm 1), exact over all sequences
        # that keep a stage's input until its backward ran, O(L^4 S): fewer stages.
        persistent = solver == "rotor"

        def solve_at(model_budget: float) -> _Candidate | None:
            try:
                solution = rotor.solve(rchain, model_budget, persistent=persistent)
            except rotor.InfeasibleBudget:
                return None
            return solution.sequence, solution.makespan, chain.kept_after_forward(lin, solution.sequence)

        # A chain whose every byte lives outside it (one linear layer) needs a budget of 0,
        # which the DP does not take: ask for one byte.
        least_model = max(rotor.min_budget(rchain, persistent=persistent), 1.0)
        most_model = max(  # keeps every stage: more never helps
            rotor.solve(rchain, 1e30, persistent=persistent).peak, least_model)
        slack = (1.0001, 1.01, 1.03, 1.1)  # the DP rounds sizes up into bins
    else:  # checkmate
        graph = stage_graph.build(lin, cost, ctx.input_names, tied=True)
        use_ilp = len(lin.stages) <= CHECKMATE_ILP_MAX_STAGES
        notes["checkmate_method"] = "ilp" if use_ilp else "lp-rounding"
        notes["skip_edges"] = graph.skips

        def solve_at(model_budget: float) -> _Candidate | None:
            try:
                if use_ilp:
                    sol = checkmate.solve(graph.problem, model_budget, time_limit=CHECKMATE_TIME_LIMIT,
                                          node_limit=CHECKMATE_NODE_LIMIT,
                                          report_min_budget=False)
                else:
                    sol = checkmate.solve_lp(graph.problem, model_budget, time_limit=CHECKMATE_TIME_LIMIT)
            except checkmate.NoScheduleFound:
                return None
            if sol.stopped_early:
                notes["checkmate_stopped_early"] = notes.get("checkmate_stopped_early", 0) + 1
                notes["checkmate_worst_gap"] = max(notes.get("checkmate_worst_gap", 0.0), sol.gap)
            computes = [op.node for op in sol.schedule if op.kind == "compute"]
            return (stage_graph.to_sequence(graph, computes), sol.cost,
                    stage_graph.kept_after_forward(graph, computes))

        lower, upper, _ = checkmate.min_budget(graph.problem, time_limit=CHECKMATE_TIME_LIMIT,
                                               node_limit=CHECKMATE_NODE_LIMIT)
        least_model = upper if upper is not None else max(lower, memory_lower_bound(graph.problem))
        most_model = simulate(graph.problem, no_remat(graph.problem)).peak_bytes
        slack = (1.0, 1.01, 1.05, 1.2)

    least = None
    for factor in slack:
        least = make(solve_at(least_model * factor))
        if least is not None:
            least_model *= factor
            break
    if least is None:
        raise BudgetError(f"fxremat: {solver} found no plan for graph {ctx.graph_id} at any budget "
                          f"(its least-memory model budget is {_fmt(int(least_model))}); try solver='rotor'.")
    if not fits(least):
        # The model is an upper bound of the predicted timeline, and not a monotone one:
        # a plan at a somewhat larger model budget can predict less (it keeps a value
        # the least-memory plan recomputes next to a larger one). Probe a ladder of
        # model budgets before calling the budget infeasible; the least predicted of
        # all probes is the minimum feasible budget the error names.
        probes = [least]
        for k in range(1, LEAST_LADDER + 1):
            model_budget = least_model * (most_model / least_model) ** (k / (LEAST_LADDER + 1))
            found = make(solve_at(model_budget))
            if found is not None:
                probes.append(found)
                if fits(found):
                    least, least_model = found, model_budget
                    break
        if not fits(least):
            raise too_small(min(probes, key=lambda f: f[1][2].predicted_peak_bytes))
    # The solvers' models are upper bounds of the predicted timeline, not the timeline
    # itself, so search the model budget: the largest one whose plan's *predicted*
    # peak fits. A larger model budget never gives a slower plan, so that plan is the
    # fastest the search sees; keep the fastest fitting plan found on the way.
    best, lo, hi = least, least_model, most_model  # lo's plan fits
    top = make(solve_at(most_model))
    if fits(top):
        return top[1]
    # Guess where the predicted peak meets the budget from the model's overstatement at
    # the last probe, then bisect what is left; stop at 2% apart. A guess that overshot
    # or gave a plan already seen is followed by a bisection step: guessing again from
    # the same plan lands a hair lower each time and never gets away from it (the
    # 12-layer transformer at 0.25 spent every step that way and kept a 2.4x slower plan).
    last, last_model, guessing = least, least_model, True
    for _ in range(8):
        if hi <= lo * 1.02:
            break
        overstatement = last[1][2].predicted_peak_bytes / max(last_model + outside, 1.0)
        guess = budget / overstatement - outside
        guessed = guessing and lo < guess < hi
        mid = guess if guessed else ((lo + hi) / 2 if hi < 4 * lo else (lo * hi) ** 0.5)
        seen = len(built)
        found = make(solve_at(mid))
        if fits(found):
            lo = mid
            if found[0][1] < best[0][1]:
                best = found
        else:
            hi = mid
        # After a bisection, guess again; after a guess, only if it fitted with a new plan.
        guessing = not guessed or (fits(found) and len(built) > seen)
        if found is not None:
            last, last_model = found, mid
    return best[1]


def _warn_on_checkpoint_preferences(joint: fx.GraphModule, graph_id: str) -> None:
    """torch.utils.checkpoint regions mark their ops PREFER_RECOMPUTE (selective policies may
    say PREFER_SAVE); fxremat plans the whole graph itself and follows only the MUST_* marks."""
    count = sum(_compat.is_prefer_policy(n) for n in joint.graph.nodes)
    if count:
        warnings.warn(
            f"fxremat (graph {graph_id}): {count} ops carry torch.utils.checkpoint PREFER_* marks; fxremat "
            "chooses what to recompute itself and does not follow them (MUST_SAVE / MUST_RECOMPUTE marks from "
            "selective checkpoint policies are followed). Remove the checkpoint wrappers to silence this.",
            stacklevel=2,
        )


def _check_no_aliasing(saved: list[fx.Node], input_names: set[str]) -> None:
    seen: dict[str, str] = {}
    for node in saved:
        base = storage_of(node)
        if base is None or base in input_names:
            continue
        if base in seen:
            raise AssertionError(f"fxremat bug: saved tensors {seen[base]} and {node.name} share a storage")
        seen[base] = node.name


def _below_minimum(ctx: _Context, budget: int, least_bytes: int, least_plan: str,
                   below: str = "the minimum feasible budget", alternative: str = "") -> BudgetError:
    """The error for a budget below what the solvers reach: ``least_plan`` (what predicted
    ``least_bytes``) and the budget that works, in bytes and, when the budget was asked
    as a fraction, as a fraction; then ``alternative`` (another solver that goes lower)."""
    asked = ctx.options.memory_budget
    per_graph = ""
    if asked is not None and asked.fraction is not None:
        # A fraction is of each graph's own unconstrained plan; a model split by a
        # graph break (a loss computed apart) may have a graph that cannot reach it.
        least_fraction = least_bytes * asked.fraction / max(budget, 1)
        per_graph = (f", or a fraction of at least {least_fraction:.3f} (a fraction applies to each compiled "
                     f"graph on its own; a byte budget applies to each graph too, and a small graph such as a "
                     f"loss computed after a graph break meets it easily)")
    return BudgetError(
        f"fxremat: {f'memory_budget={asked.describe(budget)}' if asked else f'a budget of {_fmt(budget)}'}"
        f" is below {below} for graph {ctx.graph_id}: {least_plan} predicts {_fmt(least_bytes)}. "
        f"Allowed: a budget of at least {least_bytes} bytes{per_graph}{alternative}.", least_bytes)


def _budget_message(plan: Plan, options: Options, least: int, solvers: str) -> str:
    return (
        f"fxremat: memory_budget={options.memory_budget.describe(plan.budget_bytes)} cannot be met "
        f"for graph {plan.graph_id} by {solvers}: its predicted peak is {_fmt(least)} (saved activations "
        f"{_fmt(plan.saved_activation_bytes)}). Allowed: a budget of at least {least} bytes, or solver='auto' "
        f"or 'rotor', which recompute further."
    )


_fmt = format_bytes
