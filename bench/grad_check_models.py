"""Gradients under fxremat on the frontier's models, float64, at several budgets.

    python bench/grad_check_models.py [--models gpt2,bert,llama,vit,resnet50,unet]
                                      [--budgets 0.85,0.65,0.45,0.3] [--out FILE]

Each model at small sizes, in float64, planned with ``solver="auto"`` at each budget and run
at partition level (``compiler="eager"``: AOTAutograd with Inductor's decompositions, no code
generation). Per point: the solver of each compiled graph, whether each plan's predicted
peak fits its budget, and the largest gradient difference relative to each gradient's scale
against eager PyTorch and against plain ``torch.compile`` with the same decompositions (no
rematerialization). Where a model computes part of its loss in float32 (Hugging Face's
causal-LM loss upcasts its logits with ``.float()``, which turns float64 logits into float32),
the decomposed graph rounds differently from eager, and only the second comparison can be
exact. A budget below the least feasible one gives the error's least budget, which is then run
(in bytes), and the smaller budgets are skipped.
Needs ``transformers`` for the Hugging Face models (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import frontier_models  # noqa: E402
import results_io  # noqa: E402
from plan_records import least_budget  # noqa: E402

import fxremat  # noqa: E402
from fxremat.harness import grad_rel_error  # noqa: E402

SIZES = {
    "gpt2": dict(layers=4, dim=64, heads=4, seq=64, batch=4, vocab=256),
    "bert": dict(layers=4, dim=64, heads=4, seq=64, batch=4, vocab=256),
    "llama": dict(layers=4, dim=64, heads=4, kv_heads=2, ffn=128, seq=64, batch=4, vocab=256),
    "vit": dict(layers=4, dim=64, heads=4, patch=8, image=32, batch=4, classes=10),
    "resnet50": dict(depths=[1, 1, 1, 1], width=8, image=32, batch=4, classes=10),
    "unet": dict(channels=[3, 8, 16, 32], image=32, batch=2),
}


def _decomposed_backend():
    """Plain torch.compile's graphs without code generation: AOTAutograd with Inductor's
    decompositions and the default partitioner, run op by op."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    def run(gm, example_inputs):
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=run, bw_compiler=run, decompositions=select_decomp_table())


def _gradients(name: str, backend, options: dict | None = None) -> list[torch.Tensor | None]:
    torch.manual_seed(0)
    made = getattr(frontier_models, f"make_{name}")(**SIZES[name])
    model = made.model.double()
    batch = tuple(b.double() if b.is_floating_point() else b for b in made.batch)
    torch._dynamo.reset()
    run = model if backend is None else torch.compile(model, backend=backend, options=options)
    run(*batch).backward()
    return [p.grad for p in model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(SIZES))
    parser.add_argument("--budgets", default="0.85,0.65,0.45,0.3")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for name in args.models.split(","):
        eager = _gradients(name, None)
        plain = _gradients(name, _decomposed_backend())
        budgets: list = [float(b) for b in args.budgets.split(",")]
        while budgets:
            budget = budgets.pop(0)
            fxremat.inspect.clear()
            row = {"model": name, "sizes": SIZES[name], "budget": budget}
            try:
                grads = _gradients(name, "fxremat", {"compiler": "eager", "memory_budget": budget})
            except Exception as error:  # below the least feasible budget: the error names it
                least = least_budget(str(error))
                least = least if least and least.fraction else None  # the fraction's error names both
                row["error"] = (f"below the minimum: at least {least.fraction} ({least.bytes} bytes)"
                                if least else str(error).strip().splitlines()[-1][:300])
                if least and isinstance(budget, float):  # then the minimum it names, once
                    budgets = [least.bytes]
            else:
                plans = fxremat.inspect.plans()
                row.update(solvers=[p.solver for p in plans],
                           fits=all(p.predicted_peak_bytes <= p.budget_bytes for p in plans
                                    if not p.notes.get("nothing_to_trade")),
                           untraded_graphs=sum(bool(p.notes.get("nothing_to_trade")) for p in plans),
                           vs_eager=grad_rel_error(grads, eager), vs_torch_compile=grad_rel_error(grads, plain))
            rows.append(row)
            print(row, flush=True)
    print("\n| model | budget | solvers | plans fit | rel. error vs eager | vs torch.compile |")
    print("|---|---:|---|---|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['budget']} | — | — | {r['error']} | — |")
        else:
            print(f"| {r['model']} | {r['budget']} | {', '.join(r['solvers'])} | {'yes' if r['fits'] else 'NO'} | "
                  f"{r['vs_eager']:.1e} | {r['vs_torch_compile']:.1e} |")
    if args.out:  # with results_io's metadata: torch, date, ...
        results_io.write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
