"""The GPU suite: memory prediction, gradients and the frontier on CUDA, in a few commands.

    python bench/gpu_suite.py check --out DIR        # environment, gradients, predicted vs measured peaks
    python bench/gpu_suite.py frontier --out DIR     # bench/frontier.py at GPU sizes (GPT-2 small, ResNet-50)
    python bench/gpu_suite.py all --out DIR --deadline 540    # both, the frontier in the time left
    python bench/gpu_suite.py check --device cpu --quick --out /tmp/x   # the same code on a CPU (smoke)

Runs from the working tree (``PYTHONPATH`` need not name it: the script puts the checkout first
on the path) on the GPU machine's own torch (2.11 with CUDA 13 there, 2.13 here). Each part
writes its JSON as soon as it has it, so a command stopped at its time limit still returns what
was measured.

``check`` (``gpu_check.json``):

- ``env``: torch, CUDA, Triton and Python versions, the GPU's name and capability.
- ``grads``: gradients under fxremat against a reference on a small GPT (``fxremat.models.GPT``):
  in float64 without dropout against eager PyTorch (a correct plan lands near 1e-12), at budget
  0.75 and at the least feasible budget; in float32 with dropout 0.1 at the least budget against
  ``torch.compile``'s default partition with the same seed: Inductor draws random numbers from
  Philox seeds, so a plan that keeps a draw and one that recomputes it from its seed draw the
  same numbers as the default partition, and the gradients agree to float32 rounding. A
  recomputation that drew anew would not: another seed's loss (recorded) shows how far apart.
- ``prediction``: fxremat's predicted peak against ``torch.cuda.max_memory_allocated`` above
  the inputs (``fxremat.harness.measure_step``, a fresh process per row, ``--jobs`` at a time:
  each process's peak is its own), for the test zoo at GPU-sized batches, without a budget, at
  0.5 and at the least feasible budget (found as ``bench/frontier_run.py`` does: a 1-byte budget's
  ``BudgetError`` names it), and for other solvers at 0.5.

``frontier``: ``bench/frontier.py --device cuda --scale gpu`` on ``--models`` with torch.compile
default, per-block checkpointing, PyTorch's ``activation_memory_budget`` 0.5, fxremat at 1.0,
0.5, at per-block checkpointing's measured peak and at its least budget; its outputs in
``DIR/frontier/``.

Every part records its wall time (``wall_s``) beside its results.

On the GPU machine (an H100, torch 2.11, cold caches, 2026-11-25: ``bench/results/cuda/``), the
parts take: ``check --only grads`` about 3 min; each prediction row 1-2 min, 6 at a time, so the
16 rows about 5 min; the frontier about 1 min per strategy and model, 4 at a time, so 5-6 min a
model. A 10-minute call holds the check or one frontier model, not both: run them as separate
calls, e.g. ::

    python bench/gpu_suite.py check --out $OUT --record decoder 2>&1 | tee $OUT/log.txt
    python bench/gpu_suite.py frontier --models gpt2 --out $OUT 2>&1 | tee $OUT/log.txt

On an H200 (2026-11-26, ``bench/results/cuda/NVIDIA-H200/``): the GPT-2 frontier with 9
strategies, 6 at a time, 272 s; the 16 prediction rows 218 s; ``bench/largest_batch.py`` (2
models x 3 strategies, 5 at a time, beside the prediction rows) 456 s.

(no ``grep`` in the pipe: it holds the log back until it ends, and a call stopped at its limit
returns none of it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

import results_io  # noqa: E402
from plan_records import least_budget, plan_record  # noqa: E402

# (model, model_kwargs, options): the zoo at batches that give a GPU some work, and the plans
# the issue asks about (min-cut without a budget, Rotor/knapsack at 0.5 and at the least, the
# DAG solvers at 0.5 on the models that are not chains).
PREDICTION_CASES = [
    ("gpt", {"batch": 32, "seq": 256, "dim": 256, "layers": 4}, {}),
    ("gpt", {"batch": 32, "seq": 256, "dim": 256, "layers": 4}, {"memory_budget": 0.5}),
    ("gpt", {"batch": 32, "seq": 256, "dim": 256, "layers": 4}, {"memory_budget": "least"}),
    ("transformer", {"batch": 64}, {}),
    ("transformer", {"batch": 64}, {"memory_budget": 0.5}),
    ("decoder", {}, {}),
    ("decoder", {}, {"memory_budget": 0.5}),
    ("decoder", {}, {"memory_budget": "least"}),
    ("mlp", {"batch": 4096}, {}),
    ("mlp", {"batch": 4096}, {"memory_budget": 0.5}),
    ("cnn", {"batch": 64}, {}),
    ("unet", {"batch": 16, "size": 64}, {}),
    ("unet", {"batch": 16, "size": 64}, {"memory_budget": 0.5}),
    ("unet", {"batch": 16, "size": 64}, {"memory_budget": "least"}),
    ("unet", {"batch": 16, "size": 64}, {"memory_budget": 0.5, "solver": "twremat"}),
    ("unet", {"batch": 16, "size": 64}, {"memory_budget": 0.5, "solver": "checkmate"}),
]
QUICK_PREDICTION_CASES = [("gpt", {"batch": 2, "seq": 16, "dim": 32, "layers": 2}, {}),
                          ("gpt", {"batch": 2, "seq": 16, "dim": 32, "layers": 2}, {"memory_budget": "least"})]
GRAD_MODEL = dict(layers=4, dim=64, heads=4, seq=64, vocab=256)
QUICK_GRAD_MODEL = dict(layers=2, dim=32, heads=2, seq=16, vocab=64)
FRONTIER_ARGS = ["--scale", "gpu", "--pt-budgets", "0.5,0.1",
                 "--fx-budgets", "1.0,0.5,0.25", "--solvers", "auto", "--steps", "3", "--rounds", "3", "--jobs", "6",
                 "--sizes", json.dumps({"resnet50": {"batch": 32}})]
QUICK_FRONTIER_ARGS = ["--scale", "tiny", *FRONTIER_ARGS[2:-2]]
LEAST_MAX_PROBES = 4


def environment() -> dict:
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["device_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return env


# --- gradients ---------------------------------------------------------------------------

def _grads(model) -> list:
    return [p.grad.detach().clone() for p in model.parameters()]


def _run(model, batch, seed: int):
    import torch

    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(*batch)
    loss.backward()
    return float(loss.detach()), _grads(model)


def _compiled_grads(model, batch, options: dict | None, seed: int = 1) -> tuple[float, list, list]:
    """Loss, gradients and plan records of one step of ``model`` compiled with fxremat (options
    given) or torch.compile's default (None)."""
    import torch

    import fxremat
    from fxremat import _compat

    torch._dynamo.reset()
    since = fxremat.inspect.plan_count()
    compiled = (torch.compile(model, backend="fxremat", options=options) if options is not None
                else torch.compile(model))
    with _compat.autograd_cache_disabled():
        loss, grads = _run(compiled, batch, seed)
    return loss, grads, [plan_record(p) for p in fxremat.inspect.plans_since(since)]


