"""Smoke test of the benchmark frontier (bench/frontier.py): its quick mode on one tiny model
with eager, fxremat at budget 1.0, fxremat at the measured peak of per-block checkpointing
(which brings ckpt_blocks along) and fxremat at its least feasible budget, written to a
temporary folder; then its summary and strategy list on made-up rows, without running; and the
helpers every bench script shares (bench/results_io.py, bench/plan_records.py)."""

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
           "--strategies", "eager,fxremat_1.0,fxremat_at_ckpt_blocks,fxremat_min", "--steps", "2", "--rounds", "1",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    data = json.loads((tmp_path / "frontier.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    names = {"eager", "fxremat_1.0", "ckpt_blocks", "fxremat_at_ckpt_blocks", "fxremat_min"}
    assert set(rows) == names
    at = rows.pop("fxremat_at_ckpt_blocks")
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
        assert row["peak_bytes"] > 0
        assert row["step_ms"] > 0
    fx = rows["fxremat_1.0"]
    assert fx["partitions"] >= 1 and fx["solve_s"] > 0  # the partitioner ran and was timed
    assert fx["fx_plans"][0]["predicted_peak_bytes"] > 0
    # matched: a byte budget equal to ckpt_blocks' measured peak, which every plan's prediction meets,
    # or a BudgetError naming a larger least feasible budget (the planner's verdict, not the bench's)
    assert at["budget_bytes"] == rows["ckpt_blocks"]["peak_bytes"] == at["match_peak_bytes"]
    if at["status"] == "ok":
        assert all(p["budget_bytes"] == at["budget_bytes"] >= p["predicted_peak_bytes"] for p in at["fx_plans"])
    else:
        assert frontier_least(at["error"]) > at["budget_bytes"], at["error"]
    # least: the 1-byte probe failed and named the budget the measured run used
    least = rows["fxremat_min"]
    assert least["budget_probes"][0]["budget_bytes"] == 1
    assert least["budget_bytes"] == least["budget_probes"][-1]["least_bytes"] > 1
    entry = next(e for e in data["summary"] if e["table"] == "at_ckpt_blocks")
    assert entry["fxremat_min"]["budget_bytes"] == least["budget_bytes"]
    assert (entry["fxremat_at"] or {}).get("budget_bytes", at["budget_bytes"]) == at["budget_bytes"]
    meta = data["meta"]
    assert meta["threads"] == 1 and meta["machine"]["torch"] and len(meta["loadavg_start"]) == 3

    with open(tmp_path / "frontier.csv", newline="") as f:
        table = {r["name"]: r for r in csv.DictReader(f)}
    assert set(table) == names
    assert int(table["fxremat_min"]["budget_bytes"]) == least["budget_bytes"]
    assert all(float(r["peak_mib"]) > 0 for r in table.values() if r["status"] == "ok")
    assert (tmp_path / "summary.md").exists()


def frontier_least(error):
    return _frontier().least_budget_bytes(error)


def _frontier():
    """bench/frontier.py as a module (it puts bench/ on sys.path for the frontier_* modules it imports)."""
    return _bench("frontier")


def _bench(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_bench", os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_files_get_the_same_metadata_and_keep_their_own(tmp_path):
    results_io = _bench("results_io")
    results_io.write_json(str(tmp_path / "a" / "flat.json"), {"date": "mine", "rows": [1]})
    flat = json.loads((tmp_path / "a" / "flat.json").read_text())
    assert flat["date"] == "mine" and flat["rows"] == [1]
    assert flat["command"].startswith("python bench/") and flat["cpus"] == os.cpu_count() and "commit" in flat["git"]
    data = {"meta": {"scipy": "x"}, "rows": []}
    results_io.write_json(str(tmp_path / "nested.json"), data)
    nested = json.loads((tmp_path / "nested.json").read_text())
    assert set(nested) == {"meta", "rows"} and nested["meta"]["scipy"] == "x" and nested["meta"]["torch"]
    assert data == {"meta": {"scipy": "x"}, "rows": []}  # the caller's dict is not changed
    results_io.write_json(str(tmp_path / "bare.json"), {"rows": []}, add_metadata=False)
    assert json.loads((tmp_path / "bare.json").read_text()) == {"rows": []}


def test_least_budget_from_the_planners_messages():
    least_budget = _bench("plan_records").least_budget
    fraction = ("BudgetError: ... Allowed: a budget of at least 1572864 bytes, or a fraction of at least 0.120 "
                "(a fraction applies to each compiled graph on its own ...).")
    assert least_budget(fraction) == (1572864, "0.120")
    assert least_budget("x Allowed: a budget of at least 7 bytes.\n y Allowed: a budget of at least 9 bytes.") == (9, None)
    assert least_budget("RuntimeError: out of memory") is None and least_budget(None) is None


def test_least_budget_bytes_from_budget_error():
    frontier = _frontier()
    error = ("BudgetError: fxremat: memory_budget=1 B (1 B) is below the minimum feasible budget for graph g0: "
             "the least-memory rotor plan (12 stages) predicts 1.50 MiB. Allowed: a budget of at least 1572864 "
             "bytes. [exit 1]")
    assert frontier.least_budget_bytes(error) == 1572864
    assert frontier.least_budget_bytes("RuntimeError: Allowed: a budget of at least 5 bytes") is None
    assert frontier.least_budget_bytes(None) is None
    # A child's stderr ends with the BudgetError raised as itself (module-qualified), or wrapped by Dynamo.
    for last in ("fxremat.plans.BudgetError: ", "torch._dynamo.exc.BackendCompilerFailed: backend='fxremat' raised:\n"
                 "BudgetError: "):
        text = _bench("frontier_child").error_text(1, "Traceback (most recent call last):\n  File x\n" + last + error.split(": ", 1)[1])
        assert text.startswith("BudgetError: fxremat:") and frontier.least_budget_bytes(text) == 1572864


def test_summary_at_the_memory_of_per_block_checkpointing():
    frontier = _frontier()
    MIB = 2**20

    def row(name, kind, peak, ms, **extra):
        return dict(model="m", name=name, kind=kind, status="ok", peak_bytes=peak * MIB, step_ms=ms, **extra)

    rows = [row("inductor", "inductor", 20, 100), row("ckpt_blocks", "ckpt_blocks", 10, 130),
            row("pt_budget_0.5", "pt_budget", 12, 110, budget=0.5), row("pt_budget_0.1", "pt_budget", 9, 150, budget=0.1),
            row("fxremat_1.0", "fxremat", 20, 95, budget=1.0, solver="auto"),
            row("fxremat_at_ckpt_blocks", "fxremat", 10, 117, solver="auto", match="ckpt_blocks",
                budget_bytes=10 * MIB),
            row("fxremat_min", "fxremat", 6, 160, solver="auto", least=True, budget_bytes=6 * MIB),
            dict(model="m", name="fxremat_at_pt_budget_0.5", kind="fxremat", status="failed", match="pt_budget_0.5",
                 error="BudgetError: too small")]
    summary = frontier.summarize(rows)
    at = [e for e in summary if e["table"] == "at_ckpt_blocks"]
    assert len(at) == 1
    e = at[0]
    assert e["ckpt_blocks"]["step_ms"] == 130 and e["fxremat_at"]["budget_bytes"] == 10 * MIB
    assert abs(e["ratio"] - 0.9) < 1e-12 and e["peak_ratio"] == 1.0
    assert e["pt_budget"]["name"] == "pt_budget_0.1" and abs(e["pt_ratio"] - 117 / 150) < 1e-12
    assert e["fxremat_min"]["peak_bytes"] == 6 * MIB and abs(e["min_peak_ratio"] - 0.6) < 1e-12
    matched = {e["name"]: e for e in summary if e["table"] == "matched"}
    assert matched["fxremat_at_ckpt_blocks"]["ratio"] == e["ratio"]
    assert matched["fxremat_at_pt_budget_0.5"]["fxremat"] is None
    assert "BudgetError" in matched["fxremat_at_pt_budget_0.5"]["note"]
    assert {e["table"] for e in summary} == {"targets", "at_ckpt_blocks", "matched"}
    meta = {"device": "cpu", "scale": "tiny", "command": "x", "date": "d", "threads": 1, "rounds": 1, "steps": 1,
            "loadavg_start": [0.0, 0.0, 0.0], "rockmate": "-", "machine": {"cpu": "c", "cpu_count": 2, "torch": "t"}}
    text = frontier.summary_markdown({"meta": meta, "rows": rows, "summary": summary})
    assert "## At the memory of per-block checkpointing" in text and "**0.90**" in text and "1.000" in text


def test_matched_strategies_and_their_peers():
    import argparse

    frontier = _frontier()
    args = argparse.Namespace(pt_budgets=[0.5], segments=[2], fx_budgets=[1.0], solver_budgets=[], solvers=["auto"],
                              fx_match=["ckpt_blocks", "pt_budget_0.1"], fx_min=True, rockmate=False,
                              strategies=["inductor", "fxremat_at_ckpt_blocks", "fxremat_at_pt_budget_0.1"])
    names = [s["name"] for s in frontier.strategy_list(args)]
    assert names == ["inductor", "pt_budget_0.1", "ckpt_blocks", "fxremat_at_ckpt_blocks", "fxremat_at_pt_budget_0.1"]
    args.fx_match = ["sac_mmm"]
    with pytest.raises(ValueError):
        frontier.strategy_list(args)


@pytest.mark.inductor
def test_paired_ab_compiles_both_in_one_process_and_pairs_their_rounds(tmp_path):
    """bench/ab.py on the tiny transformer: fxremat at ckpt_blocks' measured peak, planned
    within it, and one paired ratio per round; a variant with the same options plans again
    (its own compiled frame, not the first fxremat contender's) and gets the same plan."""
    out = tmp_path / "ab.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "ab.py"), "--scale", "tiny", "--rounds", "3",
           "--variant-options", "{}", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    peer, fx = result["peer"], result["fxremat"]
    assert peer["name"] == "ckpt_blocks" and result["budget_bytes"] == peer["peak_bytes"] > 0
    assert all(p["predicted_peak_bytes"] <= result["budget_bytes"] for p in result["fx_plans"])
    assert 0 < fx["peak_bytes"] <= result["budget_bytes"] * 1.005
    assert len(peer["step_s"]) == len(fx["step_s"]) == 3
    ratios = sorted(f / p for f, p in zip(fx["step_s"], peer["step_s"]))
    assert result["paired_ratio_median"] == ratios[1]
    assert "paired ratio" in done.stdout
    variant = result["variant"]
    assert len(variant["fx_plans"]) == len(result["fx_plans"]) >= 1 and variant["same_plans"]
    assert len(variant["step_s"]) == 3 and 0 < variant["peak_bytes"] <= result["budget_bytes"] * 1.005
    ratios = sorted(v / f for v, f in zip(variant["step_s"], fx["step_s"]))
    assert variant["paired_vs_fxremat"]["median"] == ratios[1]


def test_plan_time_bench_runs_and_reports(tmp_path):
    """``bench/plan_time.py`` on a 1-layer transformer: a row per model with both planners'
    times and memory, and the Markdown table."""
    plan_time = _bench("plan_time")
    assert plan_time.main(["--layers", "1", "--repeat", "1", "--out", str(tmp_path), "--name", "t"]) == 0
    data = json.loads((tmp_path / "t.json").read_text())
    (row,) = data["rows"]
    assert row["joint_nodes"] > 0 and row["fxremat_s"] > 0 and row["pytorch_budget_s"] > 0
    assert row["fxremat_peak_python_bytes"] > 0 and row["fxremat_infeasible_bytes_result"]["error"] == "BudgetError"
    assert "| transformer | 1 |" in (tmp_path / "t.md").read_text()


@pytest.mark.inductor
def test_first_call_bench_times_every_mode(tmp_path):
    """``bench/first_call.py`` on a 1-layer transformer: plain torch.compile, PyTorch's budget
    partitioner and fxremat each compile in a fresh process, with the parts Dynamo timed, and the Markdown table; a child
    that fails names its exception (a byte budget under the least names the BudgetError)."""
    first_call = _bench("first_call")
    assert first_call.main(["--layers", "1", "--repeat", "1", "--budget", "0.9", "--out", str(tmp_path),
                            "--name", "t"]) == 0
    rows = {r["mode"]: r for r in json.loads((tmp_path / "t.json").read_text())["rows"]}
    assert set(rows) == {"torch", "torch_budget", "fxremat"}
    for row in rows.values():
        assert "error" not in row, row
        assert row["total_s"] > 0 and row["partition_s"] > 0 and row["backward_compile_s"] > 0
    table = (tmp_path / "t.md").read_text()
    assert "| 1 | torch.compile |" in table and "| 1 | fxremat 0.9 |" in table
    assert "| 1 | torch.compile, PyTorch's budget 0.9 |" in table

    results_io = _bench("results_io")
    failed = results_io.run_child(os.path.join(ROOT, "bench", "first_call.py"),
                                  {"layers": 1, "mode": "fxremat", "budget": 1, "run": 0})  # 1 byte
    assert failed["error"].startswith("BudgetError"), failed


def test_plan_as_cuda_plans_the_cuda_graph_on_the_cpu(tmp_path):
    """``bench/plan_as_cuda.py`` (in its own process: it reroutes the attention op) on a tiny
    Hugging Face GPT-2: the graph has CUDA's memory-efficient attention, its values are on a
    fake CUDA device, and Rotor's chain keeps a stage per block and more around both saved
    sets (before the pinned-mask rule of ``chain._stages`` it had 12 and 11 stages here, where
    it now has 21: the recomputed mask merged them)."""
    out = tmp_path / "plan.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plan_as_cuda.py"), "--model", "gpt2",
                          "--scale", "tiny", "--sizes", '{"layers": 2, "seq": 128, "batch": 2}', "--budget", "0.0",
                          "--solver", "rotor", "--stages", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["joint_nodes"] > 0 and result["solver_used"] == "rotor"
    assert min(result["stages"].values()) == max(result["stages"].values()) > 12, result["stages"]
    assert result["plan_stages"] == result["stages"]["traffic"]


def test_step_plans_finds_the_least_budget_and_runs_at_it(tmp_path):
    """``bench/step_plans.py --budget least`` (what a GPU session runs on models outside the
    zoo): a 1-byte budget's error names the step's least budget, and a fresh compile runs at
    it, its plans made in the process (caches off) and its step measured within it."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "step_plans.py"), "--model", "mlp",
                          "--scale", "tiny", "--sizes", '{"layers": 2}', "--budget", "least", "--device", "cpu",
                          "--steps", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    runs = json.loads((tmp_path / "step_plans.json").read_text())["runs"]
    assert [r["budget"] for r in runs][:1] == [1] and runs[0]["error"] and len(runs) == 2, runs
    least = _bench("plan_records").least_budget(runs[0]["error"]).bytes
    assert runs[1]["budget"] == least and runs[1]["error"] is None
    assert [p["budget_bytes"] for p in runs[1]["plans"]] == [least]
    # within it to the byte: the frontier's steps hold their loss through ``backward()``,
    # which ``hold_outputs=False`` counts (the loss's 4 bytes over before, ``sizes.held_outputs``)
    assert runs[1]["measured_step_peak_bytes"] <= least


def test_a_strategys_solver_comes_from_its_options_unless_it_names_one():
    """``bench/ab.py --variant-options '{"solver": "rotor"}'`` compiled the variant with "auto":
    the strategy's default solver overrode the options' (2026-11-30)."""
    strategies = _bench("frontier_strategies")
    fxremat = {"kind": "fxremat"}
    assert strategies.fxremat_options({"fx_options": {"solver": "rotor"}}, fxremat, 100)["solver"] == "rotor"
    assert strategies.fxremat_options({}, fxremat, 100) == {"solver": "auto", "memory_budget": 100}
    named = {"kind": "fxremat", "solver": "knapsack"}
    assert strategies.fxremat_options({"fx_options": {"solver": "rotor"}}, named, 0.5)["solver"] == "knapsack"


@pytest.mark.parametrize("tool, argv", [
    ("ab", ["--budget-bytes", "1000", "--budget-fraction", "0.5"]),
    ("kernel_split", ["--budget-bytes", "1000", "--budget-fraction", "0.5"]),
    ("kernel_split", ["--peer-options", '{"solver": "rotor"}']),  # two plans of fxremat at which budget?
])
def test_paired_tools_refuse_a_budget_given_twice_or_not_at_all(tool, argv, capsys):
    """Two fxremat plans paired must be made for one budget, given once (bytes or a fraction:
    the two can plan differently); refused before anything is compiled."""
    with pytest.raises(SystemExit) as stop:
        _bench(tool).main(argv)
    assert stop.value.code == 2 and "budget" in capsys.readouterr().err
