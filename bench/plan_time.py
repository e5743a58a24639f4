"""Planning time and planner memory: fxremat's partitioner beside PyTorch's, on the same
joint graphs, in the same process.

    python bench/plan_time.py [--layers 4 8 16 32 48 64] [--models llama resnet50 ...]
                              [--budget 0.5] [--infeasible-bytes 100000] [--repeat 2] [--out DIR]

Each model is traced once in a child process of its own (Dynamo and AOTAutograd, the
default partitioner standing in, so the joint graph is what ``torch.compile`` hands a
partitioner). The child then times, alternating ``--repeat`` times on fresh copies of
the joint graph:

- ``fxremat``: ``fxremat.partition.partition`` with ``solver="auto"``, ``compiler="eager"``
  (the timeline of the eager path: no Inductor config in the way) at ``--budget``;
- ``pytorch_budget``: PyTorch's ``min_cut_rematerialization_partition`` with
  ``activation_memory_budget=--budget``;
- ``pytorch_default``: the same without a budget (what plain ``torch.compile`` runs);
- ``fxremat_infeasible_bytes``: fxremat at ``--infeasible-bytes`` (a byte budget under every
  graph's floor, refused at once), and ``fxremat_at_floor`` at the graph's floor (the bytes that
  refusal names: a budget the search runs for and refuses, naming the least feasible one,
  unless the least plan is at the floor). Every fraction is feasible (0.0 is the least plan).

and then each partitioner's peak Python memory (``tracemalloc``, one more run each: the
planner's own allocations, graphs and solver state, not torch's C++ tensors), each from a
collected heap (``gc.collect()``).

Models: ``transformer`` is ``fxremat.models.TransformerStack`` at dim 64, 4 heads, sequence
64, batch 2, at each ``--layers`` count (issue #21's table); the others are the frontier's
(``bench/frontier_models.py``, scale ``small``). Writes ``plan_time.json`` and
``plan_time.md`` under ``--out`` (default ``bench/results/cpu``). Not a test: times vary
with the machine's load; ratios are taken within one child.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import results_io  # noqa: E402


def _capture(model_name: str, layers: int):
    """The joint graph of the model's first (largest) compiled graph, its inputs and the
    partitioner's keyword arguments."""
    import torch
    from torch._functorch.partitioners import default_partition

    from fxremat.backend import _eager_compile

    captured = []

    def capture(gm, joint_inputs, **kw):
        captured.append((copy.deepcopy(gm), joint_inputs, kw))
        return default_partition(gm, joint_inputs, **kw)

    torch.manual_seed(0)
    if model_name == "transformer":
        from fxremat import models

        model, batch = models.make_transformer(batch=2, seq=64, dim=64, layers=layers)
    else:
        import frontier_models

        built = frontier_models.build(model_name, "small")
        model, batch = built.model, built.batch
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=lambda gm, ex: _eager_compile(gm, ex, capture))
    compiled(*batch).backward()
    torch._dynamo.reset()
    return max(captured, key=lambda c: len(c[0].graph.nodes))


