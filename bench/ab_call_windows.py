"""Paired A/B in one process: the fusion guard's call windows on against off.

    python bench/ab_call_windows.py llama --scale small --budget 1.0 --rounds 12

Builds ``MODEL`` from ``bench/frontier_models.py``, compiles two copies with
``backend="fxremat"`` at the budget (a fraction; 1.0 for no budget): one with
``_compat._fuses_apart_across_calls`` as it is, one with it switched off (Inductor may then
fuse kernels that share no data across library calls). Each copy runs behind a function of
its own, since Dynamo keys its cache on the code and the parameters are graph inputs. Measures
each one's step peak (profiler allocation events), then times one step of each per round,
alternating which goes first. Prints one JSON line: both peaks, the median step times and the
median paired ratio (on ÷ off) with its range.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import frontier_models  # noqa: E402
from fxremat import _compat  # noqa: E402
from fxremat.measure import measure_peak_bytes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=frontier_models.MODELS)
    parser.add_argument("--scale", default="small", choices=frontier_models.SCALES)
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    rule = _compat._fuses_apart_across_calls
    torch.manual_seed(0)
    built = frontier_models.build(args.model, args.scale)
    options = {} if args.budget == 1.0 else {"memory_budget": args.budget}
    steps = {}
    with torch._functorch.config.patch(enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False):
        for name, on in (("on", True), ("off", False)):
            _compat._fuses_apart_across_calls = rule if on else (lambda node1, node2: False)
            model = copy.deepcopy(built.model)
            namespace = {"model": model}
            exec(f"def run_{name}(*batch):\n    return model(*batch)", namespace)
            compiled = torch.compile(namespace[f"run_{name}"], backend="fxremat", options=options)

            def step(model=model, compiled=compiled):
                model.zero_grad(set_to_none=True)
                compiled(*built.batch).backward()

            step()  # compiled here, with the rule as set
            step()
            steps[name] = (step, measure_peak_bytes(step)["peak_bytes"])
    _compat._fuses_apart_across_calls = rule
    times: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
            start = time.perf_counter()
            steps[name][0]()
            times[name].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times["on"], times["off"])]
    print(json.dumps({"model": args.model, "scale": args.scale, "budget": args.budget, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "peak_on": steps["on"][1], "peak_off": steps["off"][1],
                      "median_on_s": statistics.median(times["on"]), "median_off_s": statistics.median(times["off"]),
                      "median_ratio_on_off": statistics.median(ratios), "min_ratio": min(ratios),
                      "max_ratio": max(ratios), "rounds": args.rounds}))


if __name__ == "__main__":
    main()
