"""What the solvers over stages share (Rotor, Checkmate, TWRemat): the saved sets they
plan around, the linearization into stages, building a candidate from a sequence of
stage operations, and the search of a solver's model budget against the predicted
timeline. Each solver's module gives ``search(problem: StagedProblem) -> Candidate``."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch.fx as fx

from .. import _compat
from ..candidate import Candidate, Context, extract, make_candidate
from ..joint import differentiable_inputs
from ..options import format_bytes
from ..passes import rotor as rotor_dp
from ..plans import BudgetError, below_minimum
from ..sizes import node_bytes, storage_bytes, storage_node, storage_of
from ..timeline import backward_opening, opens_with
from . import mincut as mincut_strategy

LEAST_LADDER = 4  # model budgets probed above the least one when its plan does not fit
# Saved sets the chain solvers plan around over budget (``saved_sets``), in this order.
SAVED_SETS = ("traffic", "lean", "knapsack")
_SAVED_SET_NAMES = {"traffic": "the traffic-optimal", "lean": "the lean (fewest bytes)", "knapsack": "the knapsack's"}


@dataclasses.dataclass
class SavedSet:
    """A saved set to plan around: ``label`` (``SAVED_SETS``), the context with its bans,
    the backward graph of its plan (what the backward computes), and the saved nodes."""

    label: str
    ctx: Context
    backward: fx.GraphModule
    saved: list[fx.Node]


def traffic(ctx: Context, mincut_plan: Candidate) -> SavedSet:
    """The min-cut plan's (traffic-optimal) saved set."""
    return SavedSet("traffic", ctx, mincut_plan.backward, mincut_plan.saved)


def saved_sets(ctx: Context, mincut_saved: SavedSet) -> list[SavedSet]:
    """The saved sets a chain solver plans around when the min-cut plan is over the
    budget: the traffic-optimal one, and the lean one (fewest bytes, ``joint.mincut_problem``)
    when it differs. A stage Rotor keeps whole holds its part of the saved set: the lean
    one costs some recomputation in the stage's backward but lets more stages be kept."""
    found = [mincut_saved]
    if "lean" not in SAVED_SETS:
        return found
    if "lean saved set" not in ctx.memo:  # the same for every budget: found once per graph
        saved, banned = mincut_strategy.lean(ctx)
        ctx.memo["lean saved set"] = (saved, banned, None if set(saved) == set(mincut_saved.saved) else
                                      extract(ctx, saved, light=True)[1])  # its backward: read for its ops' names
    saved, banned, bwd = ctx.memo["lean saved set"]
    if bwd is not None:
        ctx.costs()  # one cost model for every saved set
        found.append(SavedSet("lean", dataclasses.replace(ctx, banned=banned), bwd, saved))
    return found


def fastest(sets: list[SavedSet], plan_one: Callable[[SavedSet, float | None], Candidate | None]
            ) -> tuple[Candidate, str]:
    """``plan_one`` around each saved set: the plan of least makespan in the solver's model
    (the first on ties), and what each set gave, for the plan's ``why`` ("" for one set).
    Raises the BudgetError naming the least minimum when no set has a plan within the budget.

    ``plan_one(saved_set, beat)``: the set's plan, or None where, given ``beat`` (the least
    makespan of the sets before, model seconds), it can tell unsearched that no plan of the
    set is faster (Rotor: no keep-all schedule is, ``rotor.search``): a later set's plan as
    slow loses the tie to the earlier one."""
    found, errors, slower = [], [], []
    for i, saved_set in enumerate(sets, 1):
        saved_set.ctx.progress(f"planning around {_SAVED_SET_NAMES.get(saved_set.label, saved_set.label)} "
                               f"saved set ({i} of {len(sets)})")
        beat = min((f[1].plan.cut_cost for f in found), default=None)
        try:
            result = plan_one(saved_set, beat)
        except BudgetError as error:
            errors.append(error)
            continue
        if result is None:
            slower.append(saved_set.label)
            continue
        result.plan.notes["saved_set"] = saved_set.label
        found.append((saved_set.label, result))
    if not found:
        raise min(errors, key=lambda e: e.least_bytes if e.least_bytes is not None else float("inf"))
    # Compared by the solver's own model (its makespan over the stages), not the step estimate
    # (``Context.estimate``): on issue #4's transformer the model chose the knapsack's set, which
    # measured 0.951 of per-block checkpointing's time where the lean set measured 0.977
    # (bench/results/cpu/ab_transformer_issue4_knapsack_cut.md); the step estimate prefers the
    # lean set on a 4-block transformer at 0.45. The why names the yardstick.
    label, best = min(found, key=lambda f: f[1].plan.cut_cost)
    if len(sets) == 1:
        return best, ""
    estimates = ", ".join(f"{lab} {res.plan.cut_cost * 1e3:.3f} ms" for lab, res in found)
    said = dict(found)
    failed = "".join(f"; {s.label}: " + ("no plan faster within the budget" if s.label in slower else
                                         "no plan within the budget")
                     for s in sets if s.label not in said)
    names = [_SAVED_SET_NAMES.get(s.label, s.label) for s in sets]
    solver = best.plan.solver
    return best, (f"; planned around {', '.join(names[:-1])} and {names[-1]} saved sets, "
                  f"{solver}'s model makespan {estimates}{failed}: {label}")


