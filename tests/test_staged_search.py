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
