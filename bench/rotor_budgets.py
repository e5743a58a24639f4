"""fxremat under a memory budget: predicted and measured peak, step time, per budget.

    python bench/rotor_budgets.py [--model transformer] [--kwargs '{"batch": 16, "seq": 64, "layers": 4}']
                                  [--budgets 1.0,0.8,0.6,0.4,0.3] [--to-minimum] [--grad-check]
                                  [--threads 1] [--out FILE]

Each point runs in a fresh process (fxremat.harness): CPU peaks from the profiler's
allocation events, step time the median of 5 warm steps. ``--to-minimum``: when a
budget is below the minimum feasible one, fxremat's error names that minimum in
bytes; measure that point too. ``--grad-check``: also compile in float64 and
compare the gradients with eager PyTorch's (largest relative error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import results_io  # noqa: E402
from fxremat.harness import measure_step  # noqa: E402
from plan_records import least_budget  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--kwargs", default='{"batch": 16, "seq": 64, "layers": 4}', help="model sizes, JSON")
    parser.add_argument("--budgets", default="1.0,0.8,0.6,0.4,0.3")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--to-minimum", action="store_true")
    parser.add_argument("--grad-check", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    kwargs = json.loads(args.kwargs)
    rows = []
    budgets: list = [float(b) for b in args.budgets.split(",")]
    while budgets:
        budget = budgets.pop(0)
        try:
            r = measure_step(args.model, "fxremat", {"memory_budget": budget}, device=args.device,
                             model_kwargs=kwargs, time_steps=5, grad_check=args.grad_check, threads=args.threads,
                             timeout=3600)
        except RuntimeError as err:
            message = str(err).strip()
            lines = [ln for ln in message.splitlines() if "Error" in ln] or message.splitlines()
            rows.append({"budget": budget, "error": lines[-1].strip()[:400]})
            print(rows[-1], flush=True)
            minimum = least_budget(message)
            if args.to_minimum and minimum and isinstance(budget, float):
                budgets = [minimum.bytes]
            continue
        rows.append({"budget": budget, "budget_bytes": r["budget_bytes"][0], "solver": r["solver"][0],
                     "predicted_peak_bytes": r["predicted_peak_bytes"][0], "measured_peak_bytes": r["peak_bytes"],
                     "recomputed_ops": r["recomputed_ops"][0], "step_seconds": r["step_seconds"],
                     "solve_seconds": r["solve_seconds"][0], "grad_max_rel_error": r.get("grad_max_rel_error"),
                     "device_name": r["device_name"]})
        print(rows[-1], flush=True)
    mib = 2**20
    print(f"\n{args.model} {kwargs}, {args.device}")
    print(f"(threads {args.threads}; step time: median of 5 warm steps; plan: fxremat's planning wall time)")
    print("| budget | budget (MiB) | solver | predicted peak (MiB) | measured peak (MiB) | measured ÷ budget | "
          "recomputed ops | step (ms) | plan (s) | grad rel. error (fp64) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['budget']} | - | - | - | - | - | - | - | - | {r['error'][:80]} |")
            continue
        grad = "-" if r["grad_max_rel_error"] is None else f"{r['grad_max_rel_error']:.1e}"
        print(f"| {r['budget']} | {r['budget_bytes'] / mib:.2f} | {r['solver']} | {r['predicted_peak_bytes'] / mib:.2f}"
              f" | {r['measured_peak_bytes'] / mib:.2f} | {r['measured_peak_bytes'] / r['budget_bytes']:.3f} | "
              f"{r['recomputed_ops']} | {r['step_seconds'] * 1e3:.1f} | {r['solve_seconds']:.1f} | {grad} |")
    if args.out:  # with results_io's metadata: torch, cpus, date, ...
        results_io.write_json(args.out, {"model": args.model, "kwargs": kwargs, "threads": args.threads,
                                         "load_average": os.getloadavg(), "rows": rows})


if __name__ == "__main__":
    main()
