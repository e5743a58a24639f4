"""One byte budget for the whole training step, across the graphs the step compiles.

A step can run several compiled graphs: a graph break, a loss computed in a graph of its own
(Hugging Face GPT-2), DDPOptimizer's buckets. Their forwards run in turn, then their
backwards in reverse order, and while graph *k* runs, every earlier graph of the step holds
its saved activations and its outputs. A byte budget is a promise about the step's peak, so a
graph is planned within the budget less what the graphs before it hold (issue #22).

- **The ledger** (run time). When a compiled graph's forward runs under autograd it adds what
  it holds across the rest of the step: its plan's saved activations and its outputs (their
  storages, less the inputs'). Its backward starting, or its autograd graph being freed
  without one, takes the entry out.
- **Planning**: a graph is planned when its forward first runs, so the ledger then holds exactly
  the graphs running beside it; its budget is ``budget - held``, and what the step's later
  graphs need (``reserved``) is a step of its timeline between its forward and its backward
  (``Budget.later_graphs``), where they run while it holds its saved activations and outputs.
- **Later graphs.** The first graph of a step cannot know what comes after it, but for one
  thing: the gradients of its outputs are handed back before its backward, so a graph that
  returns more than a scalar loss counts them at its turn from its first plan on
  (``handed_back``). A graph whose
  least-memory plan needs more than the budget leaves it (``N``) runs at that least plan for
  this one step, with a ``BudgetWarning`` that says by how much the step is over, and reserves
  ``N`` from every graph held across it (so does a later graph that fits but keeps parameter
  gradients through the backward of a held graph that did not count them and would be over
  with them: ``_charge_kept``): once the step has ended (the ledger is empty), each is
  planned again (a recompile, with the inputs of its next call) within ``budget - held`` with
  ``N`` needed between its forward and its backward, and so is the later graph, within what
  they then leave. From the next step on the step meets
  the budget, or, where no plan of the earlier graphs leaves ``N``, their replanning raises
  ``BudgetError`` naming a budget that works.
- **Graphs compiled together** (DDPOptimizer compiles all its buckets before the first runs,
  each within the whole budget) whose plans together are predicted over the budget are planned
  again at their first call, before any runs (``_plan_together``): first to last, each within
  what the ones before it hold, with the least of the ones after it at its turn. A graph
  planned before the graphs held beside it ran, otherwise, finds at its call that the step is
  predicted over: it is planned again, within what they leave, once the step has ended (a
  ``BudgetWarning`` says so).
- **The step's least in one error.** A budget no plan of the step meets raises one
  ``BudgetError`` naming the step's least budget (``_step_least``): each graph at its
  least-memory plan with the least of the graphs after it counted at its turn, found from the
  last graph to the first by planning alone: each graph's joint graph, kept from its compile,
  planned again (``plans.keeping_joint``), or else a compile that stops once it has planned
  (``plans.planning_only``); nothing compiled. A
  graph refused at its compile with nothing held (below its floor, or its least) keeps its
  refusal for its first call, when every graph compiled with it is known (DDPOptimizer's
  buckets, in the order they run); a replan that cannot leave the later graphs their need
  names the least of the graphs its last step ran, a graph called several times in a row
  counted as its calls together (the step then fits at the budget named:
  ``tests/test_distributed.py``, ``tests/test_step_budget.py``). Graphs compiled one after
  another (a graph break) can take two errors: the first knows only the graphs compiled so far,
  and says so.
- **A graph called more than once in a step** (one compiled block run for every block, as
  with FSDP2's per-block compiles) finds its own earlier calls held: ``k`` calls hold ``k - 1``
  times what one call holds (saved activations and outputs) while the last one runs. Its calls
  are counted; once a step has called it more often than its plan counted, it is planned again,
  after that step, for ``k`` calls: one plan whose later calls are later graphs of its first
  call (``_compile_within``), so that the calls fit ``budget - held`` together; where no plan
  does, ``BudgetError`` names the least budget its ``k`` calls need (or, with earlier graphs
  held across them, those are asked to leave it, as for any later graph). Until then a
  ``BudgetWarning`` says by how much the step is predicted over.

Graphs with symbolic sizes (dynamic shapes) keep the per-graph budget: a replan compiles for
the sizes of one call. Fractions keep their per-graph meaning.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
import weakref
from typing import Any, Callable

import torch

from . import _compat, inspect
from .options import Budget, Options, format_bytes
from .plans import BudgetError, BudgetWarning, Planned, fxremat_error, keeping_joint, planning_only, wrapped
from .sizes import tensor_bytes

_HELD: dict[int, tuple["StepGraph", int]] = {}  # ledger entry -> (graph, bytes held)
_ENTRIES = itertools.count()
_steps_ended = 0  # times the ledger emptied: a step's last backward ran (or its graphs were freed)
_LEAST_PROBES = 3  # a floor error names the floor; the least plan may need a little more
_UNRUN: list[weakref.ref] = []  # step graphs compiled and not yet called, in order
_STEP: list["StepGraph"] = []  # the graphs whose forwards ran in the step under way, in order
_LAST_STEP: list["StepGraph"] = []  # those of the last step that ended
# A graph's ``replan(options) -> Plan``: its joint graph planned again without a new trace
# (``plans.keeping_joint``), for the step's least-memory queries (``_least_plan``). Kept apart
# from the graph's attributes: Dynamo's wrapper of a compiled function copies those (functools.wraps)
# and would keep the joint graph alive after the graph lets it go.
_REPLANS: "weakref.WeakKeyDictionary[StepGraph, Callable]" = weakref.WeakKeyDictionary()


def held_bytes() -> int:
    """What the graphs whose forward ran and whose backward has not hold now, in bytes."""
    return sum(nbytes for _, nbytes in _HELD.values())


def applies(options: Options, example_inputs) -> bool:
    """A byte budget on a graph of static sizes: the step's budget (``StepGraph``)."""
    from .sizes import symbolic_dims

    return (options.memory_budget is not None and options.memory_budget.bytes is not None
            and not symbolic_dims(example_inputs))


