"""Solve time of passes.rotor on long heterogeneous chains.

    python bench/rotor_solve_time.py [--stages 100 340] [--bins 500] [--exact 20 40] [--out FILE]

Chains are synthetic and seeded: per stage, output sizes 1-10, recorded sizes 1-3 times
that, forward times 0.5-3, backward times 1-6, overheads up to 2 (forward) and 8
(backward), plus the loss stage. Budgets sit at 10%, 50% and 90% of the way from the
smallest feasible budget to the peak of storing everything. Prints a Markdown table:
solve time (wall clock, one run, including the sequence and its simulation) and the
makespan relative to no rematerialization. ``--exact`` also times the weakly
persistent (exact) DP on shorter chains. Not a test: no assertion on times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import results_io  # noqa: E402
from fxremat.passes import rotor  # noqa: E402


def synthetic_chain(stages: int, seed: int = 0) -> rotor.Chain:
    rng = np.random.default_rng(seed)
    w_a = rng.uniform(1, 10, stages)
    return rotor.Chain(
        u_f=rng.uniform(0.5, 3, stages), u_b=rng.uniform(1, 6, stages), w_a=w_a,
        w_abar=w_a * rng.uniform(1, 3, stages), w_a0=5.0,
        o_f=rng.uniform(0, 2, stages), o_b=rng.uniform(0, 8, stages)).with_loss()


def measure(stages: int, bins: int, persistent: bool, fractions=(0.1, 0.5, 0.9)) -> list[dict]:
    chain = synthetic_chain(stages)
    base, top = rotor.simulate(chain, rotor.store_all(chain))
    least = rotor.min_budget(chain, persistent)
    rows = []
    for fraction in fractions:
        budget = least + fraction * (top - least)
        start = time.perf_counter()
        sol = rotor.solve(chain, budget, bins=bins, persistent=persistent)
        seconds = time.perf_counter() - start
        rows.append({"dp": "persistent" if persistent else "exact", "stages": stages, "bins": bins,
                     "budget_fraction": fraction, "seconds": seconds,
                     "makespan_ratio": sol.makespan / base, "peak_over_budget": sol.peak / budget,
                     "ops": len(sol.sequence)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, nargs="*", default=[100, 340], help="persistent DP chain lengths")
    parser.add_argument("--exact", type=int, nargs="*", default=[], help="exact DP chain lengths (keep small)")
    parser.add_argument("--bins", type=int, default=500)
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args()
    rows = []
    for stages in args.stages:
        rows += measure(stages, args.bins, persistent=True)
    for stages in args.exact:
        rows += measure(stages, args.bins, persistent=False)
    print(f"| DP | stages (+ loss) | bins | budget | solve (s) | makespan ÷ no remat | peak ÷ budget | ops |"
          f"  ({os.cpu_count()} CPUs, numpy {np.__version__})")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['dp']} | {r['stages']} | {r['bins']} | {r['budget_fraction']:.0%} | {r['seconds']:.2f} | "
              f"{r['makespan_ratio']:.3f} | {r['peak_over_budget']:.3f} | {r['ops']} |")
    if args.out:  # with results_io's metadata: machine, cpus, date, ...
        results_io.write_json(args.out, {"what": "passes.rotor solve time on synthetic chains",
                                         "numpy": np.__version__, "rows": rows})


if __name__ == "__main__":
    main()
