"""Python's cycle collector while fxremat plans (``partition._collector_while_planning``): the heap from
before planning frozen and young objects collected every ``YOUNG_COLLECTION_THRESHOLD``
allocations during the plan, the process's own settings back afterwards, also when the
budget is refused."""

import gc

import pytest

from fxremat import BudgetError
from fxremat import partition as partition_module

from conftest import transformer_step


@pytest.fixture
def seen_while_planning(monkeypatch):
    seen = []
    planner = partition_module._partition

    def recording(*args, **kwargs):
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        return planner(*args, **kwargs)

    monkeypatch.setattr(partition_module, "_partition", recording)
    return seen


def test_collector_settings_while_planning_and_after(seen_while_planning):
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    transformer_step(0.5)
    assert seen_while_planning
    for threshold, frozen in seen_while_planning:
        assert threshold == (max(before[0], partition_module.YOUNG_COLLECTION_THRESHOLD), *before[1:])
        assert frozen > 0  # what was alive before planning
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_collector_settings_restored_after_a_refusal(seen_while_planning):
    before = gc.get_threshold()
    with pytest.raises(BudgetError):
        transformer_step(1000)  # bytes: under every graph's floor
    assert seen_while_planning
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_automatic_collection_turned_off_by_threshold_stays_off(seen_while_planning):
    before = gc.get_threshold()
    gc.set_threshold(0)
    try:
        transformer_step(0.5)
        assert seen_while_planning and all(threshold[0] == 0 for threshold, _ in seen_while_planning)
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)


def test_a_process_that_froze_its_heap_is_left_as_it_is(seen_while_planning):
    before = gc.get_threshold()
    gc.freeze()
    try:
        transformer_step(0.5)
        assert seen_while_planning and all(threshold == before for threshold, _ in seen_while_planning)
        assert gc.get_freeze_count() > 0  # not unfrozen (frozen objects freed since have left it)
    finally:
        gc.unfreeze()
