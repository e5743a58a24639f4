"""Library kernels of a model's joint graph: the roofline's estimate beside the measured time.

    python bench/library_kernel_times.py --model resnet50 [--model unet ...] [--out FILE]

Traces a frontier model (``bench/frontier_models.py``, ``small`` scale, one thread) as fxremat
plans it through Inductor, and for every kernel of its joint graph that Inductor calls in a
library (``costmodel.kernel_groups`` of kind "compute" or "other": convolutions and their
backwards, matrix products, copies, gathers) gives the default cost model's estimate
(``costmodel.estimate_group`` on the graph's device profile: the roofline) beside the time
``cost_model="measured"`` would use (``optimer.OpTimer``: the op run alone on random inputs of
its shapes, median of 5). Per op the median and the spread of measured ÷ estimated, and for
each convolution its shapes and rate (GFLOP/s). The default cost model prices every
convolution at one rate; what it misprices relative to the fused kernels is what moves the
plans ``cost_model="measured"`` makes (issue #26: ResNet-50's plan at per-block
checkpointing's peak). CPU only. Not a test.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import results_io  # noqa: E402


def _joint_graph(model: str):
    """The joint graph fxremat plans for ``model`` through Inductor (no budget)."""
    import torch

    import frontier_models
    import fxremat
    from frontier_strategies import FX_OPTIONS_DEFAULT
    from fxremat import partition

    contexts = []
    context = partition.context

    def recording(*args, **kwargs):
        made = context(*args, **kwargs)
        contexts.append(made)
        return made

    partition.context = recording
    try:
        torch.manual_seed(0)
        fm = frontier_models.build(model, "small", {})
        fxremat.plan(fm.model.train(), fm.batch, {**FX_OPTIONS_DEFAULT, "compiler": "inductor"})
    finally:
        partition.context = context
    return contexts[0].joint


def _convolution(node) -> dict | None:
    """A convolution's or its backward's shapes: input, weight, output, stride, which
    gradients a backward computes."""
    import torch

    if node.target is torch.ops.aten.convolution.default:
        x, w, out, stride, mask = node.args[0], node.args[1], node, node.args[3], None
    elif node.target is torch.ops.aten.convolution_backward.default:
        x, w, out, stride, mask = node.args[1], node.args[2], node.args[0], node.args[4], node.args[-1]
    else:
        return None
    return {"input": list(x.meta["val"].shape), "weight": list(w.meta["val"].shape),
            "output": list(out.meta["val"].shape), "stride": list(stride),
            "computes": None if mask is None else [name for name, wanted in zip(["input", "weight", "bias"], mask)
                                                   if wanted]}


def measure(model: str, directory: str) -> dict:
    from fxremat import costmodel, optimer
    from fxremat.joint import graph_device

    joint = _joint_graph(model)
    profile = costmodel.profile_for(graph_device(joint))
    timer = optimer.OpTimer(graph_device(joint), directory=directory)
    inlined = costmodel.inlined_constants(joint)
    kernels = []
    for group in costmodel.kernel_groups(joint, inlined):
        estimate = costmodel.estimate_group(group, profile, inlined=inlined)
        if estimate.kind == "fused":
            continue
        measured = costmodel.estimate_group(group, profile, timer=timer, inlined=inlined)
        if measured.bound != "measured":
            continue  # not timed (Inductor generates its code: OpTimer.covers), or it would not
            # run on random inputs: the roofline stands in
        node = group[-1]
        kernels.append({"op": getattr(node.target, "__name__", str(node.target)), "nodes": [n.name for n in group],
                        "estimated_s": estimate.seconds, "measured_s": measured.seconds, "flops": estimate.flops,
                        "bytes": estimate.bytes_moved, "convolution": _convolution(node)})
    timer.save()
    by_op = collections.defaultdict(list)
    for k in kernels:
        by_op[k["op"]].append(k["measured_s"] / k["estimated_s"])
    return {"model": model, "profile": profile.name, "kernels": kernels,
            "estimated_s": sum(k["estimated_s"] for k in kernels), "measured_s": sum(k["measured_s"] for k in kernels),
            "by_op": {op: {"kernels": len(r), "median": statistics.median(r), "min": min(r), "max": max(r)}
                      for op, r in sorted(by_op.items())}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=None, help="a model of bench/frontier_models.py (repeat)")
    parser.add_argument("--out", default=None, help="JSON file for the result")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    directory = tempfile.mkdtemp(prefix="library_kernel_times_")  # measured afresh, not from a cache
    models = [measure(name, directory) for name in (args.model or ["resnet50"])]
    for m in models:
        print(f"\n{m['model']}: {len(m['kernels'])} library kernels, estimated {m['estimated_s'] * 1e3:.2f} ms, "
              f"measured {m['measured_s'] * 1e3:.2f} ms ({m['profile']})")
        print("| op | kernels | measured ÷ estimated: median (min–max) |\n|---|---:|---|")
        for op, r in m["by_op"].items():
            print(f"| {op} | {r['kernels']} | {r['median']:.2f} ({r['min']:.2f}–{r['max']:.2f}) |")
        convolutions = sorted((k for k in m["kernels"] if k["convolution"]), key=lambda k: k["flops"] / k["measured_s"])
        if convolutions:
            print("| convolution | input | weight | stride | estimated (µs) | measured (µs) | GFLOP/s |\n"
                  "|---|---|---|---|---:|---:|---:|")
            seen = set()
            for k in convolutions:
                c = k["convolution"]
                key = (k["op"], str(c))
                if key in seen:
                    continue
                seen.add(key)
                what = k["op"] + (f" ({', '.join(c['computes'])})" if c["computes"] else "")
                print(f"| {what} | {c['input']} | {c['weight']} | {c['stride']} | {k['estimated_s'] * 1e6:.0f} | "
                      f"{k['measured_s'] * 1e6:.0f} | {k['flops'] / k['measured_s'] / 1e9:.1f} |")
    result = {**results_io.metadata(argv), "models": models}
    if args.out:
        results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
