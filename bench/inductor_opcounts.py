"""Inductor's op and read counts of the pointwise values it weighs, against the timeline's.

    python bench/inductor_opcounts.py --model llama [--out FILE]
    python bench/inductor_opcounts.py --model cnn --budget 0.0

Inductor writes a pointwise value it could inline when its inlined body is too big
(``StorageBox.has_exceeded_max_reads``: more than ``realize_acc_reads_threshold`` reads or
``realize_opcount_threshold`` ops, whatever its readers; ``should_realize_on_reuse`` for
several readers), counting its ops as ``inner_fn_opcount`` does (loads, index expressions,
constants and dtype conversions included). The timeline (``timeline.Inlining.counts``) sums
each op's count from Inductor's lowering of that op alone and, near the limit, lowers the whole
inlined body to take Inductor's own count, against ``_compat.inductor_realize_thresholds`` (until
2026-12-01 it counted one op per FX node plus its reads). This compiles the
test suite's tiny Hugging Face Llama or the zoo CNN (``fxremat.models.make_cnn``) under fxremat,
records each value Inductor weighed (``has_exceeded_max_reads`` wrapped: its FX origin node, op
count, read count, and whether it passed that limit), and sets the timeline's counts for the
same node beside them. A diagnostic for torch 2.11's store-or-inline differences
(``docs/budget-and-timeline.md``, the max-pool backward); CPU only; not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import results_io  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["llama", "cnn"], default="llama")
    parser.add_argument("--budget", type=float, default=None, help="memory_budget as a fraction (default: none)")
    parser.add_argument("--out", default=None, help="JSON file for the rows")
    args = parser.parse_args(argv)

    import torch
    from torch._inductor import ir

    import test_inductor_buffers as helpers  # the suite's models and graph capture
    from fxremat import _compat, models, timeline

    class _Patch:  # what ``_Captured`` asks of pytest's monkeypatch
        def setattr(self, owner, name, value):
            setattr(owner, name, value)

    weighed: list[tuple[int, set[str], int, int, bool]] = []
    exceeded = ir.StorageBox.has_exceeded_max_reads
    captured = helpers._Captured(_Patch())  # (each graph captured as Inductor starts on it)

    def recording(box):
        found = exceeded(box)
        if isinstance(box.data, ir.Pointwise):  # (the values it could inline)
            # the FX nodes it was lowered from: its own (the last of them) and those inlined into it
            weighed.append((len(captured.graphs) - 1, {o.name for o in box.data.origins},
                            box.data.inner_fn_opcount().num_ops, box.num_reads(), found))
        return found

    ir.StorageBox.has_exceeded_max_reads = recording
    try:
        with torch._functorch.config.patch(enable_autograd_cache=False), \
                torch._inductor.config.patch({"fx_graph_cache": False}):
            torch.manual_seed(0)
            model, batch = helpers._tiny_llama() if args.model == "llama" else models.make_cnn()
            helpers._step(model, batch, {} if args.budget is None else {"memory_budget": args.budget})()
    finally:
        ir.StorageBox.has_exceeded_max_reads = exceeded
    rows = []
    for index, graph in enumerate(captured.graphs):
        gm, inlining = graph["graph"], timeline.Inlining()
        nodes = {n.name: n for n in gm.graph.nodes}
        position = {n: i for i, n in enumerate(gm.graph.nodes)}
        seen = set()
        for graph_index, origins, ops, reads, passed in weighed:
            own = [nodes[o] for o in origins if o in nodes]  # (a post-grad pass's new nodes aside)
            if graph_index != index or not own:
                continue
            node = max(own, key=position.__getitem__)
            name = node.name
            if name in seen or node.op != "call_function" or not inlining.fusible(node):
                continue  # (asked again of the same value: its first answer kept)
            seen.add(name)
            our_reads, our_ops = inlining.counts(node)  # (its inputs decided first)
            rows.append({"graph": index, "node": name, "inductor_ops": ops, "inductor_reads": reads,
                         "inductor_over_limit": passed, "timeline_ops": our_ops, "timeline_reads": our_reads})
    ratios = [r["inductor_ops"] / r["timeline_ops"] for r in rows if r["timeline_ops"]]
    result = {**results_io.metadata(argv), "model": args.model, "budget": args.budget,
              "limits": _compat.inductor_realize_thresholds("cpu"), "rows": rows}
    print(f"torch {torch.__version__}, {args.model}, limits {result['limits']}: {len(rows)} values weighed")
    if ratios:
        tenths = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else [ratios[0]] * 9
        print(f"Inductor's ops over the timeline's: median {statistics.median(ratios):.2f}, "
              f"10th percentile {tenths[0]:.2f}, 90th {tenths[8]:.2f}")
    print("| graph | value | Inductor ops | timeline ops | Inductor reads | timeline reads | over Inductor's limit |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for r in sorted(rows, key=lambda r: -r["inductor_ops"])[:12]:
        print(f"| {r['graph']} | `{r['node']}` | {r['inductor_ops']} | {r['timeline_ops']} | {r['inductor_reads']} | "
              f"{r['timeline_reads']} | {r['inductor_over_limit']} |")
    if args.out:
        results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
