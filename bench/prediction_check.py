"""Predicted against measured peak of one frontier model's training step, through Inductor.

    python bench/prediction_check.py MODEL [--scale small] [--sizes JSON] [--budget 0.0] [--solver auto] [--inductor JSON]
                                     [--options JSON]

Builds ``MODEL`` from ``bench/frontier_models.py`` (``decoder``, ``llama``, ``unet``, ..., and the
Hugging Face architectures outside the zoo, ``UNSEEN``: ``t5``, ``gpt_neox``, ..., and
``UNSEEN_VISION``: ``hf_resnet``, ``hf_convnext``, ...),
``--sizes`` replacing some of the scale's sizes, compiles it with ``backend="fxremat"`` at the
budget (a fraction, or bytes; 1.0 for no budget) with any further ``--options`` (the frontier
runs compile with ``{"hold_outputs": false}``), runs two steps, and measures the third with
the profiler's allocation events (``fxremat.measure.measure_peak_bytes``), gradients set to
None first. Prints one JSON line:
each graph's budget in bytes and predicted peak, and the step's measured peak. Caches are off, so every graph is
planned and lowered in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fxremat  # noqa: E402
import frontier_models  # noqa: E402
from fxremat.measure import measure_peak_bytes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=frontier_models.MODELS + frontier_models.UNSEEN + frontier_models.UNSEEN_VISION)
    parser.add_argument("--scale", default="small", choices=frontier_models.SCALES)
    parser.add_argument("--sizes", type=json.loads, default={},
                        help='sizes replacing the scale\'s, as JSON: \'{"layers": 4, "batch": 8}\'')
    parser.add_argument("--budget", default="1.0", help="a fraction (with a point) or bytes; 1.0: no budget")
    parser.add_argument("--solver", default="auto")
    parser.add_argument("--inductor", type=json.loads, default={},
                        help='Inductor options as JSON, passed as options["inductor"]')
    parser.add_argument("--options", type=json.loads, default={},
                        help='further fxremat options as JSON: \'{"hold_outputs": false}\'')
    args = parser.parse_args()
    budget = float(args.budget) if "." in args.budget else int(args.budget)
    options = {} if budget == 1.0 else {"memory_budget": budget, "solver": args.solver}
    if args.inductor:
        options["inductor"] = args.inductor
    options.update(args.options)
    torch.manual_seed(0)
    built = frontier_models.build(args.model, args.scale, args.sizes)
    with torch._functorch.config.patch(enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False):
        compiled = torch.compile(built.model, backend="fxremat", options=options)

        def step():
            built.model.zero_grad(set_to_none=True)
            compiled(*built.batch).backward()

        step()
        step()
        measured = measure_peak_bytes(step)["peak_bytes"]
    print(json.dumps({"model": args.model, "scale": args.scale, "sizes": built.sizes, "budget": budget, "solver": args.solver, "inductor": args.inductor,
                      "options": args.options,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "budget_bytes": [p.budget_bytes for p in fxremat.inspect.plans()],
                      "predicted_peak_bytes": [p.predicted_peak_bytes for p in fxremat.inspect.plans()],
                      "measured_peak_bytes": measured}))


if __name__ == "__main__":
    main()