class StepGraph:
    """A compiled graph planned within the step's budget: ``compile(gm, inputs, options)``
    compiles it (``backend._compile``); called as the compiled forward is (unboxed)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, options: Options,
                 compile: Callable[[torch.fx.GraphModule, list, Options], Callable]):
        self.gm, self.options, self._compile = gm, options, compile
        self.budget = options.memory_budget.bytes
        # What later graphs of the step asked this one to leave them between its forward and
        # backward, and what of it they keep to the step's end (Budget.later_graphs, _kept).
        self.reserved = (0, 0)
        # The gradients of its outputs, which the work after it in the step hands back before
        # its backward starts: a need at its turn known before any later graph has run (a scalar
        # loss, the last graph's output, hands back nothing worth counting).
        self.handed_back = _handed_back_bytes(gm)
        # Whether an output shares a storage with an input, as traced: only then does a call
        # look for its outputs among its inputs' storages (``_enter``), 0.2 ms a call over a
        # ResNet-50's 322 inputs.
        self.outputs_alias_inputs = _outputs_alias_inputs(gm)
        self.stale_in: int | None = None  # plan again once the step numbered so has ended
        self.saved_bytes = self.peak = 0
        self.backward_peak = 0  # its plans' predicted peak in their backward, where later graphs' gradients are kept
        # The gradients of its outputs, its backward's incoming gradients: as traced, until a call has run.
        self.output_grad_bytes = _output_grad_bytes(gm)
        self.output_bytes = 0  # its outputs' storages (not its inputs'), held across the step
        self.parameter_grad_bytes = 0  # the gradients of the parameters it is called with, kept to the end
        self.reduced_grad_bytes = 0  # those FSDP2 reduce-scatters and frees after its backward instead
        # Calls per step: the plan counts ``repeats`` calls; ``calls`` were made in step ``calls_in``.
        self.repeats, self.most_calls, self.calls, self.calls_in = 1, 1, 0, None
        self.plans_from = 0  # inspect.plan_count() before the compile whose plans are this graph's
        # Its compile's refusal, when no plan of its own fits the budget; the step's least is
        # then named at the first call, once every graph compiled beside it is known.
        self.refusal: BudgetError | None = None
        self.step_refusal: BudgetError | None = None  # the error its calls raise
        self._known_least = None  # (later, plan): the least-memory plan it was compiled at
        self.compile_id = _compat.compile_id()  # graphs of one compile are run in one step
        self._build(list(example_inputs), first=True)
        _UNRUN.append(weakref.ref(self))

    def __call__(self, *args):
        traced = _compat.traced_values(args)
        if traced and self.compiled is not None:
            return self.compiled(*args)
        if _UNRUN and not traced:
            _first_calls(self, args)
        if self.step_refusal is not None or self.refusal is not None:  # the step's least, or its own refusal
            raise (self.step_refusal or self.refusal).with_traceback(None)
        if self.stale_in is not None and _steps_ended > self.stale_in:
            self.stale_in = None
            self._build(list(args))
        if not torch.is_grad_enabled():  # no backward: nothing held across the step, nothing to check
            return self.compiled(*args)
        self._count_call()
        self._check(held_bytes())
        inputs = ({t.untyped_storage().data_ptr() for t in args if isinstance(t, torch.Tensor)}
                  if self.outputs_alias_inputs else frozenset())
        outputs = self.compiled(*args)
        self._enter(outputs, inputs)
        return outputs

    def _later(self) -> tuple[int, int]:
        """What the step's later work needs between this graph's forward and backward, and what
        of it it keeps to the step's end: what later graphs reserved, and at least the
        gradients of this graph's outputs they hand back (``handed_back``), known from the
        first step on."""
        return max(self.reserved[0], self.handed_back), self.reserved[1]

    def kept_beyond_incoming(self, kept: int) -> int:
        """Of what later graphs keep to the step's end, the part this graph's plan must count:
        that includes the gradients of this graph's outputs (Hugging Face GPT-2's loss graph:
        the logits' gradient), which its plan counts already as its incoming gradients,
        through its backward: counted once."""
        return max(kept - self.output_grad_bytes, 0)

    def reserve(self, nbytes: int, kept: int) -> None:
        """A later graph needs ``nbytes`` while this one is held, and keeps ``kept`` of them
        to the step's end: leave it that, from the next step."""
        kept = self.kept_beyond_incoming(kept)
        before = self._later()
        self.reserved = (max(nbytes, self.reserved[0]), max(kept, self.reserved[1]))
        if self._later() != before:
            self.stale_in = _steps_ended

    def _count_call(self) -> None:
        """One more call in this step; more calls than the plan counts make it stale: it is
        planned again for them once this step has ended."""
        if self.calls_in != _steps_ended:
            self.calls_in, self.calls = _steps_ended, 0
        self.calls += 1
        if self.calls > self.most_calls:
            self.most_calls = self.calls
            if self.stale_in is None:
                self.stale_in = _steps_ended

    def _check(self, held: int) -> None:
        """A call whose step is predicted over the budget: what is held beside it was not all
        held when it was planned. Graphs planned before the ones beside it ran (DDPOptimizer
        compiles all its buckets before the first runs) are planned again once this step has
        ended, within what those then leave; so is a graph called more often in this step than
        its plan counts (``_count_call``), for that many calls."""
        if held + self.peak <= self.budget:
            return
        again = any(graph is self for graph, _ in _HELD.values())
        if not again and self.stale_in is None:
            self.stale_in = _steps_ended
        if self.warned:
            return
        self.warned = True
        what = (f"it was planned for {self.repeats} call(s) a step and is planned again for as many as this step "
                "makes once it has ended" if again and self.most_calls > self.repeats else
                "it is planned again within what they leave once this step has ended")
        warnings.warn(BudgetWarning(
            f"fxremat: memory_budget={self.budget} bytes ({format_bytes(self.budget)}) is the step's, but this call "
            f"of graph {self.graph_ids} finds {format_bytes(held)} held by the step's earlier graphs"
            f"{' (or its own earlier calls)' if again else ''} beside its plan's {format_bytes(self.peak)}: the step "
            f"is predicted {format_bytes(held + self.peak - self.budget)} over the budget; {what}"), stacklevel=3)

    # --- planning ---------------------------------------------------------------------

    def _build(self, inputs: list, first: bool = False, held_by: list | None = None) -> None:
        """Planned and compiled within the budget less what the step holds now (``held_by``:
        the (graph, bytes) held across it, the ledger's unless given). ``first``: at its
        compile, where a refusal with nothing held is kept for its first call
        (``_first_calls``) instead of raised."""
        held_by = list(_HELD.values()) if held_by is None else held_by
        held = sum(nbytes for _, nbytes in held_by)
        given = self.budget - held
        self.repeats = self.most_calls
        # The calls' inputs keep their shapes (a new shape is a new graph): counted once a plan.
        # FSDP2 reduce-scatters a block's gradients after its backward and frees the unsharded
        # ones: those are not kept to the step's end (the sharded ones are FSDP2's own).
        reduced = _compat.fsdp2_parameters_reduced_after_backward()
        grads = [(tensor_bytes(t), id(t) in reduced) for t in inputs
                 if isinstance(t, torch.nn.Parameter) and t.requires_grad]
        self.parameter_grad_bytes = sum(nbytes for nbytes, freed in grads if not freed)
        self.reduced_grad_bytes = sum(nbytes for nbytes, freed in grads if freed)
        try:
            self.compiled = self._compile_within(inputs, given)
            over = None
        except Exception as error:  # noqa: BLE001 - a BudgetError of fxremat's, wrapped or not
            refusal = fxremat_error(error)
            if not isinstance(refusal, BudgetError) or held == 0 or refusal.least_bytes is None:
                if first and isinstance(refusal, BudgetError) and held == 0:
                    # Its calls raise the step's least (``_first_calls``). Under DDPOptimizer,
                    # compiled meanwhile at its least-memory plan: DDPOptimizer runs each bucket
                    # it compiles on fake tensors, for the next one's inputs (and wants its
                    # AOTAutograd metadata). Elsewhere no code is made for it.
                    self.refusal = refusal
                    self.compiled = (self._compile_least(inputs, self._later()) if _compat.splitting_for_ddp()
                                     else None)
                    return
                if isinstance(refusal, BudgetError) and any(self._later()) and refusal.least_bytes is not None:
                    raise self._cannot_leave(refusal, inputs) from None
                raise
            # A later graph of the step: it takes its least plan now, and the graphs held
            # across it leave it that from the next step.
            self.compiled, need = self._least(inputs, refusal.least_bytes)
            kept = self._kept(inspect.plans_since(self.plans_from))
            for graph, _ in held_by:
                graph.reserve(need, kept)
            self.stale_in = _steps_ended
            over = held + need - self.budget
            if over > 0:
                warnings.warn(BudgetWarning(
                    f"fxremat: memory_budget={self.budget} bytes ({format_bytes(self.budget)}) is the step's: the "
                    f"graphs before this one hold {format_bytes(held)} across it and its least-memory plan needs "
                    f"{format_bytes(need)}, so this step is predicted {format_bytes(over)} over the budget; once "
                    f"this step has ended the earlier graphs are planned again with {format_bytes(need)} left to it "
                    f"between their forward and backward, and this one within what they then hold"), stacklevel=2)
        plans = inspect.plans_since(self.plans_from)
        self.saved_bytes = _saved_beside_outputs(plans)
        # A repeated graph's plan has its later calls' need at its turn; each call is checked
        # against its own peak, its earlier calls being held (``_check``).
        self.peak = (self._figures()[0] if self.repeats > 1 else
                     max((p.predicted_peak_bytes for p in plans), default=0))
        self.graph_ids = ", ".join(p.graph_id for p in plans)
        self.backward_peak = max((r["live_bytes"] for p in plans for r in p.timeline.as_records()
                                  if r["phase"] == "backward"), default=0)
        if over is None:
            over = self._charge_kept(held_by, plans)
        self.warned = bool(over and over > 0)  # this step's excess is said already
        later_need, later_kept = self._later()
        for plan in plans:
            plan.notes["step"] = {"budget_bytes": self.budget, "held_by_earlier_graphs_bytes": held,
                                  "reserved_for_later_graphs_bytes": later_need,
                                  "kept_by_later_graphs_bytes": later_kept, "calls_per_step": self.repeats,
                                  "graph_budget_bytes": plan.budget_bytes, **({"over_bytes": over} if over and over > 0 else {})}

    def _charge_kept(self, held_by: list, plans) -> int | None:
        """A later graph that fits beside the graphs held across it still keeps its parameter
        gradients to the step's end, through their backwards. A held graph whose plan did not
        count them and is predicted over the budget with them is asked to leave this graph its
        peak and what it keeps (``reserve``), from the next step on; this step is said to be
        over (the excess returned; None where none is)."""
        kept = self._kept(plans)
        over = None
        for graph, _ in held_by:
            extra = graph.kept_beyond_incoming(kept) - graph._later()[1]
            if extra <= 0:
                continue
            if graph.backward_peak + extra <= self.budget:
                continue
            graph.reserve(self.peak, kept)
            over = max(over or 0, graph.backward_peak + extra - self.budget)
        if over:
            warnings.warn(BudgetWarning(
                f"fxremat: memory_budget={self.budget} bytes ({format_bytes(self.budget)}) is the step's: graph "
                f"{self.graph_ids} keeps {format_bytes(kept)} (its parameter gradients) to the step's end, through "
                f"the backwards of the graphs before it, which did not count them: this step is predicted "
                f"{format_bytes(over)} over the budget; once it has ended the earlier graphs are planned again "
                f"leaving this one its {format_bytes(self.peak)} and what it keeps"), stacklevel=3)
        return over

    def _cannot_leave(self, refusal: BudgetError, inputs: list) -> BudgetError:
        """The error for a graph whose plans cannot leave a later graph of the step what it
        reserved: then no plan of the step meets the budget. The least budget of this graph
        with the reservation counted between its forward and backward would (the later graph
        runs within what this one then holds); the refusal may name the graph's floor, so
        its least is found first. Where the last step ran this graph first, then others, each
        once, the error names the least of that step (``_step_least``)."""
        step = _LAST_STEP
        runs = _runs(step)
        if len(step) > 1 and step[0] is self and runs is not None and runs[0][1] == 1:
            least, parts, _ = _step_least(step, self, inputs)
            if least > self.budget:
                return _step_error(self.budget, len(runs), least, parts, [refusal])
        _, least = self._least(inputs, refusal.least_bytes)  # a compile that will not run
        need = format_bytes(self._later()[0])
        later = (f"a later graph of the step needs {need} while this graph is held" if self.reserved[0] >= self.handed_back
                 else f"the work after this graph hands back the gradients of its outputs ({need}) before its backward")
        error = BudgetError(
            f"fxremat: memory_budget={self.budget} bytes ({format_bytes(self.budget)}) is the step's: {later}, and "
            f"this graph's least-memory plan with that counted between its forward and backward needs "
            f"{format_bytes(least)}. Allowed: a budget of at least {least} bytes ({format_bytes(least)}) for the step.",
            least)
        error.floor_bytes = refusal.floor_bytes
        return error

    def _compile_within(self, inputs: list, nbytes: int) -> Callable:
        """Compiled so that its ``repeats`` calls of a step fit ``nbytes`` together. Raises
        ``BudgetError`` naming the least budget they need.

        One call: its plan within ``nbytes``, with the step's later graphs' need at its turn.
        ``k`` calls share one plan, which holds ``h`` across the step (its saved activations and
        outputs), keeps ``g`` to the end (its parameter gradients) and peaks at ``p``: the
        calls need ``(k - 1) * max(h, g) + p`` together (the last call beside the earlier
        calls' holds, or the first call's backward beside the later calls' gradients), and
        ``k * h`` plus the later graphs' need at the last call's turn (``_calls_need``). The
        planner is steered with the later calls as later graphs of the first call: they need
        ``(k - 2) * h + max(p, h + later need)`` between its forward and backward and keep
        ``(k - 1) * g``, so it trades recomputation against what a call holds, which a smaller
        budget alone would not make it do (a block's least-memory plan may save what its peak
        needs anyway). ``h``, ``g`` and ``p`` start as the plan before's and are iterated; a
        need no plan leaves room for is lowered by what the refusal says is missing. Failing
        that, the plan that holds least (``holding_least``) is taken where its calls fit, and
        otherwise names the least budget in the ``BudgetError``."""
        if self.repeats == 1:
            return self._compile_once(inputs, nbytes, self._later())
        earlier = self.repeats - 1
        figures = self._figures()
        need = None
        least = None  # the least need of the calls together among the plans made
        for _ in range(_LEAST_PROBES + 1):
            peak, hold, grads = figures
            if need is None:
                need = (earlier - 1) * hold + max(peak, hold + self._later()[0])
            later = (need, earlier * grads + self._later()[1])
            try:
                compiled = self._compile_once(inputs, nbytes, later)
            except Exception as error:  # noqa: BLE001
                refusal = fxremat_error(error)
                if not isinstance(refusal, BudgetError) or refusal.least_bytes is None:
                    raise
                missing = refusal.least_bytes - nbytes
                if missing <= 0 or need <= missing:
                    break
                need -= missing  # leave the plan what it lacked
                continue
            figures = self._figures()
            together = self._calls_need(*figures)
            if together <= nbytes:
                return compiled
            least = together if least is None else min(least, together)
            need = None
        # What the calls need at least: the plan that holds least. A later need of ``nbytes``
        # binds at its turn, so its least-memory plan trades everything it can for holding less.
        holding_least = (nbytes, later[1])
        compiled, _ = self._least(inputs, 1, within=lambda inputs, b: self._compile_once(inputs, b, holding_least))
        together = self._calls_need(*self._figures())
        if together <= nbytes:
            return compiled
        least = together if least is None else min(least, together)
        step_least = least + self.budget - nbytes
        raise BudgetError(
            f"fxremat: memory_budget={self.budget} bytes ({format_bytes(self.budget)}) is the step's: graph "
            f"{self.graph_ids} runs {self.repeats} times a step, and its earlier calls hold their saved activations "
            f"and outputs while the later ones run: its plans need {format_bytes(least)} for its calls together, "
            f"and {format_bytes(nbytes)} is left to them. Allowed: a budget of at least {step_least} bytes "
            f"({format_bytes(step_least)}) for the step.", least)

    def _calls_need(self, peak: int, hold: int, grads: int) -> int:
        """What ``repeats`` calls of a plan need together (``_compile_within``)."""
        k, (later_need, later_kept) = self.repeats, self._later()
        return max((k - 1) * max(hold, grads) + later_kept + peak, k * hold + later_need)

    def _figures(self) -> tuple[int, int, int]:
        """The plan just compiled: its own peak (without the later graphs' need it was given),
        what one call holds across the step (saved activations and outputs) and the parameter
        gradients it keeps to the end."""
        plans = inspect.plans_since(self.plans_from)
        peak = max((r["live_bytes"] - r["by_kind"].get("later graphs", 0) for p in plans for r in p.timeline_records()),
                   default=0)
        return peak, _saved_beside_outputs(plans) + self.output_bytes, self.parameter_grad_bytes

    def _compile_once(self, inputs: list, nbytes: int, later: tuple[int, int]) -> Callable:
        """One call planned within ``nbytes``, with ``later`` (need, kept) between its forward and
        backward (``Budget.later_graphs``); its plans are those made since ``plans_from``."""
        # Nothing left is asked as 1 byte: its refusal names the graph's floor, where its least starts.
        budget = Budget(bytes=max(1, nbytes), later_graphs=later[0], later_graphs_kept=later[1])
        options = dataclasses.replace(self.options, memory_budget=budget)
        self.plans_from = inspect.plan_count()
        with keeping_joint(self._keep):
            return self._compile(self.gm, inputs, options)

    def _keep(self, replan: Callable) -> None:
        _REPLANS[self] = replan

    def _least(self, inputs: list, need: int, within: Callable | None = None) -> tuple[Callable, int]:
        """Compiled at the least budget its plans meet (``within``: ``_compile_within`` unless
        given), from ``need`` up (a floor error names the floor first), and that budget."""
        within = within or self._compile_within
        for _ in range(_LEAST_PROBES):
            try:
                return within(inputs, need), need
            except Exception as error:  # noqa: BLE001
                refusal = fxremat_error(error)
                if not isinstance(refusal, BudgetError) or refusal.least_bytes is None or refusal.least_bytes <= need:
                    raise
                need = refusal.least_bytes
        raise BudgetError(f"fxremat: no least budget after {_LEAST_PROBES} probes", None)

    def _least_options(self, later: tuple[int, int]) -> Options:
        """Its options at its least-memory plan (a fraction of 0.0), with ``later`` (need, kept)
        between its forward and backward."""
        budget = Budget(fraction=0.0, later_graphs=later[0], later_graphs_kept=later[1])
        return dataclasses.replace(self.options, memory_budget=budget)

    def _compile_least(self, inputs: list, later: tuple[int, int]) -> Callable:
        """Compiled at its least-memory plan with ``later`` at its turn; the plan kept for
        ``_least_plan``."""
        self.plans_from = inspect.plan_count()
        with keeping_joint(self._keep):
            compiled = self._compile(self.gm, inputs, self._least_options(later))
        plans = inspect.plans_since(self.plans_from)
        self._known_least = (later, plans[-1]) if len(plans) == 1 else None
        return compiled

    def _least_plan(self, inputs: list, later: tuple[int, int]):
        """Its least-memory plan with ``later`` (need, kept) between its forward and backward:
        planned, not compiled (or the one it was compiled at)."""
        known = self._known_least
        if known is not None and known[0] == later:
            return known[1]
        options = dataclasses.replace(self._least_options(later), debug_dir=None)  # no files, no report sweep
        replan = _REPLANS.get(self)
        if replan is not None:
            return replan(options)
        with planning_only(), keeping_joint(self._keep):
            try:
                self._compile(self.gm, inputs, options)
            except Exception as error:  # noqa: BLE001 - Planned, as AOTAutograd or Inductor passed it on
                planned = wrapped(error, (Planned,))
                if planned is None:
                    raise
                return planned.plan
        raise AssertionError("fxremat bug: a compile under planning_only() compiled")

    def _least_for_calls(self, inputs: list, later: tuple[int, int], calls: int) -> tuple[int, int]:
        """The least budget its ``calls`` calls in a row need together with ``later`` after the
        last one, and what its plan keeps to the step's end: its calls share one plan, so
        they are compiled as the step's replans would (``_compile_within``), not only planned."""
        kept_state = (self.repeats, self.most_calls, self.reserved)
        self.repeats = self.most_calls = calls
        self.reserved = later
        try:
            _, least = self._least(inputs, 1)  # compiles that will not run
            end = self._kept(inspect.plans_since(self.plans_from))
        finally:
            self.repeats, self.most_calls, self.reserved = kept_state
        return least, end

    def _kept(self, plans) -> int:
        """What its ``plans`` keep from its backward to the step's end: what their timelines
        end with, less the gradients FSDP2 frees after its backward (``reduced_grad_bytes``)."""
        end = max((p.timeline.end_bytes or 0 for p in plans), default=0)
        return max(end - self.reduced_grad_bytes, 0)

    def predicted_hold(self) -> int:
        """What a call holds across the step (its saved activations and outputs), as its plan
        predicts before it has run (``_enter`` counts the outputs' storages once it has)."""
        return self.saved_bytes + _output_bytes(self.gm)

    # --- the ledger -------------------------------------------------------------------

    def _enter(self, outputs, inputs: set[int]) -> None:
        tensors = [t for t in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
                   if isinstance(t, torch.Tensor)]
        node = next((t.grad_fn for t in tensors if t.grad_fn is not None
                     and type(t.grad_fn).__name__.startswith("CompiledFunction")), None)
        if node is None:  # no backward will run: nothing held across the step
            return
        storages = {}
        for t in tensors:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in inputs:
                storages[ptr] = tensor_bytes(t)
        self.output_grad_bytes = sum(tensor_bytes(t) for t in tensors if t.requires_grad)
        self.output_bytes = sum(storages.values())
        entry = next(_ENTRIES)
        _HELD[entry] = (self, self.saved_bytes + sum(storages.values()))
        _STEP.append(self)
        # Left when its backward starts: a pre-hook. A post-hook (after the backward) makes
        # autograd's engine hold the backward's incoming gradients until it returns, where
        # the compiled backward would free each at its last use (torch 2.13; Hugging Face
        # GPT-2's logits gradient, 1 MiB, held through the model graph's backward: 11% over).
        node.register_prehook(lambda grad_outputs: _leave(entry))
        weakref.finalize(node, _leave, entry)  # an autograd graph freed without a backward


