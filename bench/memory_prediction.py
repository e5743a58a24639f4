"""Predicted vs measured peak memory of one training step, per model.

    python bench/memory_prediction.py [--device cpu|cuda] [--out FILE]

Each row runs in a fresh process (fxremat.harness.measure_step): fxremat's
predicted peak (fxremat.timeline), the peak measured from PyTorch's profiler
allocation events (CPU) or torch.cuda.max_memory_allocated (CUDA), and on CPU
the peak-RSS rise with glibc's mmap threshold pinned. All figures are bytes
above what the inputs hold (baseline, reported apart).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import results_io  # noqa: E402
from fxremat.harness import measure_step  # noqa: E402

CASES = [
    ("mlp", {}), ("transformer", {}), ("cnn", {}), ("unet", {}), ("gpt", {}),
    ("mlp", {"batch": 4096}), ("transformer", {"batch": 64}), ("cnn", {"batch": 64}),
    ("unet", {"batch": 16}), ("gpt", {"batch": 32}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for model, kwargs in CASES:
        r = measure_step(model, "fxremat", device=args.device, model_kwargs=kwargs)
        (predicted,) = r["predicted_peak_bytes"]
        rows.append({"model": model, "model_kwargs": kwargs, "baseline_bytes": r["baseline_bytes"],
                     "predicted_peak_bytes": predicted, "measured_peak_bytes": r["peak_bytes"],
                     "rss_peak_bytes": r.get("rss_peak_bytes"), "predicted_over_measured": predicted / r["peak_bytes"],
                     "recomputed_ops": r["recomputed_ops"][0], "device_name": r["device_name"]})
        print(rows[-1], flush=True)
    print("\n| model | sizes | inputs (MiB) | predicted peak (MiB) | measured peak (MiB) | predicted ÷ measured | peak RSS rise (MiB) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    mib = 2**20
    for r in rows:
        rss = f"{r['rss_peak_bytes'] / mib:.2f}" if r["rss_peak_bytes"] is not None else "-"
        print(f"| {r['model']} | {r['model_kwargs'] or 'default'} | {r['baseline_bytes'] / mib:.2f} | "
              f"{r['predicted_peak_bytes'] / mib:.2f} | {r['measured_peak_bytes'] / mib:.2f} | "
              f"{r['predicted_over_measured']:.3f} | {rss} |")
    if args.out:  # with results_io's metadata: torch, machine, cpus, date, ...
        results_io.write_json(args.out, {"device": rows[0]["device_name"], "rows": rows})


if __name__ == "__main__":
    main()
