"""fxremat's planning time inside ``torch.compile`` (the Inductor path), and a digest of the plan.

    python bench/compile_plan_time.py [--layers 16] [--budget 0.5] [--repeat 3]

What issue #21's first call pays for planning: the partitioner's plan of
``fxremat.models.TransformerStack`` (dim 64, 4 heads, sequence 64, batch 2: issue #21's
model), made where ``torch.compile`` makes it (Dynamo's tracing context, Inductor's config
and timeline) and stopped there (``fxremat.plans.planning_only``: no Inductor compilation).
Each repeat traces the model again (``torch._dynamo.reset``) and reads the plan's
``solve_seconds``. Prints one JSON line a repeat and a summary line (least and median
seconds) with the plan's digest: the solver, what is saved and recomputed, the sequence, the
predicted peak and budget, and every step of its predicted timeline (what it allocates and
reads), so two versions of the code can be shown to plan the same.

To compare two versions of the code on a shared machine, run this alternately in each
checkout, a few times (``PYTHONPATH=<checkout> python <checkout>/bench/compile_plan_time.py``),
and compare the least and the medians: the machine's slow spells last minutes and move single
runs by 30% (2026-11-28). Not a test; nothing is written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys


def plan_digest(plan) -> str:
    """What every rank must agree on (``fxremat.ranks.plan_key``), with every step of the
    predicted timeline: what it allocates and reads."""
    from fxremat.ranks import plan_key

    steps = [(s.phase, s.name, sorted(s.reads), sorted(s.allocates.items()), s.in_place, s.frees_late)
             for s in plan.timeline.steps]
    text = json.dumps([plan_key(plan), steps], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_once(layers: int, budget: float):
    """The plan of the transformer's graph, made inside ``torch.compile`` and not compiled."""
    import torch

    from fxremat import models
    from fxremat.plans import Planned, planning_only, wrapped

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, batch = models.make_transformer(batch=2, seq=64, dim=64, layers=layers)
    compiled = torch.compile(model, backend="fxremat", options={"memory_budget": budget})
    with planning_only():
        try:
            compiled(*batch).sum().backward()
        except Exception as error:  # noqa: BLE001 - Planned, as Dynamo passes it on
            planned = wrapped(error, (Planned,))
            if planned is None:
                raise
            return planned.plan
    raise RuntimeError("the compile was not stopped at its plan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    seconds, digests = [], set()
    for run in range(args.repeat):
        plan = plan_once(args.layers, args.budget)
        digest = plan_digest(plan)
        seconds.append(plan.solve_seconds)
        digests.add(digest)
        print(json.dumps({"layers": args.layers, "budget": args.budget, "run": run,
                          "solve_seconds": round(plan.solve_seconds, 3), "digest": digest}), flush=True)
    print(json.dumps({"layers": args.layers, "budget": args.budget, "least_s": round(min(seconds), 3),
                      "median_s": round(statistics.median(seconds), 3), "digests": sorted(digests)}))
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
