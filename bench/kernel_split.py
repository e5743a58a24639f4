"""Where a step's time goes, fxremat against a peer at the same memory: measured and estimated.

    python bench/kernel_split.py --model resnet50 --peer ckpt_blocks [--steps 20] [--out FILE]
    python bench/kernel_split.py --model transformer --sizes '{"layers": 4, "dim": 64, "heads": 4, "seq": 64, "batch": 2}' \
        --budget-bytes 2034056 --peer-options '{"solver": "rotor"}'

One process builds the peer and fxremat at the peer's measured peak as ``bench/ab.py`` does
(one thread, Inductor's FX-graph and autograd caches off, so both are lowered here), with
Inductor's kernel profile on (``cpp.enable_kernel_profile``: each generated C++ kernel is a
profiler event). Then ``--steps`` profiled steps of each, alternating, and per step the time
of the forward's and the backward's generated kernels, convolutions and matrix products
(``aten::convolution``, ``aten::convolution_backward``, ``aten::mm``/``bmm``/``addmm``),
found under ``CompiledFunction`` and ``CompiledFunctionBackward``; reported as medians. Beside
them, ``fxremat.costmodel.estimate_graph`` of each graph as Inductor received it, split into
library calls ("compute") and fused kernels ("fused", "other"): the roofline estimate the
planner's stage costs are made of. What a plan misprices shows as a part whose measured
difference between the two strategies is far from the estimated one (issue #26). With
``--peer-options`` the peer is fxremat itself at the same budget with those options (two of
fxremat's plans side by side: ``{"solver": "rotor"}`` against ``auto``'s, issue #21). The plans
compared are recorded with the figures (``sides.*.plans``). CPU only.
Not a test.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import results_io  # noqa: E402

LIBRARY = {"aten::convolution": "convolution", "aten::convolution_backward": "convolution backward",
           "aten::mm": "matmul", "aten::bmm": "matmul", "aten::addmm": "matmul"}


def part_of(event) -> str | None:
    """``"forward kernels"``, ``"backward convolution"``, ... for an event under a compiled
    graph's call, None for the rest."""
    if event.name.startswith("graph_"):  # Inductor's kernel profile names a kernel graph_<i>_cpp_...
        kind = "kernels"
    elif event.name in LIBRARY:
        kind = LIBRARY[event.name]
    else:
        return None
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("CompiledFunction"):
        if parent.name in LIBRARY:
            return None  # counted in its caller (aten::convolution calls aten::_convolution ...)
        parent = parent.cpu_parent
    if parent is None:
        return None
    return ("backward " if "Backward" in parent.name else "forward ") + kind


