"""The staged searches' lower bound against the peaks it bounds, on the zoo's models.

    python bench/opening_bound_check.py [--out DIR] [--name opening_bound_check]

``StagedProblem.lower_bound`` passes over a schedule before it is built when its bound is
over the budget; the bound counts what the backward's opening adds, learnt from an earlier
probe (``timeline.backward_opening``). This builds Rotor's probes around every saved set the
planner plans around (the traffic-optimal one and the lean one) of each model, at the
least-memory search and at budgets of 0.4 and 0.7 of the min-cut plan's peak, with Inductor's
timeline, and compares each probe's predicted peak with the bound known before it was built:
how many probes, how many bounds counted an opening (more than the bytes alive as the backward
begins), how many were over the peak (a wrong bound: must be none), and how many runs of B
operations opened two probes' backwards differently (no bound is then taken: must be none).
Writes ``<name>.json`` and ``<name>.md`` under ``--out``. Not a test (a minute or two).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import results_io  # noqa: E402

FRACTIONS = (0.0, 0.4, 0.7)


def _models():
    from fxremat import models

    return {"transformer": lambda: models.make_transformer(batch=2, seq=32, dim=32, layers=3),
            "gpt": lambda: models.make_gpt(batch=2, seq=32), "cnn": models.make_cnn,
            "deep_cnn": models.make_deep_cnn, "unet": models.make_unet}


def check(name: str, make) -> dict:
    """One model's row: probes, bounds that counted an opening, bounds over the peak, and
    runs whose probes opened differently."""
    import torch

    from conftest import planning_context
    from fxremat.plans import BudgetError
    from fxremat.strategies import SOLVERS, staged

    row = {"model": name, "probes": 0, "opening_counted": 0, "over_peak": 0, "openings_differing": 0}
    real_build = staged.StagedProblem._build

    def build(self, schedule, light=False, known=None):
        saved = (known or self._saved(schedule))[0]
        bound = self.lower_bound(schedule, saved)
        found = real_build(self, schedule, light, known)
        row["probes"] += 1
        row["opening_counted"] += bound > self.ctx.backward_start_bytes(saved)
        row["over_peak"] += bound > found.peak
        return found

    staged.StagedProblem._build = build
    try:
        torch.manual_seed(0)
        model, batch = make()
        ctx, mincut_plan = planning_context(model, *batch, compiler="inductor")
        for saved_set in staged.saved_sets(ctx, staged.traffic(ctx, mincut_plan)):
            for fraction in FRACTIONS:
                try:
                    staged.plan_around(saved_set, int(fraction * mincut_plan.peak), SOLVERS["rotor"])
                except BudgetError:
                    pass  # (the least-memory search ends so)
        row["openings_differing"] = sum(found is None for key, openings in ctx.memo.items()
                                        if key[0] == "staged openings" for found in openings.values())
    finally:
        staged.StagedProblem._build = real_build
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    results_io.add_output_arguments(parser, "opening_bound_check")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for name, make in _models().items():
        rows.append(check(name, make))
        print(rows[-1], flush=True)
    meta = results_io.metadata(argv)
    results_io.write_json(os.path.join(args.out, f"{args.name}.json"), {"fractions": FRACTIONS, "rows": rows})
    lines = [f"# The staged searches' lower bound against the peaks it bounds ({meta['date']})", "",
             f"Machine: {meta['cpu']} ({meta['cpus']} CPUs), torch {meta['torch']}, fxremat at "
             f"{meta['git']['commit'][:10]}. Command: `{meta['command']}`. Rotor around each saved set, "
             f"least-memory search and budgets {FRACTIONS[1]} and {FRACTIONS[2]} of the min-cut plan's peak, "
             "Inductor's timeline.", "",
             "| model | probes built | bound counted an opening | bound over the peak | runs opening differently |",
             "|---|---:|---:|---:|---:|"]
    keys = ("model", "probes", "opening_counted", "over_peak", "openings_differing")
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    results_io.write_text(os.path.join(args.out, f"{args.name}.md"), "\n".join(lines) + "\n")
    return 0 if all(r["over_peak"] == 0 and r["openings_differing"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