def _handed_back_bytes(gm: torch.fx.GraphModule) -> int:
    """The bytes of the gradients of ``gm``'s outputs that need one and are more than a scalar:
    the step's later work makes them before this graph's backward can start, so they are alive
    at its turn, beside what it holds."""
    return sum(tensor_bytes(v) for _, v in _outputs(gm) if v.requires_grad and v.numel() > 1)


def _saved_beside_outputs(plans) -> int:
    """What a call's autograd graph holds beside its outputs: its plans' saved activations, less
    those in storages the graph also returns (GPT-2's last hidden state, saved for the head's
    weight gradient and returned for the loss: one storage, counted with the outputs)."""
    return sum(p.saved_activation_bytes - p.saved_output_bytes for p in plans)


def _leave(entry: int) -> None:  # returns None: a hook's value would replace the gradients
    global _steps_ended
    if _HELD.pop(entry, None) is not None and not _HELD:
        _steps_ended += 1
        _LAST_STEP[:] = _STEP
        _STEP.clear()
        if len({id(graph) for graph in _LAST_STEP}) == 1:
            # A graph that is the whole step: its least is asked only where the step has
            # several graphs (``_cannot_leave``) or at its first call; its joint graph goes.
            _REPLANS.pop(_LAST_STEP[0], None)