def _child(spec: dict) -> dict:
    import gc
    import tracemalloc
    import warnings

    from torch._functorch import config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from fxremat.options import Options
    from fxremat.partition import partition
    from fxremat.plans import BudgetError

    warnings.simplefilter("ignore")
    joint, joint_inputs, kw = _capture(spec["model"], spec["layers"])
    import fxremat

    row = {"model": spec["model"], "layers": spec["layers"], "joint_nodes": len(joint.graph.nodes),
           "fxremat_from": os.path.dirname(os.path.dirname(os.path.abspath(fxremat.__file__)))}

    def fxremat_at(budget):
        def run():
            options = Options.from_user({"memory_budget": budget, "solver": "auto", "compiler": "eager"})
            try:
                _, _, plan = partition(copy.deepcopy(joint), joint_inputs, options=options, **kw)
                return {"solver": plan.solver, "predicted_peak_bytes": plan.predicted_peak_bytes}
            except BudgetError as error:
                return {"error": "BudgetError", "least_bytes": error.least_bytes}
        return run

    def pytorch(budget):
        def run():
            with functorch_config.patch(activation_memory_budget=budget):
                min_cut_rematerialization_partition(copy.deepcopy(joint), joint_inputs, **kw)
            return {}
        return run

    floor = fxremat_at(spec["infeasible_bytes"])().get("least_bytes")  # the floor's error names it
    row["floor_bytes"] = floor
    runs = {"fxremat": fxremat_at(spec["budget"]), "pytorch_budget": pytorch(spec["budget"]),
            "pytorch_default": pytorch(1.0), "fxremat_at_floor": fxremat_at(floor or 1),
            "fxremat_infeasible_bytes": fxremat_at(spec["infeasible_bytes"])}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(spec["repeat"]):
        for name, run in runs.items():
            started = time.perf_counter()
            row[f"{name}_result"] = run()
            seconds[name].append(time.perf_counter() - started)
    for name in runs:
        row[f"{name}_s"] = min(seconds[name])
        row[f"{name}_all_s"] = seconds[name]
    for name in ("fxremat", "pytorch_budget"):
        # From a collected heap: a run's peak counts the cyclic garbage (FX graphs) left
        # until the collector runs, and the runs before would change when it does.
        gc.collect()
        tracemalloc.start()
        runs[name]()
        row[f"{name}_peak_python_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    row["fxremat_over_pytorch_budget"] = row["fxremat_s"] / row["pytorch_budget_s"]
    row["fxremat_over_pytorch_default"] = row["fxremat_s"] / row["pytorch_default_s"]
    row["memory_ratio"] = row["fxremat_peak_python_bytes"] / row["pytorch_budget_peak_python_bytes"]
    return row


def _markdown(rows: list[dict], meta: dict, budget: float, infeasible_bytes: int) -> str:
    lines = [
        f"# Planning time: fxremat beside PyTorch's partitioner ({meta['date'][:10]})", "",
        f"Machine: {meta['cpu']} ({meta['cpus']} CPUs), torch {meta['torch']}, fxremat at {meta['git']['commit'][:10]}. "
        f"Command: `{meta['command']}`.", "",
        f"Budget {budget} (fxremat `solver=\"auto\"`, `compiler=\"eager\"`; PyTorch "
        f"`activation_memory_budget={budget}`); infeasible: fxremat at each graph's floor (searched, then "
        f"refused, or planned where the least plan is at the floor) and at {infeasible_bytes:,} bytes (under "
        f"the floor: refused at once). Seconds are the least of "
        "the repeats, all runs in one process per model, alternating; memory is the peak of Python "
        "allocations (`tracemalloc`) during one partition.", "",
        "| model | layers | joint nodes | fxremat (s) | PyTorch budget (s) | ratio | PyTorch default (s) | "
        f"at the floor (s) | refused at {infeasible_bytes:,} B (s) | fxremat MB | PyTorch MB | "
        "memory ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['layers'] or 'small'} | failed: {r['error'][:80]} |")
            continue
        lines.append(
            f"| {r['model']} | {r['layers'] or 'small'} | {r['joint_nodes']:,} | {r['fxremat_s']:.2f} | "
            f"{r['pytorch_budget_s']:.2f} | {r['fxremat_over_pytorch_budget']:.2f}x | {r['pytorch_default_s']:.2f} | "
            f"{r['fxremat_at_floor_s']:.2f} | {r['fxremat_infeasible_bytes_s']:.2f} | "
            f"{r['fxremat_peak_python_bytes'] / 2**20:.0f} | "
            f"{r['pytorch_budget_peak_python_bytes'] / 2**20:.0f} | {r['memory_ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[4, 8, 16, 32, 48, 64])
    parser.add_argument("--models", nargs="*", default=[], help="frontier models (bench/frontier_models.py)")
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--infeasible-bytes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    results_io.add_output_arguments(parser, "plan_time")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    specs = [dict(model="transformer", layers=n) for n in args.layers] + [dict(model=m, layers=0) for m in args.models]
    rows = []
    for spec in specs:
        spec.update(budget=args.budget, infeasible_bytes=args.infeasible_bytes,
                    repeat=args.repeat)
        rows.append(results_io.run_child(__file__, spec))
        print(json.dumps({k: v for k, v in rows[-1].items() if not k.endswith("_all_s")}), flush=True)
    meta = results_io.metadata()
    results_io.write_json(os.path.join(args.out, f"{args.name}.json"),
                          {"budget": args.budget, "infeasible_bytes": args.infeasible_bytes, "rows": rows})
    results_io.write_text(os.path.join(args.out, f"{args.name}.md"),
                          _markdown(rows, meta, args.budget, args.infeasible_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
