"""What fxremat decided for one compiled graph (``Plan``), and the errors and warnings
of a memory budget (``BudgetError``, ``BudgetWarning``, and their messages)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
from typing import Any, Callable, Iterator

import torch.fx as fx

from .floor import Floor
from .options import Options, format_bytes
from .passes.memory import Timeline


class BudgetError(ValueError):
    """The memory budget cannot be met by the available solvers. ``least_bytes``: the
    least predicted peak the solver found for the graph, when it got that far;
    ``floor_bytes``: the graph's floor (``fxremat.floor``), which no plan goes under.
    ``least_candidate`` (internal): the plan that predicted ``least_bytes``, where the search
    raising it had one (a fraction budget starts from it, ``partition._least_plan``)."""

    def __init__(self, message: str, least_bytes: int | None = None, least_candidate: Any = None):
        super().__init__(message)
        self.least_bytes = least_bytes
        self.floor_bytes: int | None = None
        self.least_candidate = least_candidate


class Planned(Exception):
    """Raised by fxremat's partitioner inside ``planning_only()`` once the plan is made:
    ``plan``, with nothing compiled (``fxremat.step`` asks what a graph's least-memory plan
    needs without compiling its code)."""

    def __init__(self, plan: "Plan"):
        super().__init__(f"fxremat: graph {plan.graph_id} planned, not compiled")
        self.plan = plan


_PLANNING_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("fxremat_planning_only", default=False)


@contextlib.contextmanager
def planning_only() -> Iterator[None]:
    """Compiles in this block stop once their plan is made, raising ``Planned``; none is cached."""
    token = _PLANNING_ONLY.set(True)
    try:
        yield
    finally:
        _PLANNING_ONLY.reset(token)


def planning_only_active() -> bool:
    return _PLANNING_ONLY.get()


_JOINT_KEEPER: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("fxremat_joint_keeper", default=None)


@contextlib.contextmanager
def keeping_joint(keep: Callable[[Callable], None]) -> Iterator[None]:
    """Compiles in this block hand ``keep`` a function ``replan(options) -> Plan`` that plans
    their joint graph again under other options, without tracing it again (``joint_keeper``)."""
    token = _JOINT_KEEPER.set(keep)
    try:
        yield
    finally:
        _JOINT_KEEPER.reset(token)


def joint_keeper() -> Callable[[Callable], None] | None:
    return _JOINT_KEEPER.get()


class BudgetWarning(UserWarning):
    """The budget may not hold as asked: Inductor settings that keep memory the plan frees,
    or data-dependent sizes with no known bound."""


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
    step_modules: list[str] | None = None  # the module path of each timeline step ("" for none)
    # Of saved_activation_bytes, those in storages the graph also returns (the step counts them once)
    saved_output_bytes: int = 0

    @property
    def predicted_peak_bytes(self) -> int:
        return self.timeline.peak_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "graph_id": self.graph_id,
            "solver": self.solver,
            "saved": self.saved,
            "saved_activation_bytes": self.saved_activation_bytes,
            "saved_output_bytes": self.saved_output_bytes,
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
            "timeline": self.timeline_records(),
        }

    def timeline_records(self) -> list[dict]:
        """The predicted timeline, a dict a step: ``step``, ``phase``, ``live_bytes``, and
        ``by_kind`` (the live bytes by kind, ``timeline.KINDS``) and ``module`` (the step's
        module path) when the plan has them."""
        from .timeline import live_by_kind

        records = self.timeline.as_records()
        if self.timeline.steps:
            for record, kinds in zip(records, live_by_kind(self.timeline)):
                record["by_kind"] = {k: v for k, v in kinds.items() if v}
        if self.step_modules is not None:
            for record, module in zip(records, self.step_modules):
                record["module"] = module
        return records


def fxremat_error(error: BaseException) -> BaseException | None:
    """fxremat's own error (``BudgetError``, ``OptionError``) in ``error`` or the exceptions it
    wraps (Dynamo's ``inner_exception``, ``__cause__``, ``__context__``), if any."""
    from .options import OptionError

    return wrapped(error, (BudgetError, OptionError))


def wrapped(error: BaseException, kinds: tuple[type, ...]) -> BaseException | None:
    """The first exception of ``kinds`` in ``error`` or the exceptions it wraps (Dynamo's
    ``inner_exception``, ``__cause__``, ``__context__``), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, kinds):
            return error
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


def graph_fingerprint(joint: fx.GraphModule) -> str:
    """The id of a joint graph in plans and messages: a hash of its code."""
    return hashlib.sha256(joint.code.encode()).hexdigest()[:12]


def below_minimum(options: Options, graph_id: str, budget: int, least_bytes: int, least_plan: str,
                  below: str = "the minimum feasible budget", alternative: str = "",
                  least_candidate: Any = None) -> BudgetError:
    """The error for a budget below what the solvers reach: ``least_plan`` (what predicted
    ``least_bytes``; ``least_candidate``: that plan) and the budget that works; then
    ``alternative`` (another solver that goes lower)."""
    asked = options.memory_budget
    return BudgetError(
        f"fxremat: {f'memory_budget={asked.describe(budget)}' if asked else f'a budget of {format_bytes(budget)}'}"
        f" is below {below} for graph {graph_id}: {least_plan} predicts {format_bytes(least_bytes)}. "
        f"Allowed: a budget of at least {least_bytes} bytes (this graph alone needs that much of a byte budget; "
        f"a fraction such as 0.0, the least-memory plan, is feasible on every graph){alternative}.",
        least_bytes, least_candidate)


def below_floor(options: Options, graph_id: str, budget: int, floor: Floor) -> BudgetError:
    """The error for a byte budget under the graph's floor (``fxremat.floor``): what every
    plan keeps to the end of the step (the parameter gradients, the outputs the caller
    holds), or the largest single operation's working set, which no recomputation frees.
    Found without searching: a budget that no plan can meet is refused at once."""
    asked = options.memory_budget
    error = BudgetError(
        f"fxremat: memory_budget={asked.describe(budget)} is below the floor of graph {graph_id}: "
        f"{floor.describe()}, whatever is recomputed. Allowed: a budget of at least {floor.bytes} bytes "
        f"(the least-memory plan may need more; memory_budget=0.0 asks for it).", floor.bytes)
    error.floor_bytes = floor.bytes
    return error


def with_floor(error: BudgetError, floor: Floor) -> BudgetError:
    """``error`` (no plan fits the budget) saying how close its least-memory plan is to the
    graph's floor, with ``floor_bytes`` set."""
    if error.floor_bytes is None:
        error.floor_bytes = floor.bytes
        closeness = (f" ({error.least_bytes / max(floor.bytes, 1):.2f}x the floor)"
                     if error.least_bytes is not None else "")
        error.args = (f"{error.args[0]} No plan can go under the graph's floor of {format_bytes(floor.bytes)}"
                      f"{closeness}: {floor.describe()}.",)
    return error


def over_budget(plan: Plan, options: Options, least: int, solvers: str) -> BudgetError:
    """The error for a solver that recomputes nothing further (solver='mincut') over the budget."""
    return BudgetError(
        f"fxremat: memory_budget={options.memory_budget.describe(plan.budget_bytes)} cannot be met "
        f"for graph {plan.graph_id} by {solvers}: its predicted peak is {format_bytes(least)} (saved activations "
        f"{format_bytes(plan.saved_activation_bytes)}). Allowed: a budget of at least {least} bytes, or "
        f"solver='auto' or 'rotor', which recompute further."
    )