def _first_calls(caller: StepGraph, args) -> None:
    """The first call of a step graph since graphs were compiled: those compiled since
    (``_UNRUN``) are known together. DDPOptimizer compiles all its buckets before the first
    runs, so the step's graphs are all there, in the order they run. Where one of them
    refused the budget at its compile, the step's least budget is found (``_step_least``)
    before anything runs, and every graph of the batch raises one ``BudgetError`` naming it
    (not the refusing graph's own least, nor its floor: a user would need several tries)."""
    graphs = [g for g in (ref() for ref in _UNRUN) if g is not None]
    if not any(g is caller for g in graphs):
        return
    batch = [g for g in graphs if g.compile_id == caller.compile_id]
    _UNRUN[:] = [weakref.ref(g) for g in graphs if g.compile_id != caller.compile_id]
    refused = [g for g in batch if g.refusal is not None]
    if not refused:
        if len(batch) > 1 and _predicted_over(batch):
            _plan_together(batch, caller, args)
        return
    _refuse(batch, caller, args, [g.refusal for g in refused])


def _refuse(batch: list[StepGraph], caller: StepGraph, args, refusals: list[BudgetError],
            found: tuple | None = None) -> None:
    """Raise the step's least for ``batch`` (``_step_least``, or ``found``, its answer), at
    every call of its graphs."""
    least, parts, _ = found or _step_least(batch, caller, args)
    # (A search within bytes can find less than the least-memory search: the refusal's least then.)
    least = max([least] + [r.least_bytes for r in refusals if r.least_bytes is not None])
    # No step has run these graphs yet: a graph the step compiles after them (past a graph
    # break) is traced only once they have run, and is not counted.
    error = _step_error(caller.budget, len(batch), least, parts, refusals,
                        later_unknown=not any(g in _LAST_STEP for g in batch))
    for graph in batch:
        graph.step_refusal = error
    raise error.with_traceback(None)


