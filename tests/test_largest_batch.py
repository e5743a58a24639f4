"""bench/largest_batch.py's search: the largest batch under a cap, from a line and bisection."""

import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"


def _module():
    import sys

    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("largest_batch", BENCH / "largest_batch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


largest_batch = _module()


def _oracle(limit: int, fixed: int, per_sample: int, bend: int = 0):
    """Fits while the batch is at most ``limit``; the peak grows by ``per_sample`` a sample, and by
    ``bend`` more per sample past 16 (a peak that is not linear, as GPT-2's loss graph's)."""
    calls = []

    def run(batch, line):
        calls.append((batch, line))
        peak = fixed + per_sample * batch + bend * max(0, batch - 16)
        return {"batch": batch, "fits": batch <= limit, "peak_allocated_bytes": peak}

    return run, calls


@pytest.mark.parametrize("limit,bend", [(37, 0), (20, 0), (597, 0), (30, 5), (9, 0), (12, 3)])
def test_search_brackets_the_largest_batch(limit, bend):
    run, calls = _oracle(limit, fixed=100, per_sample=10, bend=bend)
    target = 100 + 10 * limit + bend * max(0, limit - 16)  # the peak at the limit
    row = largest_batch.search(run, base=8, target=target * (1 + bend / 100), probes=8, step=0.05)
    assert row["largest_batch"] == limit
    assert row["smallest_failed_batch"] == limit + 1
    assert len(calls) <= 2 + 8


def test_the_line_counts_only_where_it_runs_the_searched_configuration():
    run, _ = _oracle(40, fixed=0, per_sample=10)
    # the line's probes fit; the searched ones (fxremat at a byte budget) all fail
    def fxremat(batch, line):
        return dict(run(batch, line), fits=line or False)

    row = largest_batch.search(fxremat, base=8, target=400, probes=6, step=0.05, line_counts=False)
    assert row["largest_batch"] is None and row["at_largest"] is None
    assert row["smallest_failed_batch"] == 17  # bisected down to just above the line's 16
    row = largest_batch.search(fxremat, base=8, target=400, probes=6, step=0.05, line_counts=True)
    assert row["largest_batch"] == 16


def test_next_batch_steps_up_until_a_failure_and_stops_when_bracketed():
    nb = largest_batch.next_batch
    assert nb([{"batch": 40, "fits": True}], 0.05) == 42
    assert nb([{"batch": 40, "fits": False}], 0.05) == 38
    assert nb([{"batch": 40, "fits": True}, {"batch": 50, "fits": False}], 0.05) == 45
    assert nb([{"batch": 40, "fits": True}, {"batch": 41, "fits": False}], 0.05) is None
    assert nb([{"batch": 1, "fits": False}], 0.05) is None
