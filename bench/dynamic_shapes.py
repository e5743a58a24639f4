"""Dynamic shapes under a byte budget (issue #24): a training loop of 100 steps over 5 sequence
lengths, compiled once with ``dynamic=True``; how many plans (replans) and BudgetErrors it
takes, the measured peak at each length against the budget, and the per-call cost of the
guards that keep each plan to the sizes it fits (Dynamo's guard check, timed with and without
a budget).

    python bench/dynamic_shapes.py [--out bench/results/cpu/dynamic_shapes] [--compiler eager]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import fxremat  # noqa: E402
from fxremat import _compat, measure, models  # noqa: E402

LENGTHS = (32, 48, 64, 96, 128)


def batch(b: int, t: int, dim: int):
    return torch.randn(b, t, dim), torch.randn(b, t, dim)


def loop(args) -> dict:
    torch.manual_seed(0)
    model = models.make_transformer(dim=args.dim, layers=args.layers)[0]
    compiled = torch.compile(model, backend="fxremat", dynamic=True,
                             options={"compiler": args.compiler, "memory_budget": args.budget})
    # A warm-up over the lengths in ascending order (short sequences first), then a seeded
    # random order: the plan made at a short length does not fit a long one, so it replans.
    order = list(LENGTHS) + random.Random(0).choices(LENGTHS, k=args.steps - len(LENGTHS))
    errors: dict[int, str] = {}
    step_s: dict[int, list[float]] = {t: [] for t in LENGTHS}
    plans_after: list[int] = []
    started = time.perf_counter()
    for t in order:
        x, y = batch(args.batch, t, args.dim)
        model.zero_grad(set_to_none=True)
        begun = time.perf_counter()
        try:
            compiled(x, y).backward()
        except fxremat.BudgetError as error:
            errors[t] = str(error)[-240:]
        else:
            step_s[t].append(time.perf_counter() - begun)
        plans_after.append(len(fxremat.inspect.plans()))
    loop_s = time.perf_counter() - started
    measured = {}
    for t in LENGTHS:
        if t in errors:
            continue
        x, y = batch(args.batch, t, args.dim)

        def step():
            model.zero_grad(set_to_none=True)
            compiled(x, y).backward()

        measured[t] = measure.measure_peak_bytes(step)["peak_bytes"]
    entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(type(model).forward.__code__)
    return {
        "steps": args.steps, "lengths": list(LENGTHS), "order_counts": {t: order.count(t) for t in LENGTHS},
        "plans": len(fxremat.inspect.plans()), "compiles_at_step": [i for i in range(len(plans_after))
                                                                    if i == 0 or plans_after[i] != plans_after[i - 1]],
        "cache_entries": len(entries), "budget_errors": errors, "measured_peak_bytes": measured,
        "budget_bytes": args.budget, "loop_s": loop_s,
        "median_step_s": {t: sorted(v)[len(v) // 2] for t, v in step_s.items() if len(v) > 2},
        "plans_detail": [{"solver": p.solver, "predicted_peak_bytes": p.predicted_peak_bytes,
                          "size_symbols": p.notes.get("size_symbols"), "valid_while": p.notes.get("valid_while")}
                         for p in fxremat.inspect.plans()],
    }


def guard_cost(args, budget, calls: int = 20000) -> float:
    """Seconds of one Dynamo guard check of the compiled frame (its newest cache entry),
    after one step at sequence length 64."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = models.make_transformer(dim=args.dim, layers=args.layers)[0]
    options = {"compiler": args.compiler}
    if budget is not None:
        options["memory_budget"] = budget
    compiled = torch.compile(model, backend="fxremat", dynamic=True, options=options)
    x, y = batch(args.batch, 64, args.dim)
    compiled(x, y).backward()
    [entry, *_] = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(type(model).forward.__code__)
    f_locals = {"self": model, "x": x, "y": y}
    if not entry.guard_manager.check(f_locals):
        raise RuntimeError("the guard does not pass on the inputs it was compiled for")
    best = float("inf")
    for _ in range(5):
        begun = time.perf_counter()
        for _ in range(calls):
            entry.guard_manager.check(f_locals)
        best = min(best, (time.perf_counter() - begun) / calls)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cpu", "dynamic_shapes"))
    parser.add_argument("--compiler", default="eager", choices=("eager", "inductor"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--budget", type=int, default=10_500_000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with _compat.autograd_cache_disabled():
        result = loop(args)
        with_budget = guard_cost(args, args.budget)
        without = guard_cost(args, None)
    result.update(guard_check_s_with_budget=with_budget, guard_check_s_without_budget=without,
                  date=time.strftime("%Y-%m-%d"), machine=f"{platform.machine()}, {os.cpu_count()} cores",
                  torch=torch.__version__, compiler=args.compiler,
                  model=f"TransformerStack dim {args.dim}, {args.layers} layers, batch {args.batch}, fp32")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    mib = 2 ** 20
    rows = "\n".join(
        f"| {t} | {r['order_counts'][str(t)] if str(t) in r['order_counts'] else r['order_counts'][t]} | "
        + (f"{r['measured_peak_bytes'][t] / mib:.2f} | {r['measured_peak_bytes'][t] <= r['budget_bytes']} | "
           f"{r['median_step_s'].get(t, float('nan')) * 1e3:.1f}" if t in r["measured_peak_bytes"]
           else f"BudgetError | — | —") + " |"
        for t in r["lengths"])
    overhead = r["guard_check_s_with_budget"] - r["guard_check_s_without_budget"]
    step = min(r["median_step_s"].values()) if r["median_step_s"] else float("nan")
    return f"""# Dynamic shapes under a byte budget ({r['date']})

Machine: {r['machine']}, torch {r['torch']}, compiler {r['compiler']}, one thread. Model: {r['model']};
`torch.compile(dynamic=True)`, `memory_budget={r['budget_bytes']}` bytes ({r['budget_bytes'] / mib:.2f} MiB).
Command: `python bench/dynamic_shapes.py --compiler {r['compiler']} --budget {r['budget_bytes']}`.

{r['steps']} steps over sequence lengths {', '.join(map(str, r['lengths']))} (ascending once, then in a seeded random order): **{r['plans']}
plans** (made at steps {r["compiles_at_step"]}), {len(r['budget_errors'])} lengths refused with a
`BudgetError` naming the size, {r['cache_entries']} Dynamo cache entries; the loop took {r['loop_s']:.1f} s.

| length | steps | measured peak (MiB) | ≤ budget | median step (ms) |
|---:|---:|---:|---|---:|
{rows}

Dynamo tries its newest cache entry first: once a plan is made for a longer sequence, the shorter
ones run it too (it fits them: its guard holds), with its recomputation.

Guard check per call (Dynamo's guard manager of the newest cache entry, best of 5 × 20,000):
{r['guard_check_s_with_budget'] * 1e6:.2f} µs with the budget's guards, {r['guard_check_s_without_budget'] * 1e6:.2f} µs
without a budget: {overhead * 1e6:+.2f} µs a call, {overhead / step * 100 if step == step else float('nan'):.4f}% of the
fastest median step.
"""


if __name__ == "__main__":
    sys.exit(main())
