"""Saved-activation bytes: fxremat's min-cut vs PyTorch's default partitioner.

    python bench/saved_bytes.py [--inductor] [--out bench/results/cpu/saved_bytes.json]

Same models (fxremat.models.ZOO), same joint graphs, same counting
(fxremat.compare.forward_saved_bytes). Prints a Markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform

import torch

from fxremat import compare, models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inductor", action="store_true", help="partition inside TorchInductor (compiles C++)")
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args()
    rows = []
    for name, make in models.ZOO.items():
        theirs = compare.saved_bytes(make, "pytorch", inductor=args.inductor)
        ours = compare.saved_bytes(make, "fxremat", inductor=args.inductor)
        rows.append({"model": name, "pytorch_bytes": theirs, "fxremat_bytes": ours, "ratio": ours / theirs})
    level = "TorchInductor" if args.inductor else "AOTAutograd + Inductor decompositions"
    print(f"| model | PyTorch default (bytes) | fxremat (bytes) | fxremat ÷ PyTorch |  ({level})")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['pytorch_bytes']:,} | {r['fxremat_bytes']:,} | {r['ratio']:.3f} |")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({
                "what": "saved-activation bytes per training step (storages handed from forward to backward, "
                        "less those owned by the step's inputs)",
                "level": level, "torch": torch.__version__, "machine": platform.machine(),
                "processor": platform.processor() or platform.uname().machine, "cpus": os.cpu_count(),
                "date": datetime.date.today().isoformat(), "rows": rows,
            }, f, indent=1)


if __name__ == "__main__":
    main()