def _predicted_over(batch: list[StepGraph]) -> bool:
    """Are graphs compiled together, run in turn, predicted over the step's budget: each one's
    peak beside what the ones before it hold (their saved activations and outputs)?"""
    held = 0
    for graph in batch:
        if held + graph.peak > graph.budget:
            return True
        held += graph.predicted_hold()
    return False


def _plan_together(batch: list[StepGraph], caller: StepGraph, args) -> None:
    """Graphs compiled together (DDPOptimizer's buckets), each planned within the whole budget,
    whose plans together are predicted over it: planned again before the first runs. The
    step's least (``_step_least``) is found first, and raised where it is over the budget.
    Otherwise, first graph first, each is planned within what the ones before it hold (as
    their plans predict), with the least of the graphs after it at its turn: the least plans
    fit there, so every graph has a plan, and the earlier graphs take the slack. (The step's
    replans would get there over its first steps, running them over the budget, and not
    always: their reservations follow the order the graphs were found over.)"""
    found = _step_least(batch, caller, args)
    least, _, later = found
    if least > caller.budget:
        _refuse(batch, caller, args, [], found)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BudgetWarning)  # said for the step as run, not this prediction
        held_by = []
        for graph, (need, kept) in zip(batch, later):
            graph.reserved, graph.stale_in = (need, graph.kept_beyond_incoming(kept)), None
            graph._build(list(args) if graph is caller else _traced_inputs(graph.gm), held_by=held_by)
            held_by.append((graph, graph.predicted_hold()))


