"""Predicted against measured peak of the generated models of ``tests/test_generated_models.py``,
through Inductor, one line per seed.

    python bench/generated_check.py [SEED ...]      (default: seeds 0-59)

Each seed's model, input and budget come from the test's ``_generate``; the step is compiled
with ``backend="fxremat"`` (AOTAutograd's cache off, so every graph is planned here), run twice,
and the third step measured with the profiler's allocation events
(``fxremat.measure.measure_peak_bytes``), gradients set to None first. Prints the seed, the
model, the plan's solver, measured and predicted peaks, their ratio and the budget.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import fxremat  # noqa: E402
import test_generated_models as generated  # noqa: E402
from fxremat.measure import measure_peak_bytes  # noqa: E402


def main(seeds: list[int]) -> None:
    torch._functorch.config.enable_autograd_cache = False
    for seed in seeds:
        model, x, budget, described = generated._generate(seed)
        options = {"compiler": "inductor"} if budget is None else {"compiler": "inductor", "memory_budget": budget}
        step = generated._compiled_step(model, x, options)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in range(2):
                    model.zero_grad(set_to_none=True)
                    step()
        except Exception as error:  # noqa: BLE001 - reported, not raised
            print(f"{described} | refused: {type(getattr(error, 'inner_exception', error)).__name__}", flush=True)
            continue
        model.zero_grad(set_to_none=True)
        gc.collect()
        measured = measure_peak_bytes(step)["peak_bytes"]
        plan = fxremat.inspect.plans()[-1]
        print(f"{described} | {plan.solver} measured {measured} predicted {plan.predicted_peak_bytes} "
              f"ratio {measured / plan.predicted_peak_bytes:.4f} budget {plan.budget_bytes}", flush=True)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or list(range(60)))
