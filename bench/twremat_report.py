"""TWRemat on training graphs: peak memory and schedule length against no rematerialization.

    python bench/twremat_report.py [--out-dir bench/results/cpu] [--heuristic min_fill_in]

The TWRemat paper's experiments (Kumar et al., NeurIPS 2019, Figure 2 and Table 2) on the
abstract training graphs of ``bench/checkmate_zoo.py`` (forward and autograd-style
backward, activation sizes, FLOP costs):

* **Depth** (their Figure 2): feed-forward networks (Linear-ReLU layers) and ResNet-like
  CNNs of growing depth; peak memory of no rematerialization and of TWRemat with ``k = 1``
  (Algorithm 1, recursion to single bags: the least memory).
* **Transformers** (their Table 2): 1, 2 and 4 pre-norm blocks.
* **Trade-off over k**: for one graph of each family, every ``k`` from 1 to past the number
  of bags (parts of fewer than ``k`` bags are scheduled without recomputation).

Peak is :func:`passes.schedule.simulate`'s (every value freed after its last use).
Relative length is counted two ways: computes / nodes (unit cost per operation, as the
paper counts it) and FLOP-weighted cost / no-rematerialization cost. Solve time: the tree
decomposition and separator hierarchy (once per graph, NetworkX's minimum fill-in
heuristic), and the schedule for one ``k``; one run each, wall clock. Writes
``twremat_report.json`` and ``twremat_report.md``. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import networkx

from fxremat.passes import checkmate, twremat
from fxremat.passes.schedule import no_remat, simulate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_io  # noqa: E402
from checkmate_zoo import mlp_chain, resnet, transformer  # noqa: E402

DEPTH = {
    "ffn": [(f"FFN {n} layers", lambda n=n: mlp_chain(layers=n)) for n in (8, 16, 32, 64, 128)],
    "resnet": [(f"ResNet {6 * b + 2} layers", lambda b=b: resnet(blocks=b)) for b in (1, 2, 4, 8)],
}
TRANSFORMERS = [(f"Transformer {b} block{'s' if b > 1 else ''}", lambda b=b: transformer(blocks=b))
                for b in (1, 2, 4)]
TRADE_OFF = [("FFN 32 layers", lambda: mlp_chain(layers=32)), ("ResNet 26 layers", lambda: resnet(blocks=4)),
             ("Transformer 2 blocks", lambda: transformer(blocks=2))]


def measure(name, make, ks, heuristic, compare=0.0) -> dict:
    problem = make()
    base_cost, base_peak = simulate(problem, no_remat(problem))
    n = len(problem.restricted().nodes)
    start = time.perf_counter()
    prepared = twremat.TWRemat(problem, heuristic)
    prepare_s = time.perf_counter() - start
    row = {"graph": name, "nodes": n, "edges": len(problem.edges), "width": prepared.width,
           "bags": prepared.bags, "depth": prepared.depth, "prepare_seconds": prepare_s,
           "no_remat_peak": base_peak, "no_remat_cost": base_cost, "runs": []}
    compared: dict[int, dict] = {}
    for k in ks(prepared):
        start = time.perf_counter()
        sol = prepared.solve(k)
        seconds = time.perf_counter() - start
        computes = sum(op.kind == "compute" for op in sol.schedule)
        row["runs"].append({"k": k, "peak": sol.peak_bytes, "cost": sol.cost, "computes": computes,
                            "peak_ratio": sol.peak_bytes / base_peak, "cost_ratio": sol.cost / base_cost,
                            "length_ratio": computes / n, "seconds": seconds})
        if compare and sol.peak_bytes < base_peak:
            # Checkmate's LP rounding at the same peak: what an optimised schedule pays there.
            if sol.peak_bytes not in compared:
                try:
                    lp = checkmate.solve_lp(problem, sol.peak_bytes, time_limit=compare)
                    compared[sol.peak_bytes] = {"checkmate_cost_ratio": lp.cost / base_cost,
                                                "checkmate_seconds": lp.solve_seconds}
                except checkmate.NoScheduleFound as err:
                    compared[sol.peak_bytes] = {"checkmate_cost_ratio": None, "checkmate_error": type(err).__name__}
            row["runs"][-1].update(compared[sol.peak_bytes])
        print(f"{name} k={k}: peak {sol.peak_bytes / base_peak:.3f} cost {sol.cost / base_cost:.3f} "
              f"len {computes / n:.3f} ({seconds:.2f}s)", file=sys.stderr, flush=True)
    return row


def k_range(prepared) -> list[int]:
    ks, k = [], 1
    while k <= prepared.bags:
        ks.append(k)
        k *= 2
    return ks + [prepared.bags + 1]


def markdown(depth, transformers, trade, meta) -> str:
    command = meta.get("command", "python bench/twremat_report.py")
    out = [
        "# TWRemat: peak memory and schedule length",
        "",
        f"`{command}` ({meta['date']}, {meta['cpus']} CPUs, Python {meta['python']}, "
        f"NetworkX {meta['networkx']}, tree decomposition: {meta['heuristic']}). Graphs from "
        "`bench/checkmate_zoo.py` (sizes in KiB of fp32 activations; costs in MFLOPs). Peak ÷ no-remat: "
        "TWRemat's peak over the no-rematerialization peak (lower is better); length: computes ÷ nodes "
        "(unit cost per operation, as the paper counts it); cost: FLOP-weighted cost ÷ no-rematerialization "
        "cost. Times are one wall-clock run: decomposition + separator hierarchy (once per graph), then the "
        "schedule for one k.",
        "",
        "## Peak memory vs depth (the paper's Figure 2), TWRemat with k = 1",
        "",
    ]
    header = ["| graph | nodes | width | no-remat peak (KiB) | TWRemat peak (KiB) | peak ÷ no-remat | length | "
              "cost | decomposition (s) | schedule (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out += header
    for r in depth + [None] + transformers:
        if r is None:
            out += ["", "## Transformers (the paper's Table 2), TWRemat with k = 1", ""] + header
            continue
        k1 = r["runs"][0]
        out.append(f"| {r['graph']} | {r['nodes']} | {r['width']} | {r['no_remat_peak']} | {k1['peak']} | "
                   f"{k1['peak_ratio']:.3f} | {k1['length_ratio']:.2f} | {k1['cost_ratio']:.2f} | "
                   f"{r['prepare_seconds']:.2f} | {k1['seconds']:.3f} |")
    out += ["", "## Trade-off over k", "",
            "Parts of the decomposition with fewer than k bags are computed in topological order, without "
            "recomputation; k past the number of bags is no rematerialization. Checkmate: the cost of "
            "`checkmate.solve_lp` (two-phase LP rounding, 60 s limit: at 60 s the limit cut its local search "
            "short) with TWRemat's peak as the budget -- TWRemat minimises memory, not cost; '—': no staged "
            "schedule found at that budget.", ""]
    for r in trade:
        out += [f"**{r['graph']}** ({r['nodes']} nodes, width {r['width']}, {r['bags']} bags, separator depth "
                f"{r['depth']}, decomposition {r['prepare_seconds']:.2f} s)", "",
                "| k | peak ÷ no-remat | length | cost | schedule (s) | Checkmate cost at this peak | Checkmate (s) |",
                "|---:|---:|---:|---:|---:|---:|---:|"]
        for x in r["runs"]:
            cm = x.get("checkmate_cost_ratio")
            if "checkmate_cost_ratio" not in x:
                cm, cs = "(no remat)", ""
            else:
                cm, cs = (f"{cm:.2f}", f"{x['checkmate_seconds']:.1f}") if cm else ("—", "")
            out.append(f"| {x['k']} | {x['peak_ratio']:.3f} | {x['length_ratio']:.2f} | {x['cost_ratio']:.2f} | "
                       f"{x['seconds']:.3f} | {cm} | {cs} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heuristic", default="min_fill_in", choices=sorted(twremat.HEURISTICS))
    parser.add_argument("--out-dir", default=None, help="write twremat_report.{json,md} here")
    parser.add_argument("--render", default=None, help="only print the Markdown of a twremat_report.json")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        print(markdown(data["depth"], data["transformers"], data["trade_off"], data["meta"]))
        return
    first = lambda prepared: [1]  # noqa: E731
    depth = [measure(name, make, first, args.heuristic) for family in DEPTH.values() for name, make in family]
    transformers = [measure(name, make, first, args.heuristic) for name, make in TRANSFORMERS]
    trade = [measure(name, make, k_range, args.heuristic, compare=60.0) for name, make in TRADE_OFF]
    meta = {**results_io.metadata(), "networkx": networkx.__version__, "heuristic": args.heuristic}  # date, cpus, ...
    md = markdown(depth, transformers, trade, meta)
    print(md)
    if args.out_dir:
        results_io.write_json(os.path.join(args.out_dir, "twremat_report.json"),
                              {"meta": meta, "depth": depth, "transformers": transformers, "trade_off": trade})
        results_io.write_text(os.path.join(args.out_dir, "twremat_report.md"), md)


if __name__ == "__main__":
    main()
