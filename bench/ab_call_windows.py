"""Paired A/B in one process: the fusion guard's call windows, under several rules.

    python bench/ab_call_windows.py llama --scale small --budget 1.0 --rounds 12 [--rules all side off]

Builds ``MODEL`` from ``bench/frontier_models.py`` (the zoo or ``UNSEEN``), compiles one copy
with ``backend="fxremat"`` at the budget (a fraction; 1.0 for no budget) per rule:

- ``all``: fxremat's rule (``_compat._fuses_across_calls``): no fusion joins kernels from
  different stretches between library calls;
- ``side``: the rule before 2026-11-30: only kernels that share no data (side by side) are kept
  apart across calls, a producer fused into its reader in a later stretch is let through;
- ``off``: the call windows ignored (Inductor fuses as it likes, the segment guard aside).

Each copy runs behind a function of its own, since Dynamo keys its cache on the code and the
parameters are graph inputs. Measures each one's step peak (profiler allocation events) beside
the plan's prediction, then times one step of each per round, rotating which goes first. Prints
one JSON line: peaks, median step times, and each rule's median paired ratio to the first rule
with its range.
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
import fxremat  # noqa: E402
from fxremat import _compat  # noqa: E402
from fxremat.measure import measure_peak_bytes  # noqa: E402


def _side_by_side_only(node1, node2) -> bool:
    """The rule before 2026-11-30: refuse only kernels with no data between them, across calls."""
    w1, w2 = _compat._call_windows(node1), _compat._call_windows(node2)
    if not w1 or not w2 or not w1.isdisjoint(w2):
        return False
    return (node1.get_operation_names().isdisjoint(node2.ancestors or ())
            and node2.get_operation_names().isdisjoint(node1.ancestors or ()))


RULES = {"all": _compat._fuses_across_calls, "side": _side_by_side_only, "off": lambda node1, node2: False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=frontier_models.MODELS + frontier_models.UNSEEN)
    parser.add_argument("--scale", default="small", choices=frontier_models.SCALES)
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--rules", nargs="+", default=["all", "off"], choices=sorted(RULES))
    args = parser.parse_args()
    rule = _compat._fuses_across_calls
    torch.manual_seed(0)
    built = frontier_models.build(args.model, args.scale)
    options = {} if args.budget == 1.0 else {"memory_budget": args.budget}
    steps, peaks, predicted = {}, {}, {}
    with torch._functorch.config.patch(enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False):
        for name in args.rules:
            _compat._fuses_across_calls = RULES[name]
            model = copy.deepcopy(built.model)
            namespace = {"model": model}
            exec(f"def run_{name}(*batch):\n    return model(*batch)", namespace)
            compiled = torch.compile(namespace[f"run_{name}"], backend="fxremat", options=options)

            def step(model=model, compiled=compiled):
                model.zero_grad(set_to_none=True)
                compiled(*built.batch).backward()

            count = fxremat.inspect.plan_count()
            step()  # compiled here, with the rule as set
            step()
            predicted[name] = [p.predicted_peak_bytes for p in fxremat.inspect.plans_since(count)]
            steps[name], peaks[name] = step, measure_peak_bytes(step)["peak_bytes"]
    _compat._fuses_across_calls = rule
    times: dict[str, list[float]] = {name: [] for name in args.rules}
    for r in range(args.rounds):
        order = args.rules[r % len(args.rules):] + args.rules[:r % len(args.rules)]
        for name in order:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    first = args.rules[0]
    ratios = {name: [a / b for a, b in zip(times[name], times[first])] for name in args.rules[1:]}
    print(json.dumps({"model": args.model, "scale": args.scale, "budget": args.budget, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "rules": args.rules, "predicted_peak_bytes": predicted,
                      "measured_peak_bytes": peaks,
                      "median_s": {name: statistics.median(t) for name, t in times.items()},
                      f"median_ratio_to_{first}": {name: statistics.median(r) for name, r in ratios.items()},
                      "min_ratio": {name: min(r) for name, r in ratios.items()},
                      "max_ratio": {name: max(r) for name, r in ratios.items()}, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
