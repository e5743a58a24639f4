"""First call through Inductor: fxremat at a budget beside plain ``torch.compile``, fresh caches.

    python bench/first_call.py [--layers 4 16] [--budget 0.5] [--repeat 2] [--out DIR]

What a user waits for before the first training step runs: Dynamo, AOTAutograd, the
partition (PyTorch's default partitioner, or fxremat's planner at ``--budget``) and
Inductor's compilation of the forward and the backward, then the step itself. Beside
them, PyTorch's own budget partitioner at the same budget
(``torch._functorch.config.activation_memory_budget``): what a budget costs the incumbent. Each run
is a child process of its own with an empty Inductor cache directory (no FX graph,
AOTAutograd or kernel cache hit), compiling ``fxremat.models.TransformerStack`` (dim 64,
4 heads, sequence 64, batch 2: issue #21's model) and timing its first forward and
backward. The modes alternate (``torch``, ``torch_budget``, ``fxremat``, then the reverse, ...),
``--repeat`` runs each; the table keeps each mode's least total and the times Dynamo
records for its parts (``torch._dynamo.utils.compilation_time_metrics``): the partition,
the forward's and the backward's Inductor compilation, and how many C++ kernel sources
Inductor wrote for the backward (one per distinct kernel, on CPU). Writes ``first_call.json`` and
``first_call.md`` under ``--out`` (default ``bench/results/cpu``). Not a test: the ratio is
taken within one run of this script; the machine's load moves both.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import results_io  # noqa: E402

# Names Dynamo times the parts under (``dynamo_timed``), torch 2.11 and 2.13.
PARTS = {
    "partition": ("min_cut_rematerialization_partition", "FxrematPartitioner"),
    "forward_compile": ("compile_fx.<locals>.fw_compiler_base",),
    "backward_compile": ("compile_fx.<locals>.bw_compiler",),
}

MODES = ("torch", "torch_budget", "fxremat")


def _cpp_files(folder: str) -> dict[str, int]:
    """The C++ sources Inductor has written under ``folder`` (its cache), and their bytes."""
    return {p: os.path.getsize(p) for p in glob.glob(os.path.join(folder, "**", "*.cpp"), recursive=True)}


def _child(spec: dict) -> dict:
    """One first call, in this (fresh) process."""
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="first_call_")
    import warnings

    import torch
    from torch._dynamo.utils import compilation_time_metrics

    import fxremat  # noqa: F401 (registers the backend)
    from fxremat import models

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, batch = models.make_transformer(batch=2, seq=64, dim=64, layers=spec["layers"])
    if spec["mode"] == "torch":
        compiled = torch.compile(model)
    elif spec["mode"] == "torch_budget":
        torch._functorch.config.activation_memory_budget = spec["budget"]
        compiled = torch.compile(model)
    else:
        compiled = torch.compile(model, backend="fxremat", options={"memory_budget": spec["budget"]})
    started = time.perf_counter()
    loss = compiled(*batch)
    forward_sources = _cpp_files(cache)
    loss.backward()
    row = {**spec, "total_s": time.perf_counter() - started}
    # On CPU Inductor compiles one C++ source per distinct kernel (a kernel that repeats, layer
    # after layer, is compiled once): the backward's compile waits on these.
    backward_sources = {p: n for p, n in _cpp_files(cache).items() if p not in forward_sources}
    row["backward_cpp_kernels"] = len(backward_sources)
    row["backward_cpp_bytes"] = sum(backward_sources.values())
    for part, names in PARTS.items():
        times = [sum(compilation_time_metrics[n]) for n in names if n in compilation_time_metrics]
        row[f"{part}_s"] = times[0] if times else None
    return row


def _markdown(rows: list[dict], meta: dict, budget: float) -> str:
    lines = [
        f"# First call through Inductor: fxremat at budget {budget} beside plain torch.compile and PyTorch's "
        f"budget partitioner ({meta['date'][:10]})",
        "",
        f"Machine: {meta['cpu']} ({meta['cpus']} CPUs), torch {meta['torch']}, fxremat at {meta['git']['commit'][:10]}. "
        f"Command: `{meta['command']}`.",
        "",
        "Each run a fresh process with an empty Inductor cache; the least total of the repeats per mode, "
        "and that run's parts as Dynamo timed them (seconds).",
        "",
        "| layers | mode | first call (s) | ratio | partition (s) | forward compile (s) | backward compile (s) "
        "| backward's C++ kernels (KB) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for layers in sorted({r["layers"] for r in rows}):
        best = {}
        for r in rows:
            if r["layers"] == layers and "error" not in r:
                if r["mode"] not in best or r["total_s"] < best[r["mode"]]["total_s"]:
                    best[r["mode"]] = r
        base = best.get("torch")
        for mode in MODES:
            r = best.get(mode)
            if r is None:
                lines.append(f"| {layers} | {mode} | failed | | | | | |")
                continue
            ratio = f"{r['total_s'] / base['total_s']:.2f}x" if base else ""
            cells = [f"{r[k]:.2f}" if r.get(k) is not None else "" for k in
                     ("partition_s", "forward_compile_s", "backward_compile_s")]
            label = {"torch": "torch.compile", "torch_budget": f"torch.compile, PyTorch's budget {budget}",
                     "fxremat": f"fxremat {budget}"}[mode]
            kernels = (f"{r['backward_cpp_kernels']} ({r['backward_cpp_bytes'] / 1024:.0f})"
                       if r.get("backward_cpp_kernels") is not None else "")
            lines.append(f"| {layers} | {label} | {r['total_s']:.2f} | {ratio} | {' | '.join(cells)} | {kernels} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[4, 16])
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=2)
    results_io.add_output_arguments(parser, "first_call")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    rows = []
    for layers in args.layers:
        for i in range(args.repeat):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                spec = {"layers": layers, "mode": mode, "budget": args.budget, "run": i}
                rows.append(results_io.run_child(__file__, spec))
                print(json.dumps(rows[-1]), flush=True)
    meta = results_io.metadata()
    results_io.write_json(os.path.join(args.out, f"{args.name}.json"), {"budget": args.budget, "rows": rows})
    results_io.write_text(os.path.join(args.out, f"{args.name}.md"), _markdown(rows, meta, args.budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