def plan(ctx: Context, mincut_plan: Candidate, budget: int, over: bool, solver) -> Candidate:
    """A staged solver asked for by name: its fastest plan within ``budget`` around the
    traffic-optimal saved set, and, over budget, for a chain solver, around the lean one too."""
    first = traffic(ctx, mincut_plan)
    sets = saved_sets(ctx, first) if over and solver.chain else [first]
    best, why = fastest(sets, lambda s, beat: plan_around(s, budget, solver, beat=beat))
    best.plan.notes["why"] = f"solver={solver.name!r} was asked for{why}"
    return best


def linearize(ctx: Context, backward: fx.GraphModule, saved: list[fx.Node], max_stages: int,
              weigh_memory: bool = False):
    """The joint graph's chain of stages (``chain.linearize``) around a saved set whose plan
    has backward graph ``backward``, and each op's estimated seconds (``Context.costs``),
    which cost the stages. ``weigh_memory``: stages of similar time plus memory, for the
    chain solvers."""
    from .. import chain

    in_backward = frozenset(n.name for n in backward.graph.nodes if n.op == "call_function")
    cost = ctx.costs()
    # The same for every budget: found once per graph (a fraction's two searches ask both).
    key = ("linearization", tuple(n.name for n in saved), in_backward, max_stages, weigh_memory)
    if key not in ctx.memo:
        backward_nodes = [n for n in ctx.joint.graph.nodes if n.name in in_backward]
        ctx.memo[key] = chain.linearize(ctx.joint, ctx.classes.forward, ctx.classes.required_forward, ctx.input_names,
                                        backward_nodes, set(saved), cost, max_stages=max_stages,
                                        differentiable=differentiable_inputs(ctx.joint, ctx.classes),
                                        weigh_memory=weigh_memory)
    return ctx.memo[key], cost


@dataclasses.dataclass
class Schedule:
    """What a staged solver gives at one model budget: its operation sequence (Rotor's
    operations over the linearization's stages), its cost in the cost model's seconds,
    and the values its forward phase leaves in memory."""

    sequence: list[rotor_dp.Op]
    makespan: float
    kept: list[fx.Node]


@dataclasses.dataclass
class Probe:
    """A schedule and its candidate, on light graphs (``lite``) until ``Candidate.realize``."""

    schedule: Schedule
    candidate: Candidate

    @property
    def peak(self) -> int:
        return self.candidate.peak


