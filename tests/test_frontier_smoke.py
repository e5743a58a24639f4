"""Smoke test of the benchmark frontier (bench/frontier.py): its quick mode on one tiny model
with two strategies (eager, fxremat at budget 1.0), written to a temporary folder."""

import csv
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.inductor
def test_frontier_quick_writes_rows(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "frontier.py"), "--quick", "--models", "mlp",
           "--strategies", "eager,fxremat_1.0", "--steps", "2", "--rounds", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    data = json.loads((tmp_path / "frontier.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert set(rows) == {"eager", "fxremat_1.0"}
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
        assert row["peak_bytes"] > 0
        assert row["step_ms"] > 0
    fx = rows["fxremat_1.0"]
    assert fx["partitions"] >= 1 and fx["solve_s"] > 0  # the partitioner ran and was timed
    assert fx["fx_plans"][0]["predicted_peak_bytes"] > 0
    meta = data["meta"]
    assert meta["threads"] == 1 and meta["machine"]["torch"] and len(meta["loadavg_start"]) == 3

    with open(tmp_path / "frontier.csv", newline="") as f:
        table = {r["name"]: r for r in csv.DictReader(f)}
    assert set(table) == {"eager", "fxremat_1.0"}
    assert all(float(r["peak_mib"]) > 0 for r in table.values())
    assert (tmp_path / "summary.md").exists()
