"""The largest batch that fits a fixed memory: torch.compile default, per-block checkpointing, fxremat.

    python bench/largest_batch.py --device cuda --cap-gib 20 --models gpt2,resnet50 --out DIR
    python bench/largest_batch.py --device cpu --quick --out /tmp/x     # the same code on a CPU (smoke)

"Fits" means what a user means: one training step (forward and backward, gradients set to
``None`` before it) runs in a process whose CUDA caching allocator may not reserve more than
``--cap-gib`` (``torch.cuda.set_per_process_memory_fraction``), parameters, gradients, the
batch and the allocator's own fragmentation included; a step that needs more raises
``torch.OutOfMemoryError``. The steps before it, which compile (and, under fxremat's step
budget, plan its graphs again after the first step), must fit too, as they must for a user;
the measured step is the first after a step that planned nothing. The step's
``max_memory_allocated`` and ``max_memory_reserved`` are recorded beside it. On a CPU there is no cap to set: the smoke run checks the code paths only.

Strategies (``bench/frontier_strategies.py``'s builders, the models of
``bench/frontier_models.py``): ``inductor`` (``torch.compile`` default), ``ckpt_blocks``
(``torch.utils.checkpoint`` around every block), ``fxremat`` at the byte budget the cap leaves
for the step: ``(1 - headroom) * cap`` less the step's inputs (parameters, buffers, the batch),
as the budget definition of the README counts them (above the inputs); ``--headroom`` (0.05)
is left for the allocator's fragmentation and the CUDA context's workspace.

The search, one process per model and strategy (``--jobs`` at a time; each may fill its cap):
the step's total peak (``max_memory_allocated``) grows about linearly with the batch, so it
is measured at the scale's batch and at twice it (fxremat at ``memory_budget=0.0``, its
least-memory plan, whose peak is what bounds its batch), a line through both gives the batch
whose peak meets ``(1 - headroom) * cap``, and that batch is run (fxremat at the byte budget);
from there the batch steps down by ``--step`` (5%) after an out-of-memory error or a
``BudgetError``, or up after a fit, until a fit and a failure one batch apart bracket it, or
``--probes`` steps are spent. A row reports the largest batch seen to fit and the smallest seen
to fail (``None`` where none was tried), with every probe.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

import results_io  # noqa: E402

STRATEGIES = ("inductor", "ckpt_blocks", "fxremat")
QUICK_SIZES = {"gpt2": {"batch": 2}, "mlp": {"batch": 8}}


def _spec(args, model: str, strategy: str) -> dict:
    return {"model": model, "strategy": strategy, "device": args.device, "dtype": args.dtype,
            "scale": args.scale, "sizes": args.sizes.get(model, {}), "cap_bytes": int(args.cap_gib * 2**30),
            "headroom": args.headroom, "step": args.step, "probes": args.probes, "alloc_conf": args.alloc_conf}


# --- the child: one model and strategy, every probe in one process ---------------------------

SETTLING_STEPS = 4  # steps run before the measured one, at most: until a step plans nothing


def _probe(spec: dict, batch: int, fx_budget) -> dict:
    """One compiled step of the model at ``batch``, after the steps that compile and plan it
    (``SETTLING_STEPS`` at most): its peaks, or why it did not fit."""
    import torch

    import frontier_models
    from frontier_strategies import build_strategy, sync

    import fxremat

    torch._dynamo.reset()
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    overrides = {**spec["sizes"], "batch": batch}
    probe = {"batch": batch}
    if spec["strategy"] == "fxremat":
        fm = frontier_models.build(spec["model"], spec["scale"], overrides)
        element = torch.empty((), dtype=getattr(torch, spec["dtype"])).element_size()
        inputs = sum(t.numel() * (element if t.is_floating_point() else t.element_size())
                     for t in [*fm.model.parameters(), *fm.model.buffers(), *fm.batch])
        del fm
        probe["inputs_bytes"] = inputs
        if fx_budget == "least":
            strategy = {"kind": "fxremat", "budget": 0.0}
        else:
            budget = int((1 - spec["headroom"]) * spec["cap_bytes"]) - inputs
            if budget < 1:
                return {**probe, "fits": False, "error": f"the inputs alone ({inputs} B) fill the cap"}
            strategy = {"kind": "fxremat", "budget_bytes": budget}
        probe["memory_budget"] = strategy.get("budget_bytes", strategy.get("budget"))
    else:
        strategy = {"kind": spec["strategy"]}
    built = dict(spec, model=spec["model"], scale=spec["scale"], overrides=overrides,
                 fx_options={"hold_outputs": False})
    since = fxremat.inspect.plan_count()
    try:
        model, fn, inputs_batch, ctx, _ = build_strategy(built, strategy)
        if cuda:
            sync(device)
            probe["inputs_allocated_bytes"] = torch.cuda.memory_allocated()
        with ctx():
            # Steps until no graph is planned again: a step's budget replans its graphs after
            # the first step (and after any step it finds over), and a replan inside the
            # measured step would count the compiler's memory (its first step must fit too).
            for warm_steps in range(1, SETTLING_STEPS + 1):
                planned = fxremat.inspect.plan_count()
                model.zero_grad(set_to_none=True)
                fn(*inputs_batch).backward()  # compiles
                sync(device)
                if fxremat.inspect.plan_count() == planned and warm_steps > 1:
                    break
            probe["warm_steps"] = warm_steps
            model.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            fn(*inputs_batch).backward()
            sync(device)
            probe["step_s"] = time.perf_counter() - started
        probe["fits"] = True
        if cuda:
            probe["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            probe["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    except Exception as err:  # noqa: BLE001
        probe["fits"] = False
        probe["error"] = f"{type(err).__name__}: {err}"[:600]
        probe["out_of_memory"] = isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err)
    finally:
        model = fn = inputs_batch = None  # noqa: F841
        if cuda:
            torch.cuda.empty_cache()
    plans = fxremat.inspect.plans_since(since)
    if plans:
        probe["predicted_peak_bytes"] = [p.predicted_peak_bytes for p in plans]
    return probe


def next_batch(probes: list[dict], step: float) -> int | None:
    """The next batch to try after ``probes`` (dicts with ``batch`` and ``fits``), or None when
    a fit and a failure one batch apart bracket the largest batch (or a failure is below a fit:
    not monotone, nothing more to learn). Every fit so far bounds it from below and every
    failure from above (the line's probes too: where they run fxremat's least-memory plan, a
    batch it does not fit is one no budget fits): bisection between them; with no failure yet,
    up by ``step``; with no fit yet, down by ``step``."""
    fits = [p["batch"] for p in probes if p["fits"]]
    fails = [p["batch"] for p in probes if not p["fits"]]
    best, worst = max(fits, default=None), min(fails, default=None)
    if worst is None:
        last = probes[-1]["batch"]
        return max(last + 1, round(last * (1 + step)))
    if best is None:
        return max(1, min(worst - 1, round(worst * (1 - step)))) if worst > 1 else None
    if worst - best <= 1:
        return None
    return (best + worst) // 2


def search(run, base: int, target: float, probes: int, step: float, line_counts: bool = True) -> dict:
    """The largest batch for which ``run(batch, line)`` fits, ``run`` returning a probe dict
    (``batch``, ``fits``, and ``peak_allocated_bytes`` where measured). ``line=True`` for the
    two probes at ``base`` and ``2 * base`` (fxremat: its least-memory plan) through which a line
    of peak against batch guesses the batch whose peak meets ``target``; then up to ``probes``
    probes (``line=False``) from that guess (``next_batch``). Returns the probes, the line and
    ``largest_batch`` (the largest batch that fit; the line's probes count when
    ``line_counts``, that is when ``run`` gives them the configuration of the others) and
    ``smallest_failed_batch``.

    >>> fake = lambda batch, line: {"batch": batch, "fits": batch <= 37, "peak_allocated_bytes": 10 * batch}
    >>> search(fake, base=8, target=370, probes=6, step=0.05)["largest_batch"]
    37
    """
    row: dict = {"probes": []}
    line = []
    for batch in (base, 2 * base):
        probe = dict(run(batch, True), line=True)
        row["probes"].append(probe)
        if not probe["fits"]:
            break
        line.append((batch, probe.get("peak_allocated_bytes") or 0))
    if len(line) == 2 and line[1][1] > line[0][1]:
        (b0, p0), (b1, p1) = line
        per_sample = (p1 - p0) / (b1 - b0)
        batch = max(1, math.floor(b0 + (target - p0) / per_sample))
        row["line"] = {"bytes_per_sample": per_sample, "fixed_bytes": p0 - per_sample * b0, "batch_at_target": batch}
    else:  # no line (nothing measured on a CPU, or the base batch did not fit)
        batch = base if line else max(1, base // 2)
    for _ in range(probes):
        row["probes"].append(dict(run(batch, False), line=False))
        batch = next_batch(row["probes"], step)
        if batch is None:
            break
    counted = [p for p in row["probes"] if line_counts or not p["line"]]
    largest = max((p for p in counted if p["fits"]), key=lambda p: p["batch"], default=None)
    row.update(largest_batch=largest["batch"] if largest else None, at_largest=largest,
               smallest_failed_batch=min((p["batch"] for p in counted if not p["fits"]), default=None))
    return row


def child(spec: dict) -> dict:
    import torch

    if spec["device"] == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_bytes"] / total))
    import frontier_models

    base = {**frontier_models.SIZES[spec["model"]][spec["scale"]], **spec["sizes"]}["batch"]
    fx = spec["strategy"] == "fxremat"

    def run(batch: int, line: bool) -> dict:
        probe = _probe(spec, batch, ("least" if line else "bytes") if fx else None)
        print("probe", json.dumps({**probe, "line": line, "strategy": spec["strategy"], "model": spec["model"]}),
              flush=True)
        return probe

    row = {"model": spec["model"], "strategy": spec["strategy"], "cap_bytes": spec["cap_bytes"],
           "headroom": spec["headroom"], "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    row.update(search(run, base, (1 - spec["headroom"]) * spec["cap_bytes"], spec["probes"], spec["step"],
                      line_counts=not fx))
    return row


# --- the parent ---------------------------------------------------------------------------------

def run_child(spec: dict, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                             capture_output=True, text=True, timeout=timeout,
                             env=dict(os.environ, PYTHONWARNINGS="ignore",
                                      **({"PYTORCH_CUDA_ALLOC_CONF": spec["alloc_conf"]} if spec["alloc_conf"] else {})))
        for line in out.stdout.splitlines():
            if line.startswith("probe "):
                print(line[:400], flush=True)
        rows = [line for line in out.stdout.splitlines() if line.startswith("row ")]
        row = json.loads(rows[-1][4:]) if rows else {"model": spec["model"], "strategy": spec["strategy"],
                                                     "error": out.stderr[-3000:]}
    except subprocess.TimeoutExpired as err:
        row = {"model": spec["model"], "strategy": spec["strategy"], "error": f"timeout after {timeout} s",
               "stdout_tail": (err.stdout or b"")[-2000:].decode(errors="replace") if isinstance(err.stdout, bytes)
               else str(err.stdout)[-2000:]}
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def summary_markdown(data: dict) -> str:
    gib = 2**30
    lines = [f"Largest batch within {data['cap_gib']} GiB ({data['env'].get('device_name', data['device'])}, "
             f"torch {data['env']['torch']}, {data['dtype']}; one training step, parameters, gradients and batch "
             f"included; headroom {data['headroom']:.0%} for fxremat's byte budget; "
             f"PYTORCH_CUDA_ALLOC_CONF={data.get('alloc_conf') or 'unset'})", "",
             "| model | strategy | largest batch that fits | smallest tried that failed | peak allocated (GiB) "
             "| peak reserved (GiB) | step (s) | samples/s |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in data["rows"]:
        at = row.get("at_largest") or {}
        step = at.get("step_s")
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            row["model"], row["strategy"], row.get("largest_batch", row.get("error", "")[:60]),
            row.get("smallest_failed_batch"),
            f"{at['peak_allocated_bytes'] / gib:.2f}" if at.get("peak_allocated_bytes") else "",
            f"{at['peak_reserved_bytes'] / gib:.2f}" if at.get("peak_reserved_bytes") else "",
            f"{step:.3f}" if step else "", f"{at['batch'] / step:.1f}" if step else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, on CPU too)")
    parser.add_argument("--models", default="gpt2,resnet50")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--cap-gib", type=float, default=20.0)
    parser.add_argument("--headroom", type=float, default=0.05)
    parser.add_argument("--step", type=float, default=0.05, help="relative batch step after the line's guess")
    parser.add_argument("--probes", type=int, default=5, help="probes after the line's two")
    parser.add_argument("--alloc-conf", default="expandable_segments:True",
                        help="PYTORCH_CUDA_ALLOC_CONF for every strategy's process ('' leaves the environment's)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes at a time (default: as many caps as 90%% of the GPU's memory holds)")
    parser.add_argument("--sizes", default="{}", type=json.loads, help="size overrides per model (JSON)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        try:
            row = child(spec)
        except Exception:  # noqa: BLE001
            row = {"model": spec["model"], "strategy": spec["strategy"], "error": traceback.format_exc()[-3000:]}
        print("row " + json.dumps(row), flush=True)
        return None
    if args.out is None:
        parser.error("--out is required")
    args.scale = "tiny" if args.quick else "gpu"
    if args.quick:
        args.sizes = {**QUICK_SIZES, **args.sizes}
        args.probes = min(args.probes, 2)
    import torch

    from gpu_suite import environment

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    if args.jobs is None:
        args.jobs = (max(1, int(0.9 * torch.cuda.get_device_properties(0).total_memory // (args.cap_gib * 2**30)))
                     if args.device == "cuda" else 1)
    specs = [_spec(args, m, s) for m in args.models.split(",") for s in args.strategies.split(",")]
    os.makedirs(args.out, exist_ok=True)
    data = {"env": environment(), "device": args.device, "dtype": args.dtype, "cap_gib": args.cap_gib,
            "headroom": args.headroom, "alloc_conf": args.alloc_conf, "scale": args.scale, "jobs": args.jobs,
            "rows": []}
    path = os.path.join(args.out, "largest_batch.json")
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(lambda s: run_child(s, args.timeout), specs):
            data["rows"].append(row)
            print("largest", json.dumps({k: row.get(k) for k in ("model", "strategy", "largest_batch",
                                                                   "smallest_failed_batch", "wall_s", "error")})[:800],
                  flush=True)
            data["wall_s"] = round(time.perf_counter() - started, 1)
            results_io.write_json(path, data)
    with open(os.path.join(args.out, "largest_batch.md"), "w") as f:
        f.write(summary_markdown(data))
    print(summary_markdown(data), flush=True)
    return data


if __name__ == "__main__":
    main()
