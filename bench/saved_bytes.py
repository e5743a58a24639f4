"""Saved-activation bytes: fxremat's min-cut vs PyTorch's default partitioner.

    python bench/saved_bytes.py [--inductor] [--out bench/results/cpu/saved_bytes.json]

Same models (fxremat.models.ZOO), same joint graphs, same counting
(fxremat.compare.forward_saved_bytes). Prints a Markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import results_io  # noqa: E402
from fxremat import compare, models  # noqa: E402


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
    if args.out:  # with results_io's metadata: torch, machine, cpus, date, ...
        results_io.write_json(args.out, {
            "what": "saved-activation bytes per training step (storages handed from forward to backward, "
                    "less those owned by the step's inputs)",
            "level": level, "processor": platform.processor() or platform.uname().machine, "rows": rows,
        })


if __name__ == "__main__":
    main()
