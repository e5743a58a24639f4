"""One model's training steps at a memory budget: each step's peak, error and warnings, and
every plan fxremat made (solver, budget, predicted peak, saved bytes, floor, the step's
ledger and the plan's why). What a GPU session runs to see why a plan differs from the
CPU's, in one process and with no measuring subprocesses.

    python bench/step_plans.py --model gpt2 --scale gpu --budget 3624217088 --device cuda --out DIR
    python bench/step_plans.py --model gpt2 --scale tiny --budget 800000 --device cpu --out /tmp/x   # smoke

``--budget least``: a 1-byte budget first, whose error names the step's least budget, then
that budget in a fresh compile (again at a higher one a later error names, up to three
times). ``--sizes`` replaces some of the scale's sizes. Caches are off, so every plan is made
in this process.

With ``--solver rotor`` a refusal is Rotor's own ``BudgetError`` (its least plan and number of
stages), where ``auto`` takes the knapsack's plan and says only that Rotor found none within
the budget and what its least plan predicted.

Writes ``DIR/step_plans.json`` (per budget run: the steps and the plans) and prints one line per step and
per plan. The model is ``bench/frontier_models.py``'s, with fxremat's options as the
frontier gives them (``hold_outputs`` false: a step drops its loss). On CUDA the step's
peak is ``torch.cuda.max_memory_allocated`` above what was allocated before the step (the
inputs); on a CPU, one more step after the last is measured with the profiler's memory events
(``fxremat.measure.measure_peak_bytes``, ``measured_step_peak_bytes``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

LEAST_PROBES = 3

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's fxremat and bench modules first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--scale", default="gpu")
    parser.add_argument("--sizes", type=json.loads, default={},
                        help='sizes replacing the scale\'s, as JSON: \'{"layers": 4, "batch": 8}\'')
    parser.add_argument("--budget", required=True, help="memory_budget: bytes, '6GiB' or a fraction")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--solver", default="auto")
    parser.add_argument("--out", required=True)
    parser.add_argument("--record", default=None,
                        help="CUDA: record the last step of the last run into this folder, the step measured "
                             "(fxremat.harness.record_cuda_step: the allocator's history, the predicted timelines, Inductor's code)")
    args = parser.parse_args(argv)

    import torch

    import frontier_models
    from frontier_strategies import FX_OPTIONS_DEFAULT

    import fxremat
    import results_io
    from plan_records import least_budget

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # Caches off: every plan is made in this process (a plan from a cache has no record here).
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fx_graph_cache = False
    data = {"command": results_io.command(argv, script="step_plans.py"), "model": args.model,
            "scale": args.scale, "budget": args.budget, "device": args.device, "runs": []}
    if args.budget == "least":
        # A 1-byte budget's error names the step's least; a run at it whose error names a
        # higher one (a later graph seen only when it compiles) runs again at that.
        budgets = [1]
        for _ in range(1 + LEAST_PROBES):
            run = _run(args, budgets[-1], torch, fxremat, frontier_models, FX_OPTIONS_DEFAULT)
            data["runs"].append(run)
            least = least_budget(run["error"])
            if least is None or least.bytes in budgets:
                break
            budgets.append(least.bytes)
    else:
        budget = float(args.budget) if "." in args.budget else (int(args.budget) if args.budget.isdigit() else args.budget)
        data["runs"].append(_run(args, budget, torch, fxremat, frontier_models, FX_OPTIONS_DEFAULT))
    data["sizes"] = data["runs"][-1]["sizes"]
    os.makedirs(args.out, exist_ok=True)
    results_io.write_json(os.path.join(args.out, "step_plans.json"), data)


def _run(args, budget, torch, fxremat, frontier_models, fx_options) -> dict:
    """Compile the model at ``budget`` and run its steps: each step's peak, error and
    warnings, and the plans made."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    built = frontier_models.build(args.model, args.scale, args.sizes)
    model = built.model.to(args.device).train()
    batch = [b.to(args.device) for b in built.batch]
    compiled = torch.compile(model, backend="fxremat",
                             options={**fx_options, "memory_budget": budget, "solver": args.solver})
    since = fxremat.inspect.plan_count()
    run = {"budget": budget, "sizes": built.sizes, "steps": [], "plans": [], "error": None}
    print(f"budget {budget}", flush=True)
    for step in range(args.steps):
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        before = None
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        error = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if args.record and args.device == "cuda" and step == args.steps - 1 and step > 0:
                    # the last step itself recorded, as the loop runs it (no collection before it)
                    from fxremat.harness import record_cuda_step

                    record_cuda_step(model, lambda: compiled(*batch).backward(), fxremat.inspect.plans_since(since),
                                     args.record, collect=False)
                else:
                    compiled(*batch).backward()
            except fxremat.BudgetError as err:
                error = str(err)
        row = {"step": step, "wall_s": round(time.perf_counter() - started, 1), "error": error,
               "peak_above_inputs_bytes": (torch.cuda.max_memory_allocated() - before
                                           if args.device == "cuda" and error is None else None),
               "allocated_before_bytes": before,
               "warnings": [str(w.message) for w in caught if "fxremat" in str(w.message)]}
        run["steps"].append(row)
        print(json.dumps(row), flush=True)
        if error:
            run["error"] = error
            break
    if args.device == "cpu" and not run["error"]:
        from fxremat.measure import measure_peak_bytes

        model.zero_grad(set_to_none=True)
        run["measured_step_peak_bytes"] = measure_peak_bytes(lambda: compiled(*batch).backward())["peak_bytes"]
        print(f"measured step peak (profiler): {run['measured_step_peak_bytes']} bytes", flush=True)
    for plan in fxremat.inspect.plans_since(since):
        notes = plan.notes
        run["plans"].append({"graph": plan.graph_id, "solver": plan.solver, "budget_bytes": plan.budget_bytes,
                             "predicted_peak_bytes": plan.predicted_peak_bytes,
                             "saved_activation_bytes": plan.saved_activation_bytes,
                             "floor_bytes": notes.get("floor_bytes"), "step": notes.get("step"),
                             "why": notes.get("why"), "stages": notes.get("stages"),
                             "stages_merged": notes.get("stages_merged")})
        print(json.dumps(run["plans"][-1]), flush=True)
    return run


if __name__ == "__main__":
    main()
