"""A refactoring guard: the plans fxremat makes on the bundled models (saved sets,
recomputed values, operation sequences, predicted peaks, budget errors) equal the ones
recorded in ``tests/fixtures/plans.json`` (``tests/plan_cases.py`` says how they were
made and how to record them again when a change means to alter plans).

The suite checks a quick subset; ``FXREMAT_ALL_PLAN_CASES=1`` checks every recorded case
(every solver, four budgets, four models, both compilers' timelines: ~20 minutes)."""

import json
import os

import pytest
import torch

import plan_cases

RECORDED = json.loads(plan_cases.FIXTURE.read_text())
ALL = os.environ.get("FXREMAT_ALL_PLAN_CASES") == "1"


def _selected(case) -> bool:
    return ALL or case_id(case) in plan_cases.QUICK


def case_id(case) -> str:
    return plan_cases.case_id(case)


@pytest.mark.skipif(RECORDED["torch"] != torch.__version__,
                    reason=f"plans recorded on torch {RECORDED['torch']}: other releases trace other graphs")
@pytest.mark.parametrize("case", [c for c in plan_cases.cases() if _selected(c)], ids=case_id)
def test_plan_equals_the_recorded_one(case):
    # planned with the scratch bytes recorded beside the plan: a CPU convolution's are
    # measured, and differ between CPUs (oneDNN's AVX-512 and AVX2 paths)
    recorded = dict(RECORDED["plans"][case_id(case)])
    scratch = recorded.pop("scratch")
    got = plan_cases.record(case, scratch)
    got.pop("scratch")
    assert got == recorded


def test_the_quick_subset_covers_every_solver_and_both_compilers():
    quick = [c for c in plan_cases.cases() if case_id(c) in plan_cases.QUICK]
    assert len(quick) == len(plan_cases.QUICK)  # no stale names
    assert {c[1] for c in quick} == set(plan_cases.SOLVERS)
    assert {c[3] for c in quick} == {"eager", "inductor"}
    assert any("error" in RECORDED["plans"][case_id(c)] for c in quick)  # a budget error, too
