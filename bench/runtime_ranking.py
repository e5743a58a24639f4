"""Does fxremat's runtime model rank rematerialization plans the way measurement does?

    python bench/runtime_ranking.py [--model gpt] [--rounds 60] [--steps 5]
                                    [--out-dir bench/results/cpu]

One model, several partitioners (plans) of its training step, each compiled with Inductor
through a recording partitioner that keeps the forward and backward graphs it hands over:

- ``fxremat``: fxremat's fusion-aware min-cut;
- ``pytorch``: PyTorch's default min-cut partitioner (``activation_memory_budget=1``);
- ``save_all``: save every forward value the backward needs, recompute nothing
  (``torch._functorch.partitioners.default_partition``);
- ``budget_X``: PyTorch's partitioner under ``activation_memory_budget=X`` (its knapsack
  recomputes matmuls to fit; smaller X recomputes more).

For each plan: the cost model's step time (``fxremat.costmodel.estimate_step``, this CPU's
profile, calibrated afresh into a directory of its own, not the user's cache, which the
planner reads; also with library kernels measured, ``OpTimer``), and the measured
median step time (forward + backward, one thread, warm; the plans take turns in a shuffled
order each round, ``--steps`` steps per turn, so drifts in machine load hit all alike;
wall clock, and the thread's CPU time beside it). Reports Spearman's rho between predicted
and measured wall-clock step times (target >= 0.8), with a bootstrap over rounds, the
measurement's own split-half rho (even vs odd rounds: the ceiling noise leaves), and rho of
ablated models (unfused, no cache level, free pointwise compute, matmul FLOPs only); writes
``runtime_ranking.json`` and ``runtime_ranking.md``. About 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import results_io  # noqa: E402
from fxremat import _compat, compare, costmodel, models, oplib  # noqa: E402

# Private torch APIs this script needs beyond fxremat._compat (candidates to move there).
from fxremat._compat import activation_memory_budget, save_all_partition_fn  # noqa: E402


class Recording(_compat.CustomPartitionerFn):
    """Wraps a partition function; keeps every (forward, backward, num_fwd_outputs) it returns."""

    def __init__(self, fn: Callable, budget: float | None = None):
        self.fn, self.budget, self.graphs = fn, budget, []

    def __call__(self, gm, joint_inputs, **kwargs):
        if self.budget is None:
            fwd, bwd = self.fn(gm, joint_inputs, **kwargs)
        else:
            with activation_memory_budget(self.budget):
                fwd, bwd = self.fn(gm, joint_inputs, **kwargs)
        self.graphs.append((fwd, bwd, kwargs["num_fwd_outputs"]))
        return fwd, bwd

    def uuid(self) -> Any:
        return None  # always partition, never reuse a cached graph


def _save_all(gm, joint_inputs, **kwargs):
    kwargs.pop("compiler", None)
    return save_all_partition_fn()(gm, joint_inputs, **kwargs)


def strategies(budgets: list[float]) -> dict[str, Recording]:
    parts = compare.partitioners()
    found = {"fxremat": Recording(parts["fxremat"]), "pytorch": Recording(parts["pytorch"]),
             "save_all": Recording(_save_all)}
    for b in budgets:
        found[f"budget_{b:g}"] = Recording(parts["pytorch"], budget=b)
    return found


def compile_all(make: Callable, recorders: dict[str, Recording]):
    torch.manual_seed(0)
    model, batch = make()
    compiled = {}
    for name, rec in recorders.items():
        backend = (lambda r: lambda gm, inputs: _compat.compile_fx(
            gm, inputs, config_patches={"custom_partitioner_fn": r}))(rec)
        copy_ = copy.deepcopy(model)
        start = time.perf_counter()
        with _compat.autograd_cache_disabled():
            fn = torch.compile(copy_, backend=backend)
            fn(*batch).backward()
        if len(rec.graphs) != 1:
            raise RuntimeError(f"{name}: expected one partitioned graph, got {len(rec.graphs)}")
        print(f"compiled {name} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        compiled[name] = (copy_, fn)
    return model, batch, compiled


def check_gradients(model, batch, compiled) -> float:
    """Largest relative gradient difference from eager over all plans (they compute the same thing)."""
    model.zero_grad(set_to_none=True)
    model(*batch).backward()
    ref = [p.grad for p in model.parameters()]
    worst = 0.0
    for module, fn in compiled.values():
        module.zero_grad(set_to_none=True)
        fn(*batch).backward()
        for a, b in zip(ref, (p.grad for p in module.parameters())):
            worst = max(worst, ((a - b).abs().max() / a.abs().max().clamp_min(1e-6)).item())
    return worst


def measure(compiled, batch, rounds: int, steps: int, warmup: int = 3):
    """Per plan, wall-clock and thread CPU seconds of each timed step (round by round)."""
    def step(module, fn):
        module.zero_grad(set_to_none=True)
        fn(*batch).backward()

    for module, fn in compiled.values():
        for _ in range(warmup):
            step(module, fn)
    times: dict[str, list[float]] = {name: [] for name in compiled}
    cpu: dict[str, list[float]] = {name: [] for name in compiled}
    order = list(compiled)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            module, fn = compiled[name]
            step(module, fn)  # one untimed step: the switch between models evicts caches
            for _ in range(steps):
                start, start_cpu = time.perf_counter(), time.thread_time()
                step(module, fn)
                cpu[name].append(time.thread_time() - start_cpu)
                times[name].append(time.perf_counter() - start)
    return times, cpu


def plan_facts(fwd, bwd, num_fwd_outputs: int) -> dict[str, Any]:
    fwd_ci = sum(oplib.is_compute_intensive(n) for n in fwd.graph.nodes)
    bwd_ci = sum(oplib.is_compute_intensive(n) for n in bwd.graph.nodes)
    return {"saved_activation_bytes": compare.forward_saved_bytes(fwd, num_fwd_outputs),
            "forward_matmuls": fwd_ci, "backward_matmuls": bwd_ci}


def ablations(fwd, bwd, profile: costmodel.DeviceProfile) -> dict[str, float]:
    """Step estimates (ms) with one part of the model taken away, to see which parts the ranking needs."""
    def unfused(gm, prof):
        return sum(costmodel.node_time(n, prof) for n in gm.graph.nodes)

    def computed_once(gm, prof):
        # kernels without the store-or-inline rule: a value Inductor computes in each reader
        # joins its readers' kernels into one, computed once (the model before 2026-11-30)
        inlined, inlining = costmodel.inlined_constants(gm), costmodel.Inlining()
        return sum(costmodel.estimate_group(g, prof, inlined=inlined, inlining=inlining).seconds
                   for g in costmodel.kernel_groups(gm, inlined))

    dram = dataclasses.replace(profile, cache_bandwidth=None)
    flat = dataclasses.replace(profile, vector_flops=float("inf"))  # pointwise ops cost only their bytes
    return {
        "unfused (every op its own kernel)": (unfused(fwd, profile) + unfused(bwd, profile)) * 1e3,
        "a value inlined into several kernels computed once": (computed_once(fwd, profile)
                                                              + computed_once(bwd, profile)) * 1e3,
        "memory bandwidth only (no cache level)": costmodel.estimate_step(fwd, bwd, dram).total_s * 1e3,
        "pointwise compute free": costmodel.estimate_step(fwd, bwd, flat).total_s * 1e3,
        "matmul FLOPs only": sum(k.flops / profile.matmul_flops["fp32"] for est in
                                 (costmodel.estimate_graph(fwd, profile), costmodel.estimate_graph(bwd, profile))
                                 for k in est.per_group if k.kind == "compute") * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt", choices=sorted(models.ZOO))
    parser.add_argument("--model-kwargs", default="{}", help="JSON dict for the model's make_* function")
    parser.add_argument("--budgets", default="0.8,0.5,0.3,0.1,0", help="activation_memory_budget values")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per plan per round")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kwargs = json.loads(args.model_kwargs)
    make = (lambda: models.ZOO[args.model](**kwargs))
    budgets = [float(b) for b in args.budgets.split(",") if b]

    # Calibrated here, not into ~/.cache/fxremat: a profile cached there is what every later
    # plan on this machine uses (devices.cpu_profile), so a benchmark must not leave one.
    with tempfile.TemporaryDirectory(prefix="fxremat-ranking-") as directory:
        profile = costmodel.calibrate_cpu(force=True, directory=directory)
    recorders = strategies(budgets)
    model, batch, compiled = compile_all(make, recorders)
    grad_diff = check_gradients(model, batch, compiled)
    timer = costmodel.OpTimer("cpu")
    rows = []
    for name, rec in recorders.items():
        fwd, bwd, nout = rec.graphs[0]
        est = costmodel.estimate_step(fwd, bwd, profile)
        est_measured = costmodel.estimate_step(fwd, bwd, profile, timer=timer)
        rows.append({"plan": name, **plan_facts(fwd, bwd, nout), "predicted_ms": est.total_s * 1e3,
                     "predicted_extern_measured_ms": est_measured.total_s * 1e3,
                     "ablations_ms": ablations(fwd, bwd, profile), "estimate": est.summary()})
    times, cpu_times = measure(compiled, batch, args.rounds, args.steps)
    for row in rows:
        t = times[row["plan"]]
        # split-half: medians of the even and the odd rounds, for the measurement's own reproducibility
        halves = [[x for i, x in enumerate(t) if (i // args.steps) % 2 == h] for h in (0, 1)]
        row["measured_half_ms"] = [statistics.median(h) * 1e3 for h in halves]
        t = sorted(t)
        row["measured_ms"] = statistics.median(t) * 1e3
        row["measured_q1_ms"], row["measured_q3_ms"] = (x * 1e3 for x in statistics.quantiles(t, n=4)[::2])
        row["measured_samples"] = len(t)
        row["measured_cpu_ms"] = statistics.median(cpu_times[row["plan"]]) * 1e3

    from scipy import stats

    # Bootstrap over rounds: how much rho moves with the measurement noise.
    rng = random.Random(1)
    boot = []
    for _ in range(1000):
        picks = [rng.randrange(args.rounds) for _ in range(args.rounds)]
        medians = [statistics.median(x for i in picks for x in times[r["plan"]][i * args.steps:(i + 1) * args.steps])
                   for r in rows]
        boot.append(stats.spearmanr([r["predicted_ms"] for r in rows], medians).statistic)
    boot.sort()

    predicted = [r["predicted_ms"] for r in rows]
    predicted_m = [r["predicted_extern_measured_ms"] for r in rows]
    measured = [r["measured_ms"] for r in rows]
    result = {
        **results_io.metadata(),  # torch, date, ... (the markdown's too)
        "model": args.model, "model_kwargs": kwargs, "parameters": sum(p.numel() for p in model.parameters()),
        "batch_shapes": [list(b.shape) for b in batch], "device": "cpu",
        "machine": f"{platform.machine()}, {results_io.cpu_name()}, {os.cpu_count()} cpus", "threads": 1,
        "rounds": args.rounds, "steps_per_round": args.steps,
        "profile": profile.to_json(), "max_relative_grad_diff_vs_eager": grad_diff,
        "spearman_rho": stats.spearmanr(predicted, measured).statistic,
        "spearman_rho_extern_measured": stats.spearmanr(predicted_m, measured).statistic,
        "spearman_rho_cpu_time": stats.spearmanr(predicted, [r["measured_cpu_ms"] for r in rows]).statistic,
        "kendall_tau": stats.kendalltau(predicted, measured).statistic,
        "pearson_r": stats.pearsonr(predicted, measured).statistic,
        "spearman_rho_bootstrap": {"median": boot[len(boot) // 2], "p05": boot[len(boot) // 20],
                                   "p95": boot[-len(boot) // 20 - 1], "resamples": len(boot)},
        "spearman_rho_split_half": stats.spearmanr([r["measured_half_ms"][0] for r in rows],
                                                   [r["measured_half_ms"][1] for r in rows]).statistic,
        "spearman_rho_ablations": {k: stats.spearmanr([r["ablations_ms"][k] for r in rows], measured).statistic
                                   for k in rows[0]["ablations_ms"]},
        "optimer_cache": {"hits": timer.hits, "misses": timer.misses},
        "rows": rows,
    }
    md = markdown(result)
    print(md)
    if args.out_dir:
        results_io.write_json(os.path.join(args.out_dir, "runtime_ranking.json"), result)
        results_io.write_text(os.path.join(args.out_dir, "runtime_ranking.md"), md)


def markdown(r: dict) -> str:
    mib = 2**20
    make_args = ", ".join(f"{k}={v!r}" for k, v in r["model_kwargs"].items())
    lines = [
        f"# Runtime model vs measurement: plan ranking, {r['model']}",
        "",
        f"Model: `fxremat.models.ZOO[{r['model']!r}]({make_args})`, "
        f"{r['parameters']:,} parameters, batch shapes {r['batch_shapes']}; plans: `fxremat` (min-cut), `pytorch` "
        f"(PyTorch's default partitioner), `save_all` (`default_partition`), `budget_X` (PyTorch's partitioner "
        f"with `activation_memory_budget=X`).",
        "",
        f"{r['date']}, torch {r['torch']}, {r['machine']}, {r['threads']} thread; measured: median of "
        f"{r['rounds']} rounds x {r['steps_per_round']} steps per plan, plans interleaved in shuffled order. "
        f"Predicted: `fxremat.costmodel.estimate_step` with the calibrated CPU profile "
        f"(`{r['profile']['name']}`: fp32 matmul {r['profile']['matmul_flops']['fp32'] / 1e9:.0f} GFLOP/s, "
        f"memory {r['profile']['bandwidth'] / 1e9:.1f} GB/s, cache {r['profile']['cache_bandwidth'] / 1e9:.0f} GB/s, "
        f"launch {r['profile']['launch_overhead'] * 1e6:.1f} us).",
        "",
        "| plan | saved activations (MiB) | matmuls fwd / bwd | predicted step (ms) "
        "| predicted, library kernels measured (ms) | measured step (ms) | measured IQR (ms) "
        "| measured thread CPU time (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(r["rows"], key=lambda x: x["measured_ms"]):
        lines.append(
            f"| {row['plan']} | {row['saved_activation_bytes'] / mib:.2f} | {row['forward_matmuls']} / "
            f"{row['backward_matmuls']} | {row['predicted_ms']:.2f} | {row['predicted_extern_measured_ms']:.2f} | "
            f"{row['measured_ms']:.2f} | {row['measured_q1_ms']:.2f}-{row['measured_q3_ms']:.2f} | "
            f"{row['measured_cpu_ms']:.2f} |")
    lines += [
        "",
        f"Spearman rho (predicted vs measured): **{r['spearman_rho']:.3f}** (target >= 0.8); with library "
        f"kernels measured: {r['spearman_rho_extern_measured']:.3f}; against thread CPU time (time the step "
        f"spent on the core, less what other processes took): {r['spearman_rho_cpu_time']:.3f}; "
        f"Kendall tau {r['kendall_tau']:.3f}; "
        f"Pearson r {r['pearson_r']:.3f}. All plans' gradients agree with eager within "
        f"{r['max_relative_grad_diff_vs_eager']:.1e} (relative, fp32).",
        "",
        f"Bootstrap over rounds ({r['spearman_rho_bootstrap']['resamples']} resamples): rho median "
        f"{r['spearman_rho_bootstrap']['median']:.3f}, 90% interval {r['spearman_rho_bootstrap']['p05']:.3f} to "
        f"{r['spearman_rho_bootstrap']['p95']:.3f}.",
        "",
        f"Measurement against itself (medians of even vs odd rounds): Spearman rho "
        f"{r['spearman_rho_split_half']:.3f}, the ceiling noise leaves for any model.",
        "",
        "Ablations (the model with one part taken away; Spearman rho vs measured):",
        "",
        "| model variant | rho |",
        "|---|---:|",
        f"| full model | {r['spearman_rho']:.3f} |",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in r["spearman_rho_ablations"].items()]
    lines += [
        "",
        "Reading it: predicted times leave out the Python and autograd work around the compiled graphs and "
        "take every matmul at the calibrated 512x512 rate, so they sit below the measurement; what is tested "
        "is the order. Plans predicted within about 1% of one another are not resolved by the model: "
        "profiling the min-cut and PyTorch-default plans showed byte-identical Inductor kernels (the forward "
        "GELU) taking over 2x longer in one plan than in the other, with no page faults in either, consistent "
        "with output buffers that are or are not still in cache; the model does not see buffer reuse.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