def _is_backward(gm) -> bool:
    """Is this graph (as Inductor received it) a backward: does it take incoming gradients?"""
    return any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--scale", default="small", choices=["tiny", "small"])
    parser.add_argument("--sizes", default="{}", type=json.loads, metavar="JSON", help="the model's size overrides")
    parser.add_argument("--peer", default="ckpt_blocks")
    parser.add_argument("--peer-options", default=None, type=json.loads, metavar="JSON",
                        help="the peer is fxremat at the same budget with these options (over the default ones)")
    budget_given = parser.add_mutually_exclusive_group()  # bytes or a fraction, not both
    budget_given.add_argument("--budget-bytes", type=int, default=None, help="fxremat's budget (default: the peer's peak)")
    budget_given.add_argument("--budget-fraction", type=float, default=None,
                        help="fxremat's budget as a fraction (memory_budget=F) instead of bytes")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.peer_options is not None and args.budget_bytes is None and args.budget_fraction is None:
        parser.error("--peer-options needs --budget-bytes or --budget-fraction (the budget both of fxremat's "
                     "plans are made for)")
    at = ({"budget": args.budget_fraction} if args.budget_fraction is not None else
          {"budget_bytes": args.budget_bytes} if args.budget_bytes is not None else None)

    import torch
    import torch._inductor.compile_fx as compile_fx
    from torch.profiler import ProfilerActivity, profile

    from ab import Contender, peer_strategy
    from frontier_strategies import FX_OPTIONS_DEFAULT
    from plan_records import plan_record

    import fxremat
    from fxremat import costmodel

    torch.set_num_threads(1)
    graphs: list = []
    post_grad = compile_fx._recursive_post_grad_passes

    def captured(gm, *a, **k):
        graphs.append(copy.deepcopy(gm))  # as Inductor receives it
        return post_grad(gm, *a, **k)

    spec = {"model": args.model, "scale": args.scale, "overrides": args.sizes, "device": "cpu", "dtype": "float32",
            "fx_options": dict(FX_OPTIONS_DEFAULT)}
    compile_fx._recursive_post_grad_passes = captured
    try:
        with torch._functorch.config.patch(enable_autograd_cache=False), \
                torch._inductor.config.patch({"fx_graph_cache": False, "cpp.enable_kernel_profile": True}):
            before_peer = fxremat.inspect.plan_count()
            if args.peer_options is None:
                peer = Contender(spec, peer_strategy(args.peer), 2)
            else:
                peer = Contender({**spec, "fx_options": {**spec["fx_options"], **args.peer_options}},
                                 {"name": "fxremat_peer", "kind": "fxremat", **at}, 2)
            if at is None:
                at = {"budget_bytes": peer.measure()}
            peer_graphs = len(graphs)
            peer_plans = fxremat.inspect.plans_since(before_peer)
            before_fx = fxremat.inspect.plan_count()
            fx = Contender(spec, {"name": "fxremat", "kind": "fxremat", **at}, 2)
            fx_plans = fxremat.inspect.plans_since(before_fx)
    finally:
        compile_fx._recursive_post_grad_passes = post_grad
    sides = {"peer": (peer, graphs[:peer_graphs]), "fxremat": (fx, graphs[peer_graphs:])}
    plans_of = {"peer": peer_plans, "fxremat": fx_plans}
    measured: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in sides}
    for r in range(args.steps):
        for name in (("peer", "fxremat") if r % 2 == 0 else ("fxremat", "peer")):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                sides[name][0].step()
            totals: dict[str, float] = collections.Counter()
            for event in prof.events():
                part = part_of(event)
                if part is not None:
                    totals[part] += event.cpu_time_total / 1e6
            for part, seconds in totals.items():
                measured[name][part].append(seconds)
    profile_cpu = costmodel.profile_for("cpu")
    peer_name = args.peer if args.peer_options is None else f"fxremat {json.dumps(args.peer_options)}"
    result = {**results_io.metadata(argv), "model": args.model, "scale": args.scale, "peer": peer_name,
              "budget": at, "steps": args.steps, "threads": 1, "load_avg": os.getloadavg(), "sides": {}}
    for name, (contender, gms) in sides.items():
        estimates = []
        for phase in ("forward", "backward"):
            # Every graph of the phase (a graph break makes several; a backward graph takes
            # the incoming gradients, ``tangents_*``), summed.
            graphs_of = [gm for gm in gms if _is_backward(gm) == (phase == "backward")]
            by_kind: dict[str, float] = collections.Counter()
            total, kernels = 0.0, 0
            for gm in graphs_of:
                est = costmodel.estimate_graph(gm, profile_cpu)
                total, kernels = total + est.total_s, kernels + len(est.per_group)
                for kernel in est.per_group:
                    by_kind[kernel.kind] += kernel.seconds
            estimates.append({"phase": phase, "graphs": len(graphs_of), "total_s": total, "by_kind_s": dict(by_kind),
                              "kernels": kernels})
        result["sides"][name] = {"measured_median_s": {p: statistics.median(v) for p, v in sorted(measured[name].items())},
                                 "estimated": estimates, "plans": [plan_record(p) for p in plans_of[name]]}
    print(f"{args.model}: {peer_name} and fxremat at {at}, {args.steps} profiled steps each (medians, ms)")
    for name in sides:  # which plans were compared (fxremat's; none for a peer that is not fxremat)
        for record in result["sides"][name]["plans"]:
            print(f"  {name} plan: {record['solver']}, predicts {record['predicted_peak_bytes']} B, "
                  f"{record['recomputed_ops']} ops recomputed, stages {record['stages']}")
    parts = sorted(set().union(*(m.keys() for m in measured.values())))
    print("| part | " + " | ".join(sides) + " |")
    print("|---|" + "---:|" * len(sides))
    for part in parts:
        cells = [f"{statistics.median(measured[n][part]) * 1e3:.2f}" if measured[n][part] else "" for n in sides]
        print(f"| measured {part} | " + " | ".join(cells) + " |")
    for i, phase in enumerate(("forward", "backward")):
        for kind in ("compute", "fused", "other"):
            cells = [f"{result['sides'][n]['estimated'][i]['by_kind_s'].get(kind, 0.0) * 1e3:.2f}"
                     if i < len(result['sides'][n]['estimated']) else "" for n in sides]
            print(f"| estimated {phase} {kind} | " + " | ".join(cells) + " |")
    if args.out:
        results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