@dataclasses.dataclass
class StagedProblem:
    """A staged solver's problem: the linearization ``lin`` of the joint graph around a saved
    set, each op's cost, the budget, and the bytes alive outside the chain (``outside``);
    ``make`` builds (once per sequence) the candidate of a schedule."""

    ctx: Context
    lin: Any  # chain.Linearization
    cost: dict[fx.Node, float]
    gradients: list[fx.Node]
    outside: int
    syms: list[fx.Node]
    notes: dict[str, Any]
    budget: int
    solver: Any  # strategies.Solver
    built: dict[str, Probe] = dataclasses.field(default_factory=dict)  # sequence -> probe
    kept: Probe | None = None  # the fastest fitting probe: the only one whose graphs are kept
    # sequence -> candidate, shared with this saved set's other searches (``Context.memo``)
    scored: dict[str, Candidate] = dataclasses.field(default_factory=dict)
    # Model seconds a plan must beat to matter (an earlier saved set's plan), or None: a
    # solver that can tell no schedule is faster returns None unsearched (``fastest``).
    beat: float | None = None
    # The stages whose B operations open a backward (B^L, B^{L-1}, ...) -> what its opening steps
    # add at least to the bytes alive as it begins, and those steps (``timeline.backward_opening``),
    # or None where two probes opened differently; shared like ``scored``.
    openings: dict[tuple[int, ...], tuple[int, list] | None] = dataclasses.field(default_factory=dict)
    passed_over_by_opening: bool = False  # (``make``)

    def make(self, schedule: Schedule | None, unless_above: int | None = None) -> Probe | None:
        """The probe of ``schedule`` (None for none); nearby model budgets share plans.
        ``unless_above``: None instead when a lower bound of its peak (``lower_bound``) is over
        both that and the budget: a probe that can neither fit nor predict less than
        ``unless_above`` (the least-memory ladder; 0 in the bisection: a probe that cannot fit);
        ``passed_over_by_opening`` then says whether only the bound's count of the backward's
        opening passed it over."""
        if schedule is None:
            return None
        key = rotor_dp.format_sequence(schedule.sequence)
        known = None  # what the schedule saves, when the bound below had to find it
        self.passed_over_by_opening = False
        if key not in self.built and key not in self.scored and unless_above is not None:
            known = self._saved(schedule)
            above = max(unless_above, self.budget)
            at_start = self.ctx.backward_start_bytes(known[0])
            if at_start + self._opening_bytes(schedule) > above:
                self.passed_over_by_opening = at_start <= above
                return None
        if key not in self.built:
            self.ctx.progress(f"{self.solver.name}: scoring plan {len(self.built) + 1} ({len(self.lin.stages)} stages, "
                              f"{self.solver.name}'s model makespan {schedule.makespan * 1e3:.3f} ms)")
            scored = self.scored.get(key)
            if scored is None:  # not scored by an earlier search (released ones are rebuilt if chosen)
                scored = self.scored[key] = self._build(schedule, light=True, known=known)
                scored.rebuild = lambda: self._build(schedule)
                self._learn_opening(schedule, scored)
            scored.plan.budget_bytes = self.budget
            probe = self.built[key] = Probe(schedule, scored)
            # Only a fitting probe can be the plan, and the search keeps the fastest (the
            # first on ties): the others' graphs are released as soon as they lose.
            if not self.fits(probe):
                scored.release()
            elif self.kept is None or probe.schedule.makespan < self.kept.schedule.makespan:
                if self.kept is not None:
                    self.kept.candidate.release()
                self.kept = probe
            else:
                scored.release()
        return self.built[key]

    def fits(self, probe: Probe | None) -> bool:
        return probe is not None and probe.peak <= self.budget

    def lower_bound(self, schedule: Schedule, saved: list[fx.Node]) -> int:
        """A lower bound of the predicted peak of ``schedule``, which saves ``saved``, before it
        is built: the bytes alive as its backward begins (``Context.backward_start_bytes``),
        plus what the steps opening its backward add to them (``_opening_bytes``)."""
        return self.ctx.backward_start_bytes(saved) + self._opening_bytes(schedule)

    def _opening_bytes(self, schedule: Schedule) -> int:
        """What the steps opening the backward of ``schedule`` add at least to the bytes alive
        as it begins, where a probe built before opened its backward with the same stages' B
        operations (``timeline.backward_opening``: those steps are then the same, whatever else
        the plans keep); else 0."""
        opening = self.openings.get(_opening_stages(schedule.sequence))
        return opening[0] if opening else 0

    def _learn_opening(self, schedule: Schedule, candidate: Candidate) -> None:
        """Record what the backward of a probe just built opens with, or check it: a probe
        opening with the same stages' B operations must open with the same steps (else no
        bound is taken from them: ``lower_bound``)."""
        stages = _opening_stages(schedule.sequence)
        timeline = candidate.plan.timeline
        if stages not in self.openings:
            ran = [self.lin.stages[i - 1] for i in stages if i <= len(self.lin.stages)]
            # Their backward ops, and the ops computable from the inputs alone (which the
            # emitter writes where they are read); their forward values.
            opening_ops = {n.name for st in ran for n in st.backward} | {n.name for n in self.lin.free}
            self.openings[stages] = backward_opening(timeline, opening_ops, {n.name for st in ran for n in st.forward})
        elif self.openings[stages] is not None and not opens_with(timeline, self.openings[stages][1]):
            self.openings[stages] = None

    def too_small(self, least: Probe) -> BudgetError:
        return below_minimum(self.ctx.options, self.ctx.graph_id, self.budget, least.peak,
                             f"the least-memory {self.solver.name} plan ({len(self.lin.stages)} stages)",
                             least_candidate=least.candidate)

    def _saved(self, schedule: Schedule) -> tuple[list[fx.Node], set]:
        """What the forward of ``schedule`` saves, in graph order, and which (operation,
        node) copies its backward keeps alive (``emit.backward_reads``)."""
        from .. import emit

        ctx, lin = self.ctx, self.lin
        # Keep storages, not views (views are made again where read; see candidate.check_no_aliasing).
        kept = {n if storage_of(n) in ctx.input_names else (storage_node(n) or n) for n in schedule.kept + lin.pinned}
        # Save what the backward reads of what the sequence keeps (kept values no op
        # reads are not saved), the step inputs it reads, and the symbolic sizes.
        reads, alive = emit.backward_reads(ctx.joint, lin, schedule.sequence, self.gradients, ctx.facts.impure,
                                            ctx.facts.inputs)
        missing = sorted(n.name for n in reads if n.op != "placeholder" and (n not in kept or n in lin.free))
        if missing:
            raise KeyError(f"fxremat {self.solver.name}: the backward reads {missing}, which the forward does not keep")
        saved = [n for n in ctx.joint.graph.nodes
                 if n in self.syms or (n in reads and (n in kept or _compat.is_primal(n)))]
        return saved, alive

    def _build(self, schedule: Schedule, light: bool = False, known: tuple | None = None) -> Candidate:
        """The candidate of ``schedule``; ``known``: its ``_saved``, if found already."""
        from .. import emit

        ctx, lin = self.ctx, self.lin
        saved, alive = known or self._saved(schedule)
        fwd, template = extract(ctx, saved, backward_template=True, light=light)
        bwd, recomputed, _ = emit.emit_backward(template, ctx.joint, lin, schedule.sequence,
                                                ctx.classes.bwd_outputs, alive)
        found = make_candidate(ctx, self.solver.name, fwd, bwd, saved, schedule.makespan, recomputed,
                               sequence=rotor_dp.format_sequence(schedule.sequence),
                               stages=len(lin.stages))
        found.plan.budget_bytes = self.budget
        found.plan.notes = dict(self.notes)
        return found


