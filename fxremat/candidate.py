"""A candidate plan (``Candidate``: forward graph, backward graph, ``Plan``) and what
every strategy builds one from (``Context``): the prepared joint graph, its classes and
the traffic-optimal min-cut problem."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

import torch.fx as fx

from . import _compat, lite
from .fx_passes import keep_products_apart, place_recomputations, return_inputs_as_given
from .joint import NodeClasses, graph_device, recomputed_entry
from .options import Options
from .passes import mincut
from .plans import Plan
from .sizes import alive_at_backward_bytes, describe, held_outputs, is_multi_output, storage_bytes, storage_of
from .timeline import predict, relaid_inputs
from .workspace import scratch_model

log = logging.getLogger("fxremat")  # TORCH_LOGS="fxremat" (or logging) shows it
PROGRESS_AFTER_S = 3.0  # planning that has taken this long says what it does at INFO, before at DEBUG


@dataclasses.dataclass
class Candidate:
    """One way to run the step: the forward and backward graphs and their plan."""

    forward: fx.GraphModule
    backward: fx.GraphModule
    plan: Plan
    saved: list[fx.Node] = dataclasses.field(default_factory=list)  # what it was planned to save, graph order
    # Set while the graphs are light ones (``lite``, what searches score): builds the torch.fx ones.
    rebuild: Callable[[], Candidate] | None = None

    @property
    def peak(self) -> int:
        """The plan's predicted peak, in bytes."""
        return self.plan.predicted_peak_bytes

    def release(self) -> None:
        """Drop light graphs the search no longer reads (a probe that lost): the planner's
        memory holds the graphs of the plans still in the running; ``realize`` builds a
        released candidate again if it is chosen after all."""
        if self.rebuild is not None:
            self.forward = self.backward = None
            timeline = self.plan.timeline  # its steps too: the peak is what the search still reads
            self.plan.timeline = dataclasses.replace(timeline, steps=[], live_bytes=[])

    def realize(self) -> Candidate:
        """This candidate with torch.fx graphs (built by ``rebuild`` if its graphs are light),
        in place: what the plan says of its graphs (saved, recomputed, timeline) is then
        read off them. Both must predict the same peak: the search chose it by the light one."""
        if self.rebuild is None:
            return self
        real = self.rebuild()
        if real.peak != self.peak:
            raise AssertionError(f"fxremat bug: graph {real.plan.graph_id}'s {real.plan.solver} plan predicts "
                                 f"{real.peak} bytes on FX graphs and {self.peak} on the light graphs it was chosen by")
        self.forward, self.backward, self.rebuild = real.forward, real.backward, None
        for field in ("saved", "saved_activation_bytes", "recomputed", "timeline"):
            setattr(self.plan, field, getattr(real.plan, field))
        return self


