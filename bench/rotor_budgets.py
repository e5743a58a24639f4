"""fxremat under a memory budget: predicted and measured peak, step time, per budget.

    python bench/rotor_budgets.py [--model transformer] [--kwargs '{"batch": 16, "seq": 64, "layers": 4}']
                                  [--budgets 1.0,0.8,0.6,0.4,0.3] [--out FILE]

Each point runs in a fresh process (fxremat.harness): CPU peaks from the profiler's
allocation events, step time the median of 5 warm steps (1 thread is not forced:
on a shared 2-core machine compare times only within one run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch

from fxremat.harness import measure_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--kwargs", default='{"batch": 16, "seq": 64, "layers": 4}', help="model sizes, JSON")
    parser.add_argument("--budgets", default="1.0,0.8,0.6,0.4,0.3")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    kwargs = json.loads(args.kwargs)
    rows = []
    for budget in (float(b) for b in args.budgets.split(",")):
        try:
            r = measure_step(args.model, "fxremat", {"memory_budget": budget}, device=args.device,
                             model_kwargs=kwargs, time_steps=5)
        except RuntimeError as err:
            rows.append({"budget": budget, "error": str(err).strip().splitlines()[-1][:300]})
            print(rows[-1], flush=True)
            continue
        rows.append({"budget": budget, "budget_bytes": r["budget_bytes"][0], "solver": r["solver"][0],
                     "predicted_peak_bytes": r["predicted_peak_bytes"][0], "measured_peak_bytes": r["peak_bytes"],
                     "recomputed_ops": r["recomputed_ops"][0], "step_seconds": r["step_seconds"],
                     "device_name": r["device_name"]})
        print(rows[-1], flush=True)
    mib = 2**20
    print(f"\n{args.model} {kwargs}, {args.device}")
    print("| budget | budget (MiB) | solver | predicted peak (MiB) | measured peak (MiB) | measured ÷ budget | "
          "recomputed ops | step (ms) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['budget']} | - | - | - | - | - | - | {r['error'][:80]} |")
            continue
        print(f"| {r['budget']} | {r['budget_bytes'] / mib:.2f} | {r['solver']} | {r['predicted_peak_bytes'] / mib:.2f}"
              f" | {r['measured_peak_bytes'] / mib:.2f} | {r['measured_peak_bytes'] / r['budget_bytes']:.3f} | "
              f"{r['recomputed_ops']} | {r['step_seconds'] * 1e3:.1f} |")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "kwargs": kwargs, "torch": torch.__version__, "cpus": os.cpu_count(),
                       "date": datetime.date.today().isoformat(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