def _opening_stages(sequence: list[rotor_dp.Op]) -> tuple[int, ...]:
    """The stages of the B operations that open the backward phase of ``sequence``, in order:
    each ran its F_all last in the forward phase, so the values they read are the same in
    every sequence that opens so (the loss stage, after the last, has no ops)."""
    first = next((i for i, op in enumerate(sequence) if op.kind == rotor_dp.B), len(sequence))
    stages = []
    for op in sequence[first:]:
        if op.kind != rotor_dp.B:
            break
        stages.append(op.stage)
    return tuple(stages)


MERGES_SAID = 4  # stage merges a plan's notes name


def plan_around(saved_set: SavedSet, budget: int, solver, max_stages: int | None = None,
                beat: float | None = None) -> Candidate | None:
    """The fastest plan of a staged ``solver`` over the linearization around ``saved_set``
    whose predicted peak fits ``budget``. Raises BudgetError. ``beat`` (model seconds): None
    where the solver can tell unsearched that no plan is faster than that (Rotor); a solver
    that cannot tell returns its plan."""
    ctx = saved_set.ctx
    classes = ctx.classes
    lin, cost = linearize(ctx, saved_set.backward, saved_set.saved, max_stages or solver.max_stages,
                          weigh_memory=solver.chain)
    # Memory outside the chain, counted as alive throughout (an upper bound): the
    # forward's outputs, the parameter gradients (Rotor's chain counts those its stages
    # make), the tangents and the pinned values.
    gradients = [n for n in classes.bwd_outputs if isinstance(n, fx.Node)]
    outside = (storage_bytes([n for n in classes.fwd_outputs if isinstance(n, fx.Node)], ctx.input_names)
               + sum(node_bytes(n) for n in gradients)
               + tangent_bytes(ctx)
               + storage_bytes(lin.pinned, ctx.input_names))
    syms = [n for n in saved_set.saved if _compat.is_sym_node(n)]
    notes: dict[str, Any] = {"stages": len(lin.stages), "pinned_bytes": storage_bytes(lin.pinned, ctx.input_names),
                             "cost_model": ctx.options.cost_model}
    if lin.merged:  # what kept the chain short (the first few merges: each names its value)
        notes["stages_merged"] = lin.merged[:MERGES_SAID] + (
            [f"and {len(lin.merged) - MERGES_SAID} more merges"] if len(lin.merged) > MERGES_SAID else [])
    shared = ctx.memo.setdefault(("staged probes", solver.name, max_stages or solver.max_stages,
                                  tuple(n.name for n in saved_set.saved), len(lin.stages)), {})
    openings = ctx.memo.setdefault(("staged openings", solver.name, max_stages or solver.max_stages,
                                    tuple(n.name for n in saved_set.saved), len(lin.stages)), {})
    problem = StagedProblem(ctx, lin, cost, gradients, outside, syms, notes, budget, solver, scored=shared,
                            beat=beat, openings=openings)
    return solver.strategy().search(problem)


