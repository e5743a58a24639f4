"""Per-block checkpointing priced in Rotor's own model, beside the plan Rotor chose.

    python bench/blocks_in_rotor_model.py --model resnet50 --budget-bytes 10076784 [--out FILE]

Plans a frontier model (``bench/frontier_models.py``, Inductor, solver auto, the step
keeps only its loss as in ``frontier.py``) at a byte budget, and records every Rotor chain the
planner builds (one per saved set and view of a stage's temporaries) and every DP solve on it.
For each chain it writes per-block checkpointing as a Rotor sequence (stages grouped by the
module block their forward ops come from, ``nn_module_stack`` matching ``--block``: each
block's first stage ``F_ck``, the rest ``F_∅``, and in the backward the block run again with
``F_all`` before its ``B``; stages outside every block are kept, ``F_all``) and simulates it
(``passes.rotor_simulate``): its makespan and peak in the model's seconds and bytes, beside
keeping every stage and the DP's answers. Issue #26 asks why plans at per-block
checkpointing's memory measure slower than it: this says whether the model agrees (it
prices its own plan faster) and by how much, to set beside measured step times
(``bench/ab.py``) and kernel times (``bench/kernel_split.py``). Not a test.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import results_io  # noqa: E402


def block_sequence(lin, chain, block: str) -> tuple[list, list]:
    """Per-block checkpointing over ``lin``'s stages as Rotor operations, and the groups
    ``(block name or None, [stage indices])`` it was built from."""
    from fxremat.passes.rotor_chain import B, F_ALL, F_CK, F_NONE, Op

    pattern = re.compile(block)

    def block_of(node) -> str | None:
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            found = pattern.search(path)
            if found:
                return found.group(0)
        return None

    groups: list[tuple[str | None, list[int]]] = []
    for stage in lin.stages:
        # A stage belongs to the block most of its forward ops come from (a cut may fall an
        # op or two from the block's end: the residual add's ReLU).
        counts = collections.Counter(block_of(n) for n in stage.forward if n.op == "call_function")
        name = counts.most_common(1)[0][0] if counts else None
        if groups and groups[-1][0] == name:
            groups[-1][1].append(stage.index)
        else:
            groups.append((name, [stage.index]))
    last = groups[-1][1][-1] if groups else 0
    if last < chain.length:  # the loss stage Chain.with_loss adds
        groups.append((None, list(range(last + 1, chain.length + 1))))
    sequence = []
    for name, stages in groups:
        if name is None:
            sequence += [Op(F_ALL, s) for s in stages]
        else:
            sequence += [Op(F_CK, stages[0])] + [Op(F_NONE, s) for s in stages[1:]]
    for name, stages in reversed(groups):
        if name is not None:
            sequence += [Op(F_ALL, s) for s in stages]
        sequence += [Op(B, s) for s in reversed(stages)]
    return sequence, groups


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--scale", default="small", choices=["tiny", "small", "gpu"])
    parser.add_argument("--budget-bytes", type=int, required=True)
    parser.add_argument("--block", default=r"blocks\.\d+$",
                        help="regex a block's module path ends with (nn_module_stack), default %(default)s")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    import fxremat
    import frontier_models
    from fxremat import chain as fx_chain
    from fxremat.passes import rotor as rotor_dp
    from fxremat.passes import rotor_simulate
    from fxremat.strategies import rotor as rotor_strategy
    from fxremat.strategies import staged
    from frontier_strategies import FX_OPTIONS_DEFAULT

    torch.set_num_threads(1)
    chains, solves, label = [], collections.defaultdict(list), ["?"]
    rotor_chain, solve, plan_around = fx_chain.rotor_chain, rotor_dp.solve, staged.plan_around

    def recording_chain(lin, *a, **k):
        made = rotor_chain(lin, *a, **k)
        chains.append((label[0], k.get("fused", False), lin, made))
        return made

    def recording_solve(chain, budget, **k):
        found = solve(chain, budget, **k)
        solves[id(chain)].append((budget, found.makespan))
        return found

    def labelled(saved_set, *a, **k):
        label[0] = saved_set.label
        return plan_around(saved_set, *a, **k)

    rotor_strategy.chain.rotor_chain = recording_chain
    rotor_strategy.rotor_dp.solve = recording_solve
    staged.plan_around = labelled
    try:
        torch.manual_seed(0)
        fm = frontier_models.build(args.model, args.scale, {})
        options = {**FX_OPTIONS_DEFAULT, "memory_budget": args.budget_bytes}
        (plan,) = fxremat.plan(fm.model.train(), fm.batch, options)
    finally:
        rotor_strategy.chain.rotor_chain, rotor_strategy.rotor_dp.solve, staged.plan_around = \
            rotor_chain, solve, plan_around
    rows = []
    for saved_set, fused, lin, made in chains:
        sequence, groups = block_sequence(lin, made, args.block)
        blocks_s, blocks_peak = rotor_simulate.simulate(made, sequence)
        all_s, all_peak = rotor_simulate.simulate(made, rotor_simulate.store_all(made))
        answers = sorted((b, m) for b, m in solves[id(made)] if b < 1e29)
        rows.append({"saved_set": saved_set, "fused_view": fused, "stages": made.length,
                     "blocks": sum(1 for name, _ in groups if name is not None),
                     "per_block_makespan_s": blocks_s, "per_block_model_peak": blocks_peak,
                     "keep_all_makespan_s": all_s, "keep_all_model_peak": all_peak,
                     "dp_answers": [{"model_budget": b, "makespan_s": m} for b, m in answers]})
    result = {**results_io.metadata(argv), "model": args.model, "scale": args.scale, "budget_bytes": args.budget_bytes,
              "plan": {"solver": plan.solver, "predicted_peak_bytes": plan.predicted_peak_bytes,
                       "model_makespan_s": plan.cut_cost,
                       "saved_set": plan.notes.get("saved_set"), "sequence": plan.sequence, "why": plan.notes.get("why")},
              "chains": rows}
    mib = 2 ** 20
    print(f"plan: {plan.solver} around the {plan.notes.get('saved_set')} saved set, model makespan "
          f"{plan.cut_cost * 1e3:.2f} ms, predicted {plan.predicted_peak_bytes / mib:.2f} MiB")
    print("| saved set | view | stages | per-block ckpt: model ms, model MiB | keep all: model ms, MiB | "
          "DP at the model budget nearest per-block's peak: ms |")
    print("|---|---|---:|---|---|---|")
    for r in rows:
        near = min(r["dp_answers"], key=lambda a: abs(a["model_budget"] - r["per_block_model_peak"]), default=None)
        near_text = (f"{near['makespan_s'] * 1e3:.2f} at {near['model_budget'] / mib:.2f} MiB" if near else "")
        print(f"| {r['saved_set']} | {'fused' if r['fused_view'] else 'every value'} | {r['stages']} | "
              f"{r['per_block_makespan_s'] * 1e3:.2f}, {r['per_block_model_peak'] / mib:.2f} | "
              f"{r['keep_all_makespan_s'] * 1e3:.2f}, {r['keep_all_model_peak'] / mib:.2f} | {near_text} |")
    if args.out:
        results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
