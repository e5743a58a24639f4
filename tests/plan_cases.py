"""The plans fxremat makes on the bundled models, as plain data, for the refactoring guard
(``tests/test_plans_unchanged.py``): every solver at several budgets, with the timeline
predicted for both compilers. A change that should keep plans identical is checked
against ``tests/fixtures/plans.json``; a change that means to alter plans re-records it:

    python tests/plan_cases.py --write [CASE_ID ...]   (only those cases, when named)
"""

from __future__ import annotations

import json
import pathlib
import sys
import warnings

import torch

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "plans.json"

# Small configurations: a partition-level run of every case takes a few minutes on 2 cores.
MODELS = {
    "transformer": dict(batch=4, seq=32, layers=3),
    "deep_cnn": dict(batch=4, size=16, depth=4),
    "unet": dict(batch=2, size=16),
    "gpt": dict(batch=2, seq=32),
}
SOLVERS = ("auto", "mincut", "knapsack", "rotor", "rotor_exact", "checkmate", "twremat")
BUDGETS = (None, 0.85, 0.6, 0.4)
# Beyond the grid: the fraction 0.0 (the least-memory plan), and a byte budget under it (the
# error naming the least feasible budget; a fraction is never refused).
EXTRA = (("transformer", "auto", 0.0, "eager"), ("transformer", "auto", 1_000_000, "eager"))
# The suite's subset (about 30 s): every solver, both compilers' timelines, budget errors,
# and a graph no plan gets much below its min-cut plan (the GPT's logits dominate).
QUICK = (
    "transformer-mincut-None-inductor", "transformer-mincut-0.6-eager", "transformer-auto-0.6-inductor",
    "transformer-rotor-0.6-eager", "transformer-rotor_exact-0.6-inductor", "deep_cnn-auto-0.6-eager",
    "deep_cnn-checkmate-0.6-eager", "deep_cnn-twremat-0.6-inductor", "deep_cnn-knapsack-0.85-eager",
    "unet-auto-0.6-eager", "gpt-rotor-0.85-eager", "transformer-auto-0.0-eager", "transformer-auto-1000000-eager",
)


def cases() -> list[tuple[str, str, float | None, str]]:
    found = []
    for model in MODELS:
        for solver in SOLVERS:
            if solver == "checkmate" and model in ("transformer", "gpt"):
                continue  # its ILP takes minutes there; the CNNs' stage DAGs cover it
            for budget in BUDGETS:
                if budget is None and solver not in ("auto", "mincut"):
                    continue
                compilers = ("eager", "inductor") if solver in ("auto", "mincut") or budget == 0.6 else ("eager",)
                found.extend((model, solver, budget, compiler) for compiler in compilers)
    return found + list(EXTRA)


def case_id(case) -> str:
    model, solver, budget, compiler = case
    return f"{model}-{solver}-{budget}-{compiler}"


def record(case, scratch: dict[str, int] | None = None) -> dict:
    """The plan of ``case`` as plain data (or the budget error it raises), and under
    ``"scratch"`` the library calls' scratch bytes it was planned with.

    The scratch of a CPU convolution is measured on the machine (``fxremat.workspace``), and
    oneDNN's paths differ between CPUs (AVX-512 or AVX2 only) and so do the plans made with
    them. Given ``scratch`` (a recorded table) the case is planned with those figures, so a
    recorded plan is reproduced on any machine; calls not in it are measured."""
    import fxremat
    from fxremat import models, workspace
    from fxremat.backend import FxrematPartitioner, _eager_compile
    from fxremat.options import Options

    model_name, solver, budget, compiler = case
    torch.manual_seed(0)
    model, batch = models.ZOO[model_name](**MODELS[model_name])
    options = {"solver": solver, "compiler": compiler}
    if budget is not None:
        options["memory_budget"] = budget
    torch._dynamo.reset()
    fxremat.inspect.clear()
    plans = []

    def backend(gm, example_inputs):
        partitioner = FxrematPartitioner(Options.from_user(options))
        return _eager_compile(gm, example_inputs, partitioner)

    compiled = torch.compile(model, backend=backend)
    before = workspace.measured()
    workspace._MEASURED.clear()
    workspace.adopt(scratch or {})
    error_record = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(*batch).backward()
    except Exception as error:  # noqa: BLE001 - a budget error is part of the record
        cause = getattr(error, "inner_exception", None) or error
        error_record = {"error": type(cause).__name__, "least_bytes": getattr(cause, "least_bytes", None)}
    finally:
        torch._dynamo.reset()
        used = workspace.measured()
        workspace._MEASURED.clear()
        workspace.adopt(before)
    if error_record is not None:
        return {**error_record, "scratch": used}
    for plan in fxremat.inspect.plans():
        plans.append({
            "graph_id": plan.graph_id,
            "solver": plan.solver,
            "saved": [d["name"] for d in plan.saved],
            "recomputed": [d["name"] for d in plan.recomputed],
            "sequence": plan.sequence,
            "stages": plan.stages,
            "predicted_peak_bytes": plan.predicted_peak_bytes,
            "budget_bytes": plan.budget_bytes,
            # The min-cut's value comes from NetworkX summing a set's capacities: its last
            # bits follow the process's string hash seed.
            "cut_cost": float(f"{plan.cut_cost:.12g}"),
            "given_up": plan.notes.get("given_up"),
        })
    return {"plans": plans, "scratch": used}


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--write":
        print(__doc__)
        return 2
    only = set(argv[1:])  # case ids to record again; the others keep their recorded plans
    unknown = only - {case_id(c) for c in cases()}
    if unknown:
        raise SystemExit(f"no such cases: {sorted(unknown)}")
    old = json.loads(FIXTURE.read_text()) if only else {}
    recorded = old.get("plans", {})
    data = {**{k: v for k, v in old.items() if k not in ("torch", "plans")}, "torch": torch.__version__,
            "plans": {case_id(c): record(c) if not only or case_id(c) in only else recorded[case_id(c)]
                      for c in cases()}}
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(data['plans'])} cases to {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