@dataclasses.dataclass
class Context:
    """What every strategy's candidates are built from: the prepared joint graph and its classes."""

    joint: fx.GraphModule
    classes: NodeClasses
    num_fwd_outputs: int
    static_nodes: set[fx.Node]
    options: Options
    graph_id: str
    by_name: dict[str, fx.Node]
    input_names: set[str]
    banned: dict[str, str]  # why each node may not be recomputed (of the saved set planned around)
    problem: mincut.MinCutProblem  # the traffic-optimal min-cut problem
    _costs: dict[fx.Node, float] | None = None
    facts: lite.Facts = dataclasses.field(default_factory=lite.Facts)  # for light copies of its nodes
    started: float = dataclasses.field(default_factory=time.perf_counter)  # when planning began
    # The cost model's figures: the device profile (None: the graph's device's, ``profile_for``)
    # and the timer of cost_model="measured" (None: the roofline), made with the context so
    # that the copies strategies take share it. ``ranks`` sets both to rank 0's when ranks plan apart.
    profile: Any = None
    timer: Any = None
    # What one search works out that a later search of the same graph can reuse (a fraction
    # budget runs two: the least-memory plan, then the plan within the fraction's bytes):
    # pure functions of the graph and the key, shared by the copies strategies take.
    memo: dict = dataclasses.field(default_factory=dict)

    def progress(self, what: str) -> None:
        """Log what planning does next, and how long it has taken: at INFO once that is
        ``PROGRESS_AFTER_S`` or more (a large graph), before at DEBUG."""
        elapsed = time.perf_counter() - self.started
        log.log(logging.INFO if elapsed >= PROGRESS_AFTER_S else logging.DEBUG, "graph %s (%d nodes, %.1f s): %s",
                self.graph_id, len(self.by_name), elapsed, what)

    @property
    def user_outputs(self) -> list[fx.Node]:
        """The forward's outputs the caller gets (not the values saved for the backward)."""
        return [n for n in self.classes.fwd_outputs[:self.num_fwd_outputs] if isinstance(n, fx.Node)]

    def backward_start_bytes(self, saved: list[fx.Node]) -> int:
        """A lower bound of the predicted peak of any plan saving ``saved``: what is alive
        when its backward begins (``sizes.alive_at_backward_bytes``): the saved storages, the
        outputs the caller holds (``hold_outputs``) and the incoming gradients the backward
        reads. Searches skip building a probe this proves cannot fit or cannot predict less."""
        incoming = self.memo.get("incoming gradients read")
        if incoming is None:
            incoming = self.memo["incoming gradients read"] = [
                n for n in self.joint.graph.nodes if n.op == "placeholder" and _compat.is_tangent(n) and n.users]
        held = held_outputs(self.user_outputs, self.options.hold_outputs)
        return alive_at_backward_bytes(saved, held, incoming, self.input_names)

    def saved_nodes(self, names) -> list[fx.Node]:
        """The joint graph's nodes named in ``names``, in graph order: reproducible."""
        return [self.by_name[name] for name in self.problem.nodes if name in names]

    def costs(self) -> dict[fx.Node, float]:
        """Each op's estimated seconds (``costmodel.node_costs``: Inductor-like kernels on
        the graph's device), found once per graph: strategies plan around several saved sets."""
        from . import costmodel

        if self._costs is None:
            self._costs = costmodel.node_costs(self.joint, *self._device_and_timer())
        return self._costs

    def estimate(self, candidate: Candidate) -> float:
        """The cost model's seconds for a step of the candidate's graphs (``costmodel.estimate_step``,
        the model that costs Rotor's stages): one yardstick for plans of different solvers
        (``auto``'s staged plan against the knapsack's); kept in ``notes["estimated_step_s"]``.
        The roofline reads light graphs (``lite``) as it reads torch.fx ones."""
        from . import costmodel

        known = candidate.plan.notes.get("estimated_step_s")
        if known is not None:
            return known
        device, timer = self._device_and_timer()
        if timer is not None or candidate.forward is None:
            candidate.realize()  # measured kernels are built from torch.fx nodes; a released one has none
        seconds = costmodel.estimate_step(candidate.forward, candidate.backward, device, timer=timer).total_s
        candidate.plan.notes["estimated_step_s"] = seconds  # what reports quote
        return seconds

    def _device_and_timer(self):
        """The graph's device (or the profile it is costed with), and the timer of
        ``cost_model="measured"`` (None: the roofline)."""
        return (self.profile or graph_device(self.joint)), self.timer

    def figures(self) -> tuple[Any, dict[str, float], dict[str, int]]:
        """What this context's plans were made with that a process measures for itself: the
        device profile, the measured kernel times, and library calls' scratch bytes
        (``workspace.measured``)."""
        from . import costmodel, workspace

        profile, timer = self._device_and_timer()
        return costmodel.profile_for(profile), dict(timer.used) if timer is not None else {}, workspace.measured()

    def frozen_timer(self, timings: dict[str, float]):
        """A timer that answers with ``timings`` and measures nothing (None without
        ``cost_model="measured"``)."""
        from . import costmodel

        if self.options.cost_model != "measured":
            return None
        return costmodel.OpTimer(graph_device(self.joint), preset=timings)