def _outputs(gm: torch.fx.GraphModule) -> list[tuple[bool, torch.Tensor]]:
    """Dynamo's example values of ``gm``'s tensor outputs, each with whether it is an input of
    ``gm``: what the step's accounting knows of its outputs before it has run."""
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    nodes = output.all_input_nodes if output is not None else []
    return [(n.op == "placeholder", v) for n in nodes for v in [n.meta.get("example_value")]
            if isinstance(v, torch.Tensor)]


def _outputs_alias_inputs(gm: torch.fx.GraphModule) -> bool:
    """Can an output of ``gm`` share a storage with one of its inputs (an input returned, a
    view, ``detach``)? Dynamo's example values share storages as the graph does; a value not
    recorded counts as sharing (each call then looks)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._pytree import tree_leaves

    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    returned = output.all_input_nodes if output is not None else []
    if any(n.op == "placeholder" for n in returned):
        return True
    inputs, outputs = _traced_inputs(gm), [n.meta.get("example_value", n.meta.get("val")) for n in returned]
    if any(v is None for v in inputs + outputs):
        return True
    storages = {StorageWeakRef(t.untyped_storage()) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)}
    return any(StorageWeakRef(t.untyped_storage()) in storages for t in tree_leaves(outputs) if isinstance(t, torch.Tensor))


def _output_bytes(gm: torch.fx.GraphModule) -> int:
    """What ``gm``'s outputs (not its inputs) hold across the step, before it has run
    (``StepGraph._enter`` counts their storages once it has)."""
    return sum(tensor_bytes(v) for is_input, v in _outputs(gm) if not is_input)


def _step_error(budget: int, graphs: int, least: int, parts: list[tuple], refusals: list[BudgetError],
                later_unknown: bool = False) -> BudgetError:
    """The error naming the step's least budget; ``parts``: ``_step_least``'s, ``refusals``:
    the graphs' own. ``later_unknown``: no step has run yet, so graphs compiled after these
    (a graph break's) are not counted, which the message says."""
    def turn(need: int, handed_back: bool) -> str:
        return ("" if not need else f", {format_bytes(need)} counted between its forward and backward for "
                + ("the gradients of its outputs, which the work after it hands back before its backward"
                   if handed_back else "the graphs after it"))

    if graphs > 1:
        each = "; ".join(f"graph {graph_id} {format_bytes(peak)}{turn(need, handed)}"
                         for graph_id, peak, need, handed in parts)
        what = (f"its {graphs} graphs need at least {format_bytes(least)} together, each at its least-memory plan "
                f"with what runs after it counted at its turn (last first: {each})")
    else:
        graph_id, peak, need, handed = parts[0]
        what = f"the least-memory plan of graph {graph_id} needs {format_bytes(least)}{turn(need, handed)}"
    # A graph's own refusal within the budget says what its solver could not do (solver='mincut'
    # recomputes nothing further, ...); one under the floor says no more than the floor.
    own = next((str(r) for r in refusals if r.floor_bytes is None or r.least_bytes != r.floor_bytes), None)
    scope = "."
    if later_unknown:
        them, run = ("it", "it runs") if graphs == 1 else ("them", "they run")
        scope = (f" as far as it is compiled: a graph compiled after {them} (past a graph break) is known only once "
                 f"{run}, and may need more.")
    error = BudgetError(f"fxremat: memory_budget={budget} bytes ({format_bytes(budget)}) is the step's, below its "
                        f"minimum feasible budget: {what}. Allowed: a budget of at least {least} bytes "
                        f"({format_bytes(least)}) for the step{scope}"
                        + (f" (The graph's own refusal: {own})" if own else ""), least)
    floors = [r.floor_bytes for r in refusals if r.floor_bytes is not None]
    error.floor_bytes = max(floors) if floors else None
    return error


def _step_least(batch: list[StepGraph], caller: StepGraph, args) -> tuple[int, list[tuple], list[tuple]]:
    """The least budget of a step that runs ``batch`` in turn (a graph called several times in a
    row counted as its calls together, ``_least_for_calls``); what each
    graph's least-memory plan needs (``_step_error``'s parts, last first); and for each graph,
    in order, what the graphs after it need at its turn at least and keep to the end.

    From the last graph to the first: a graph's least-memory plan with what the graphs after it
    need (their least) between its forward and backward, and what they keep to the step's end
    (their parameter gradients) after it; the first graph's predicted peak is the step's least.
    The step's replans account the same way (``StepGraph.reserve``); here it is found at once,
    each plan made and not compiled (``_least_plan``)."""
    need = kept = 0
    parts, needs = [], []
    for graph, calls in reversed(_runs(batch)):
        needs.append((need, kept))
        inputs = list(args) if graph is caller else _traced_inputs(graph.gm)
        later = (max(need, graph.handed_back), graph.kept_beyond_incoming(kept))
        if calls == 1:
            plan = graph._least_plan(inputs, later)
            least, end = plan.predicted_peak_bytes, graph._kept([plan])
            name = f"{plan.graph_id} ({plan.solver}" + (f", {plan.stages} stages)" if plan.stages else ")")
        else:
            least, end = graph._least_for_calls(inputs, later, calls)
            name = f"{graph.graph_ids} (called {calls} times in a row)"
        parts.append((name, least, later[0], need < later[0]))
        need, kept = least, end
    return need, parts, needs[::-1]


def _runs(graphs: list[StepGraph]) -> list[tuple[StepGraph, int]] | None:
    """``graphs`` as runs of calls of one graph, in order ((graph, calls)); None when a graph's
    calls are not all in one run (its calls then share a plan across other graphs' turns)."""
    runs: list[tuple[StepGraph, int]] = []
    for graph in graphs:
        if runs and runs[-1][0] is graph:
            runs[-1] = (graph, runs[-1][1] + 1)
        elif any(g is graph for g, _ in runs):
            return None
        else:
            runs.append((graph, 1))
    return runs


def _traced_inputs(gm: torch.fx.GraphModule) -> list:
    """Dynamo's example values of ``gm``'s inputs (fake tensors): to plan it again when its own
    inputs are not at hand, without keeping a step's tensors alive."""
    return [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder")]


def _output_grad_bytes(gm: torch.fx.GraphModule) -> int:
    """The gradients of ``gm``'s outputs (``StepGraph.output_grad_bytes``), before it has run."""
    return sum(tensor_bytes(v) for _, v in _outputs(gm) if v.requires_grad)


def compiled_for_step(gm, example_inputs, options: Options, compile: Callable) -> Any:
    """``gm`` compiled under the step's budget where it applies (``applies``), else as is."""
    if applies(options, example_inputs):
        return StepGraph(gm, example_inputs, options, compile)
    return compile(gm, list(example_inputs), options)


__all__ = ["StepGraph", "applies", "compiled_for_step", "held_bytes"]
