"""The staged solvers' search over model budgets (``strategies/staged.py``), on a made-up
solver: schedules get faster and predict more as the model budget grows."""

import dataclasses

from fxremat.strategies import staged


@dataclasses.dataclass
class _Candidate:
    peak: int
    makespan: float

    def release(self):
        pass


class _Problem:
    """What the searches use of a ``StagedProblem``: ``make`` (counting what it builds),
    ``fits``, ``budget``, ``outside`` and ``built``."""

    def __init__(self, budget: int):
        self.budget, self.outside, self.built = budget, 0, {}

    def make(self, schedule, unless_above=None):
        if schedule is None:
            return None
        key = schedule.makespan
        if key not in self.built:
            self.built[key] = staged.Probe(schedule, _Candidate(int(schedule.kept[0]), schedule.makespan))
        return self.built[key]

    def fits(self, probe):
        return probe is not None and probe.peak <= self.budget


def _solve_at(model_budget: float):
    """The made-up solver's schedule at a model budget, in steps of 10: its makespan falls
    and its predicted peak (held in ``kept``) grows with the budget, 10% over the model."""
    step = int(model_budget // 10) * 10
    return staged.Schedule([], 1000.0 - step, [1.1 * step])


def test_a_second_view_builds_only_schedules_faster_than_the_first_views_plan():
    problem = _Problem(budget=550)
    plan = staged.search_model_budget(problem, _solve_at, 10, 1000, (1.0,))
    assert plan.peak <= 550 and plan.peak > 400  # near the budget, not the least plan
    beat = plan.makespan
    other = _Problem(budget=550)
    found = staged.search_faster_than(other, _solve_at, 10, 1000, beat)
    # Nothing it built is as slow as the plan to beat, and what it returns is faster or None.
    assert all(key < beat for key in other.built)
    # The first plan fills the budget: nothing faster fits.
    assert plan.peak == 550 and found is None


def test_a_second_view_whose_fastest_schedule_is_not_faster_builds_nothing():
    problem = _Problem(budget=550)
    assert staged.search_faster_than(problem, _solve_at, 10, 1000, beat=0.0) is None
    assert problem.built == {}


def test_a_second_view_finds_the_faster_plan_that_fits():
    # The plan to beat is the least-memory one: the search finds a faster one that fits.
    problem = _Problem(budget=550)
    found = staged.search_faster_than(problem, _solve_at, 10, 1000, beat=_solve_at(10).makespan)
    assert found is not None and 400 < found.peak <= 550


class _SavedBytesProblem(_Problem):
    """Also ``make(schedule, unless_above)`` as ``StagedProblem`` has it: a schedule whose
    saved bytes (here 90% of its predicted peak, a lower bound of it) are over both
    ``unless_above`` and the budget is not built."""

    def __init__(self, budget: int):
        super().__init__(budget)
        self.skipped = []

    def make(self, schedule, unless_above=None):
        if (schedule is not None and unless_above is not None and schedule.makespan not in self.built
                and 0.9 * schedule.kept[0] > max(unless_above, self.budget)):
            self.skipped.append(schedule.makespan)
            return None
        return super().make(schedule, unless_above)


def _solve_curved(model_budget: float):
    """As ``_solve_at``, but the model's overstatement varies (the predicted peak grows with
    the square of the model budget): guesses from one probe miss, and the bisection probes
    schedules over the budget."""
    step = int(model_budget // 10) * 10
    return staged.Schedule([], 1000.0 - step, [0.0011 * step * step + 100])


def test_the_bisection_builds_no_schedule_whose_saved_bytes_are_over_the_budget():
    plain, bounded = _Problem(budget=550), _SavedBytesProblem(budget=550)
    plan = staged.search_model_budget(plain, _solve_curved, 10, 1000, (1.0,))
    found = staged.search_model_budget(bounded, _solve_curved, 10, 1000, (1.0,))
    # The keep-all schedule is built (the search's upper end); in the bisection, none whose
    # saved bytes alone are over the budget, and the plan is the same, filling the budget.
    top = _solve_curved(1000).makespan
    assert bounded.skipped and all(0.9 * probe.peak <= 550 for key, probe in bounded.built.items() if key != top)
    assert found.peak == plan.peak == 550 and len(bounded.built) < len(plain.built)


def _traffic_saved_set(compiler: str = "inductor"):
    """The traffic-optimal saved set of the zoo's transformer (3 layers) and its min-cut plan's
    peak, for the staged searches."""
    import torch

    from conftest import planning_context
    from fxremat import models

    torch.manual_seed(0)
    model, batch = models.make_transformer(batch=2, seq=32, dim=32, layers=3)
    ctx, mincut_plan = planning_context(model, *batch, compiler=compiler)
    return staged.traffic(ctx, mincut_plan), mincut_plan.peak


def test_a_saved_set_whose_fastest_schedule_cannot_beat_an_earlier_plan_builds_nothing(monkeypatch):
    """``fastest`` hands each saved set the makespan to beat (the earlier sets' best): a set
    whose keep-all schedule (the fastest of each view) is not faster returns None unbuilt;
    one that can beat it is searched as without the bound (the same plan)."""
    from fxremat.strategies import SOLVERS

    saved_set, mincut_peak = _traffic_saved_set()
    rotor = SOLVERS["rotor"]
    budget = int(0.8 * mincut_peak)
    plan = staged.plan_around(saved_set, budget, rotor)
    assert plan.peak <= budget
    made = []
    real_make = staged.StagedProblem.make
    monkeypatch.setattr(staged.StagedProblem, "make", lambda self, *a, **k: made.append(a) or real_make(self, *a, **k))
    assert staged.plan_around(saved_set, budget, rotor, beat=plan.plan.cut_cost * 0.5) is None and made == []
    again = staged.plan_around(saved_set, budget, rotor, beat=plan.plan.cut_cost * 2)
    assert again.plan.sequence == plan.plan.sequence and made


def test_fastest_says_which_sets_had_no_faster_plan():
    import types

    def candidate(cost):
        return types.SimpleNamespace(plan=types.SimpleNamespace(cut_cost=cost, notes={}, solver="rotor"))

    sets = [types.SimpleNamespace(label=label, ctx=types.SimpleNamespace(progress=lambda what: None))
            for label in ("traffic", "lean", "knapsack")]
    beats = []

    def plan_one(saved_set, beat):
        beats.append(beat)
        return {"traffic": candidate(2.0), "lean": candidate(1.0), "knapsack": None}[saved_set.label]

    best, why = staged.fastest(sets, plan_one)
    assert best.plan.cut_cost == 1.0 and best.plan.notes["saved_set"] == "lean"
    assert beats == [None, 2.0, 1.0]  # each set is handed the best makespan before it
    assert "knapsack: no plan faster within the budget: lean" in why


def _opening_timeline(recomputation_reads_x: bool):
    """A made-up step: the forward makes ``a`` (a value of the stages whose backward opens
    the backward) and ``x`` (another stage's); the backward opens with ``g1`` and ``g2``
    (``a``'s stages' backward ops), then a recomputation ``r`` that reads ``x`` again, or not."""
    from fxremat.passes.memory import Step, simulate

    bwd = dict(phase="backward")
    steps = [Step("a", allocates={"forward:a": 100}, phase="forward"),
             Step("x", allocates={"forward:x": 50}, phase="forward"),
             Step("tangents_1", allocates={"backward:tangents_1": 10}, **bwd),
             Step("g1", allocates={"backward:g1": 40}, reads=["backward:tangents_1", "forward:a", "forward:x"], **bwd),
             Step("g2", allocates={"backward:g2": 30}, reads=["backward:g1"], **bwd),
             Step("r", allocates={"backward:r": 5}, reads=["forward:x"] if recomputation_reads_x else [], **bwd),
             Step("g3", allocates={"backward:g3": 1}, reads=["backward:g2", "backward:r", "forward:a"], **bwd)]
    return simulate(steps)


def test_a_backward_opening_counts_what_any_plan_opening_so_adds():
    """``timeline.backward_opening``: the opening steps are ``g1`` and ``g2`` (``r`` is not a
    backward op of the opening stages). Where ``r`` reads ``x`` again, ``x`` stays alive
    through ``g2`` (the plan adds 60 bytes over the 160 alive as its backward begins); where
    it does not, ``x`` is freed after ``g1`` (40 bytes). Both openings say 40: the least of
    the two, a lower bound of the peak of either plan."""
    from fxremat.timeline import backward_opening, opens_with

    kept, freed = _opening_timeline(True), _opening_timeline(False)
    at_start = 160
    assert max(kept.live_bytes[3:]) - at_start == 60 and max(freed.live_bytes[3:]) - at_start == 40
    for timeline in (kept, freed):
        added, opening = backward_opening(timeline, {"g1", "g2", "g3"}, {"a"})
        assert added == 40 and [s.name for s in opening] == ["g1", "g2"]
        assert opens_with(kept, opening) and opens_with(freed, opening)
    # Taken as another stage's value, ``a`` is freed after ``g1`` too: 40 - 0 (g1) and 30 (g2 - a).
    added, _ = backward_opening(kept, {"g1", "g2", "g3"}, set())
    assert added == 40
    # An opening is the opening stages' backward ops only.
    added, opening = backward_opening(kept, {"g2", "g3"}, {"a"})
    assert (added, opening) == (0, [])


def test_every_probe_predicts_at_least_its_lower_bound_before_it_is_built(monkeypatch):
    """On the zoo's transformer, Inductor's timeline: every probe the Rotor searches build (the
    least-memory search's and a budget's) predicts at least ``lower_bound`` as known before
    it was built, no two probes opening with the same stages open differently, and the
    bound is more than the bytes alive as the backward begins once an opening is known."""
    from fxremat.plans import BudgetError
    from fxremat.strategies import SOLVERS

    saved_set, mincut_peak = _traffic_saved_set()
    checked, tighter = [], []
    real_build = staged.StagedProblem._build

    def build(self, schedule, light=False, known=None):
        saved = (known or self._saved(schedule))[0]
        bound = self.lower_bound(schedule, saved)
        found = real_build(self, schedule, light, known)
        checked.append(found.peak >= bound)
        tighter.append(bound > self.ctx.backward_start_bytes(saved))
        return found

    monkeypatch.setattr(staged.StagedProblem, "_build", build)
    rotor = SOLVERS["rotor"]
    try:
        staged.plan_around(saved_set, 0, rotor)
    except BudgetError:
        pass
    plan = staged.plan_around(saved_set, int(0.6 * mincut_peak), rotor)
    assert plan.peak <= int(0.6 * mincut_peak)
    openings = saved_set.ctx.memo[next(k for k in saved_set.ctx.memo if k[0] == "staged openings")]
    assert len(checked) > 4 and all(checked) and any(tighter)
    assert openings and all(found is not None for found in openings.values())