def extract(ctx: Context, saved: list[fx.Node], backward_template: bool = False, light: bool = False
            ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward graphs that save ``saved`` (torch's extractor: AOTAutograd's
    calling convention). ``backward_template``: a backward for ``emit`` to fill in.
    ``light``: ``lite`` graphs, to score a candidate (torch's graphs where lite cannot)."""
    tuples = [n.name for n in saved if is_multi_output(n)]
    if tuples:  # torch's extractor would make them forward outputs, which Inductor rejects
        raise AssertionError(f"fxremat bug: saved values {tuples} are tuples (multi-output ops): save their items")
    values = [n for n in saved if not _compat.is_sym_node(n)]
    syms = [n for n in saved if _compat.is_sym_node(n)]
    if light:
        try:
            return lite.extract(ctx.joint, values, syms, num_fwd_outputs=ctx.num_fwd_outputs,
                                backward_template=backward_template, facts=ctx.facts)
        except lite.Unsupported:
            pass
    return _compat.extract_fwd_bwd_modules(
        ctx.joint, values, syms, num_fwd_outputs=ctx.num_fwd_outputs, static_lifetime_input_nodes=ctx.static_nodes,
        backward_template=backward_template)


def extract_placed(ctx: Context, saved: list[fx.Node], light: bool = False
                   ) -> tuple[fx.GraphModule, fx.GraphModule, set[str]]:
    """The forward and backward graphs of a saved set, each recomputation placed just
    before its first use; and the names of the forward's ops (what counts as recomputed)."""
    fwd, bwd = extract(ctx, saved, light=light)
    fwd_names = {n.name for n in fwd.graph.nodes if n.op == "call_function"}
    bwd = place_recomputations(bwd, fwd_names | {n.name for n in ctx.classes.forward})
    return fwd, bwd, fwd_names


def check_no_aliasing(saved: list[fx.Node], input_names: set[str]) -> None:
    """Two saved tensors in one storage would let Inductor's backward reuse (donate) one
    buffer while the other still reads it: the partitioner saves bases, never views."""
    seen: dict[str, str] = {}
    for node in saved:
        base = storage_of(node)
        if base is None or base in input_names:
            continue
        if base in seen:
            raise AssertionError(f"fxremat bug: saved tensors {seen[base]} and {node.name} share a storage")
        seen[base] = node.name


def make_candidate(ctx: Context, solver: str, fwd: fx.GraphModule, bwd: fx.GraphModule, saved: list[fx.Node],
                   cut_cost: float, recomputed: list[dict] | None = None,
                   foreign: bool = False, **extra: Any) -> Candidate:
    """The candidate of the graphs ``fwd`` and ``bwd``: its plan, with the timeline predicted
    for the compiler in the options; its graphs' Python code is quoted later, for the plan
    chosen only (``partition``: making it for every candidate is slow; ``lite`` graphs have
    none). ``foreign``: the graphs are another partitioner's (PyTorch's, as a
    point of comparison), which may save several views of one storage; fxremat's own plans
    save storages (``check_no_aliasing``)."""
    if ctx.options.compiler == "inductor":
        keep_products_apart(fwd)
        keep_products_apart(bwd)
        if ctx.options.memory_budget is not None and not foreign:
            # Under a budget the forward hands on the inputs its convolutions read as they
            # are, not Inductor's channels-last copies (a copy a convolution, while it runs).
            return_inputs_as_given(fwd)
    bwd_inputs = {n.name for n in bwd.graph.find_nodes(op="placeholder")}
    saved_final = [n for n in saved if n.name in bwd_inputs and not _compat.is_sym_node(n)]  # torch drops unused
    saved_sym = [n for n in saved if n.name in bwd_inputs and _compat.is_sym_node(n)]
    if not foreign:  # another partitioner's plan (PyTorch's, for comparison) may save views of one storage
        check_no_aliasing(saved_final, ctx.input_names)
    fwd_names = {n.name for n in fwd.graph.nodes if n.op == "call_function"}
    if recomputed is None:
        recomputed = [recomputed_entry(n, n.name) for n in bwd.graph.nodes
                      if n.op == "call_function" and n.name in fwd_names]
    returned = {storage_of(n) for n in ctx.user_outputs}
    inductor = ctx.options.compiler == "inductor"
    timeline = predict(fwd, bwd, ctx.num_fwd_outputs, relaid_inputs(fwd) if inductor else set(), fusion=inductor,
                       hold_outputs=ctx.options.hold_outputs, workspace=scratch_model(inductor),
                       later_graphs=ctx.options.later_graphs_bytes)
    plan = Plan(
        graph_id=ctx.graph_id,
        solver=solver,
        saved=[{**describe(n), "input": storage_of(n) in ctx.input_names}
               for n in saved_final + saved_sym],
        saved_activation_bytes=storage_bytes(saved_final, ctx.input_names),
        saved_output_bytes=storage_bytes([n for n in saved_final if storage_of(n) in returned], ctx.input_names),
        recomputed=recomputed,
        banned=ctx.banned,
        cut_cost=cut_cost,
        timeline=timeline,
        budget_bytes=None,
        forward_code="",  # quoted for the plan chosen only (``partition``): making it is slow
        backward_code="",
        **extra,
    )
    return Candidate(fwd, bwd, plan, list(saved))