def tangent_bytes(ctx: Context) -> int:
    """The incoming gradients' bytes (the joint graph's tangents), which the backward is handed."""
    return sum(node_bytes(n) for n in ctx.joint.graph.nodes if _compat.is_tangent(n))


# A fitting plan predicting within this fraction of the budget ends the bisection.
FULL = 0.001


def search_model_budget(problem: StagedProblem, solve_at: Callable[[float], Schedule | None], least_model: float,
                        most_model: float, slack: tuple[float, ...]) -> Candidate:
    """The fastest plan whose predicted peak fits the budget, over the solver's model budgets
    from ``least_model`` (times ``slack`` factors until a plan is found) to ``most_model``.
    ``solve_at(model_budget)``: the solver's schedule, or None when it finds none."""
    make, fits, budget, outside = problem.make, problem.fits, problem.budget, problem.outside
    least = None
    for factor in slack:
        least = make(solve_at(least_model * factor))
        if least is not None:
            least_model *= factor
            break
    if least is None:
        raise BudgetError(f"fxremat: {problem.solver.name} found no plan for graph {problem.ctx.graph_id} at any "
                          f"budget (its least-memory model budget is {format_bytes(int(least_model))}); try solver='rotor'.")
    if not fits(least):
        # The model is an upper bound of the predicted timeline, and not a monotone one:
        # a plan at a somewhat larger model budget can predict less (it keeps a value
        # the least-memory plan recomputes next to a larger one). Probe a ladder of
        # model budgets before calling the budget infeasible; the least predicted of
        # all probes is the minimum feasible budget the error names.
        probes = [least]
        # The last rung is the plan that keeps every stage: the model is least accurate near
        # its least plans, and at a fraction of 1.0 the budget is what keeping all needs.
        for k in range(1, LEAST_LADDER + 2):
            model_budget = least_model * (most_model / least_model) ** (k / (LEAST_LADDER + 1))
            # A rung whose bytes alive as its backward begins are over the budget and the least
            # peak so far can change neither outcome: not built (most rungs of the least-memory search).
            found = make(solve_at(model_budget), unless_above=min(p.peak for p in probes))
            if found is not None:
                probes.append(found)
                if fits(found):
                    least, least_model = found, model_budget
                    break
        if not fits(least):
            raise problem.too_small(min(probes, key=lambda f: f.peak))
    # The solvers' models are upper bounds of the predicted timeline, not the timeline
    # itself, so search the model budget: the largest one whose plan's *predicted*
    # peak fits. A larger model budget never gives a slower plan, so that plan is the
    # fastest the search sees; keep the fastest fitting plan found on the way.
    top = make(solve_at(most_model))
    if fits(top):
        return top.candidate
    return _bisect(problem, solve_at, least, least_model, most_model).candidate