def at_least_budget(run, failure: type[BaseException], probes: list | None = None):
    """``run(budget)`` at the least feasible byte budget: first at 1 byte, whose error
    (``failure``, its text naming ``Allowed: a budget of at least N bytes``) names a larger
    budget, then at that one, as ``bench/frontier_run.py`` finds it. Returns ``(budget,
    run(budget))``; ``probes`` collects the budgets that failed."""
    budget = 1
    for _ in range(LEAST_MAX_PROBES):
        try:
            return budget, run(budget)
        except failure as err:
            least = least_budget(str(err)) if "BudgetError" in f"{type(err).__name__}: {err}" else None
            if least is None or least.bytes <= budget:
                raise
            if probes is not None:
                probes.append(budget)
            budget = least.bytes
    raise RuntimeError(f"no least budget after {LEAST_MAX_PROBES} probes")


def _least_options(model, batch, options: dict) -> dict:
    """``options`` with ``memory_budget`` at the least feasible bytes (fxremat.plan's BudgetError)."""
    import fxremat

    budget, _ = at_least_budget(lambda b: fxremat.plan(model, batch, {**options, "memory_budget": b}),
                                fxremat.BudgetError)
    return {**options, "memory_budget": budget}


def grad_checks(device: str, quick: bool) -> list[dict]:
    import torch

    from fxremat import models
    from fxremat.harness import grad_rel_error

    sizes = QUICK_GRAD_MODEL if quick else GRAD_MODEL
    rows = []

    def build(dtype, dropout):
        torch.manual_seed(0)
        model, batch = models.make_gpt(batch=4, dropout=dropout, **sizes)
        return model.to(device=device, dtype=dtype).train(), tuple(b.to(device) for b in batch)

    # float64, no dropout: against eager PyTorch.
    model, batch = build(torch.float64, 0.0)
    reference = copy.deepcopy(model)
    eager_loss, eager_grads = _run(reference, batch, seed=1)
    def check_row(row: dict, measure) -> None:
        """``row`` updated with what ``measure()`` returns (or its error) and its wall time."""
        started = time.perf_counter()
        try:
            row.update(measure())
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {err}"[:2000]
        row["wall_s"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        print("grads", json.dumps({k: v for k, v in row.items() if k != "plans"}), flush=True)

    def against_eager(label: str) -> dict:
        options = {"memory_budget": 0.75} if label == "0.75" else _least_options(model, batch, {})
        loss, grads, plans = _compiled_grads(model, batch, options)
        return dict(options=options, plans=plans, loss_abs_diff=abs(loss - eager_loss),
                    grad_max_rel_error=grad_rel_error(grads, eager_grads))

    for label in ("0.75", "least"):
        check_row({"check": "float64 vs eager", "dtype": "float64", "dropout": 0.0, "budget": label, "sizes": sizes},
                  lambda: against_eager(label))

    def with_dropout() -> dict:
        """float32, dropout 0.1: against torch.compile's default, same seed (Inductor's Philox draws)."""
        model, batch = build(torch.float32, 0.1)
        default_loss, default_grads, _ = _compiled_grads(model, batch, None)
        options = _least_options(model, batch, {})
        loss, grads, plans = _compiled_grads(model, batch, options)
        other_seed_loss, _, _ = _compiled_grads(model, batch, options, seed=2)
        return dict(options=options, plans=plans, loss_abs_diff=abs(loss - default_loss),
                    loss_abs_diff_other_seed=abs(other_seed_loss - default_loss),
                    grad_max_rel_error=grad_rel_error(grads, default_grads))

    check_row({"check": "float32 dropout vs torch.compile default", "dtype": "float32", "dropout": 0.1,
               "budget": "least", "sizes": sizes}, with_dropout)
    return rows


# --- predicted vs measured peaks -----------------------------------------------------------

def _measure(case, device: str, record_dir: str | None = None) -> dict:
    from fxremat.harness import measure_step

    model, kwargs, options = case
    row = {"model": model, "model_kwargs": kwargs, "options": dict(options), "budget_probes": []}
    started = time.perf_counter()
    options = dict(options)

    def run(budget):
        return measure_step(model, "fxremat", dict(options, memory_budget=budget) if budget is not None else options,
                            device=device, model_kwargs=kwargs, timeout=600, record_dir=record_dir)

    try:
        if options.get("memory_budget") == "least":  # a failed child raises RuntimeError with its stderr
            options["memory_budget"], result = at_least_budget(run, RuntimeError, row["budget_probes"])
        else:
            result = run(None)
        predicted = max(result["predicted_peak_bytes"])
        row.update(used_options=options, baseline_bytes=result["baseline_bytes"],
                   predicted_peak_bytes=result["predicted_peak_bytes"], measured_peak_bytes=result["peak_bytes"],
                   predicted_over_measured=predicted / result["peak_bytes"], budget_bytes=result["budget_bytes"],
                   solver=result["solver"], recomputed_ops=result["recomputed_ops"],
                   device_name=result["device_name"], torch=result["torch"], record_dir=result.get("record_dir"))
    except Exception as err:  # noqa: BLE001
        row["error"] = f"{type(err).__name__}: {err}"[-3000:]
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def _case_name(case) -> str:
    model, kwargs, options = case
    return "_".join([model, *(f"{k}-{v}" for k, v in sorted(options.items()))])


def predictions(args, done) -> list[dict]:
    cases = QUICK_PREDICTION_CASES if args.quick else PREDICTION_CASES
    if args.cases:
        cases = [c for c in cases if c[0] in args.cases.split(",")]
    record = set(args.record.split(",")) if args.record else set()
    records = os.path.join(args.out, "records")

    def measure(case):
        record_dir = os.path.join(records, _case_name(case)) if case[0] in record else None
        return _measure(case, args.device, record_dir)

    rows = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(measure, cases):
            rows.append(row)
            brief = {k: row.get(k) for k in ("model", "options", "predicted_peak_bytes", "measured_peak_bytes",
                                              "predicted_over_measured", "wall_s", "error")}
            print("prediction", json.dumps(brief)[:600], flush=True)
            done(rows)
    if os.path.isdir(records):  # one file to bring back from the GPU machine
        shutil.make_archive(records, "gztar", records)
        shutil.rmtree(records)
    return rows


def check(args) -> dict:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    path = os.path.join(args.out, "gpu_check.json")
    data = {"env": environment(), "device": args.device, "parts": {}}

    def save():
        results_io.write_json(path, data)

    parts = (("grads", lambda: grad_checks(args.device, args.quick)),
             ("prediction", lambda: predictions(args, lambda rows: (data.__setitem__("prediction", rows), save()))))
    for name, part in parts:
        if args.only and name not in args.only.split(","):
            continue
        started = time.perf_counter()
        try:
            data[name] = part()
        except Exception:  # noqa: BLE001
            data[f"{name}_error"] = traceback.format_exc()[-3000:]
            print(data[f"{name}_error"], flush=True)
        data["parts"][name] = {"wall_s": round(time.perf_counter() - started, 1)}
        save()
    print(f"check: {json.dumps(data['parts'])} -> {path}", flush=True)
    return data


def start_frontier(args) -> subprocess.Popen:
    scale = QUICK_FRONTIER_ARGS if args.quick else FRONTIER_ARGS
    command = [sys.executable, os.path.join(HERE, "frontier.py"), "--device", args.device, *scale,
               "--models", args.models, "--strategies", args.strategies, "--out", os.path.join(args.out, "frontier"),
               *(["--autocast", args.autocast] if args.autocast else [])]
    print("frontier:", " ".join(command[1:]), flush=True)
    return subprocess.Popen(command)


def wait_frontier(process: subprocess.Popen, started: float, timeout: float | None) -> int:
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()  # its children (the measuring processes) end with their stdin closed
        code = 124
        print(f"frontier: stopped at the deadline ({timeout:.0f} s)", flush=True)
    print(f"frontier: exit {code} in {time.perf_counter() - started:.0f} s", flush=True)
    return code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["check", "frontier", "all"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, on CPU too)")
    parser.add_argument("--jobs", type=int, default=6, help="prediction processes at a time")
    parser.add_argument("--models", default="gpt2,resnet50", help="the frontier's models")
    parser.add_argument("--only", default=None, help="check: the parts to run (grads, prediction; default both)")
    parser.add_argument("--cases", default=None, help="prediction: only these models' rows (comma list)")
    parser.add_argument("--record", default=None,
                        help="prediction: these models' rows also record the allocator's history, the predicted "
                             "timelines and Inductor's code (fxremat.harness.record_cuda_step), in records.tar.gz")
    parser.add_argument("--strategies", default="inductor,ckpt_blocks,pt_budget,fxremat",
                        help="the frontier's strategies (bench/frontier.py --strategies)")
    parser.add_argument("--autocast", default=None, choices=["bfloat16", "float16"],
                        help="the frontier's forward under torch.autocast (bench/frontier.py --autocast)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from the start: the frontier is stopped there (its finished models are kept)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    # The frontier starts first: its model's first strategy (torch.compile default) compiles alone
    # while the check runs beside it. Peaks are per process, so running both at once changes no
    # memory figure; the frontier's step times that count are its interleaved rounds, which come
    # after its measurements, by then the check is done (it takes a few minutes).
    process = start_frontier(args) if args.part in ("frontier", "all") else None
    if args.part in ("check", "all"):
        check(args)
    if process is not None:
        left = None if args.deadline is None else max(1.0, args.deadline - (time.perf_counter() - started))
        wait_frontier(process, started, left)
    print(f"gpu_suite {args.part}: {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