def search_faster_than(problem: StagedProblem, solve_at: Callable[[float], Schedule | None], least_model: float,
                       most_model: float, beat: float) -> Candidate | None:
    """``search_model_budget``'s plan among the schedules faster than ``beat`` (model
    seconds) alone, or None when none of them fits: the chain of another view of the same
    linearization, whose plan can win over the ``beat`` one only by being faster. A schedule at least as slow
    is not built: whether it fits or not, a faster one needs a larger model budget (a
    larger model budget never gives a slower plan), so the search moves up past it."""
    top_schedule = solve_at(most_model)
    if top_schedule is None or top_schedule.makespan >= beat:
        return None  # the fastest schedule of this view does not beat it
    top = problem.make(top_schedule)
    if problem.fits(top):
        return top.candidate
    found = _bisect(problem, solve_at, None, least_model, most_model, last=(top, most_model), beat=beat)
    return found.candidate if found is not None else None


def _bisect(problem: StagedProblem, solve_at: Callable[[float], Schedule | None], best: Probe | None, lo: float,
            hi: float, last: tuple[Probe, float] | None = None, beat: float | None = None) -> Probe | None:
    """The fastest fitting probe between the model budgets ``lo`` (whose plan ``best``
    fits, when given) and ``hi`` (whose plan does not), bisecting on fit; ``last``: the
    last probe built and its model budget, from which the first guess is made. With
    ``beat``, schedules at least that slow are passed over unbuilt (``search_faster_than``)."""
    make, fits, budget, outside = problem.make, problem.fits, problem.budget, problem.outside
    # Guess where the predicted peak meets the budget from the model's overstatement at
    # the last probe, then bisect what is left; stop at 2% apart. A guess that overshot
    # or gave a plan already seen is followed by a bisection step: guessing again from
    # the same plan lands a hair lower each time and never gets away from it (the
    # 12-layer transformer at 0.25 spent every step that way and kept a 2.4x slower plan).
    last_probe, last_model = last if last is not None else (best, lo)
    last_peak = last_probe.peak
    # A schedule passed over only because the bound counts its backward's opening (``make``):
    # built after all if the next guess is made from it (most are not: after a guess that
    # does not fit comes a bisection step), so that the search takes the path it took when
    # such schedules were built, and the plans it finds are the same.
    pending: tuple[Schedule, float] | None = None
    guessing, built, passed = True, 0, 0
    while built < 8 and passed < 16:
        if hi <= lo * 1.02:
            break
        if guessing and pending is not None:
            last_peak, last_model = make(pending[0]).peak, pending[1]
            pending = None
        overstatement = last_peak / max(last_model + outside, 1.0)
        guess = budget / overstatement - outside
        guessed = guessing and lo < guess < hi
        mid = guess if guessed else ((lo + hi) / 2 if hi < 4 * lo else (lo * hi) ** 0.5)
        schedule = solve_at(mid)
        if beat is not None and (schedule is None or schedule.makespan >= beat):
            lo, guessing, passed = mid, True, passed + 1  # too slow (or none): look higher
            continue
        built += 1
        seen = len(problem.built)
        # A schedule whose peak's lower bound is over the budget cannot fit: not built (where
        # only the bytes alive as its backward begins are, the next guess is made from the
        # last probe built, as before the opening was counted).
        found = make(schedule, unless_above=0)
        if fits(found):
            lo = mid
            if best is None or found.schedule.makespan < best.schedule.makespan:
                best = found
            if found.peak >= (1 - FULL) * budget:
                break  # the budget is full: a larger model budget's plan predicts more
        else:
            hi = mid
        # After a bisection, guess again; after a guess, only if it fitted with a new plan.
        guessing = not guessed or (fits(found) and len(problem.built) > seen)
        if found is not None:
            last_peak, last_model, pending = found.peak, mid, None
        elif getattr(problem, "passed_over_by_opening", False):
            pending = (schedule, mid)
    return best
