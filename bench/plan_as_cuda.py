"""Plan a model's first compiled graph as fxremat would on CUDA, on a machine without a GPU.

    python bench/plan_as_cuda.py --model gpt2 --scale gpu --budget 3624217088 --solver rotor --held-incoming
    python bench/plan_as_cuda.py --model gpt2 --scale tiny --budget 0.0 --stages     # a quick look

Most sessions have no GPU, and a plan made on CUDA can differ from the CPU's for the same
model: the attention op differs (CUDA's dispatcher picks memory-efficient attention for fp32,
whose graph reads an expanded additive mask and returns Philox seeds; the CPU runs its flash
kernel), and so do the device profile, the allocator's 512-byte blocks and Inductor's GPU
rules in the timeline. This script rebuilds that graph here (found so: GPT-2 small's chain
had 5 Rotor stages on an H100 where the CPU's had 38, session 33):

1. The model (``bench/frontier_models.py``) is traced on the CPU through Inductor up to its
   partitioner, which is handed the joint graph fxremat's partitioner would get, with
   ``torch.nn.functional.scaled_dot_product_attention`` routed to
   ``aten._scaled_dot_product_efficient_attention`` as on CUDA (a boolean mask made additive,
   the mask expanded, as ``attention.cpp`` does).
2. Every fake value moves to a fake CUDA device (same shapes, strides, dtypes), and the device
   is named ``--gpu`` (its profile in ``fxremat/devices.py``).
3. ``fxremat.partition.partition`` plans it with the options. A byte budget is taken as the
   step's first plan takes it (``fxremat.step``): the gradients of the graph's outputs, handed
   back before its backward, are counted at its turn.

Not reproduced: kernel times (the roofline profile only), library calls' scratch (measuring
it needs the device: counted as none, so CUDA's attention and cuDNN workspaces are missing),
cuBLAS/cuDNN choices. Prints the plan (or the ``BudgetError`` with its least plan) and, with
``--stages``, each saved set's chain.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's fxremat and bench modules first


class _Captured(Exception):
    pass


def efficient_attention() -> None:
    """Route ``aten.scaled_dot_product_attention`` (CompositeImplicitAutograd) to the
    memory-efficient attention op, as CUDA's dispatcher does for fp32 inputs."""
    import torch
    from torch._C import DispatchKey

    aten = torch.ops.aten
    op = aten.scaled_dot_product_attention.default

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None:  # attention.cpp: convert_boolean_attn_mask, then preprocess_mask
            if attn_mask.dtype == torch.bool:
                attn_mask = aten.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
            attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        lse = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, lse, dropout_p,
                                                            is_causal, scale=scale)[0]

    op.py_impl(DispatchKey.CompositeImplicitAutograd)(sdpa)
    op._dispatch_cache.clear()


def capture(model, batch):
    """The first graph's joint graph, its inputs and the partitioner's keyword arguments, as
    Inductor hands them to a custom partitioner, and the bytes of its outputs' gradients that
    the step hands back before its backward (``fxremat.step``'s rule, on Dynamo's graph)."""
    import torch
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    found = {}

    class Grab(CustomPartitionerFn):
        def __call__(self, gm, joint_inputs, **kwargs):
            found.update(joint=gm, inputs=joint_inputs, kwargs=kwargs)
            raise _Captured

        def uuid(self):
            return None

    def backend(gm, example_inputs):
        found["dynamo_graph"] = gm  # what fxremat.step reads the handed-back gradients from
        with inductor_config.patch({"custom_partitioner_fn": Grab(), "fx_graph_cache": False}):
            return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    with functorch_config.patch(enable_autograd_cache=False):
        try:
            torch.compile(model, backend=backend)(*batch)
        except Exception as error:  # noqa: BLE001 - _Captured, wrapped by Dynamo
            if "joint" not in found:
                raise error
    from fxremat.step import _handed_back_bytes

    return found["joint"], found["inputs"], found["kwargs"], _handed_back_bytes(found["dynamo_graph"])


def to_fake_cuda(joint, inputs) -> list:
    """Every fake value of ``joint`` and its inputs on a fake CUDA device."""
    import torch
    from torch.utils import _pytree

    vals = _pytree.tree_leaves([n.meta.get("val") for n in joint.graph.nodes])
    mode = next(v.fake_mode for v in vals if isinstance(v, torch._subclasses.FakeTensor))
    moved: dict[int, torch.Tensor] = {}

    def move(t):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return t
        if id(t) not in moved:
            with mode:
                moved[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
        return moved[id(t)]

    for n in joint.graph.nodes:
        if "val" in n.meta:
            n.meta["val"] = _pytree.tree_map(move, n.meta["val"])
    return [move(t) for t in inputs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--scale", default="gpu")
    parser.add_argument("--sizes", default="{}", help="JSON overrides of the model's sizes")
    parser.add_argument("--budget", required=True, help="bytes (the step's, see above) or a fraction")
    parser.add_argument("--solver", default="auto")
    parser.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="the device name the profile is taken for")
    parser.add_argument("--held-incoming", action="store_true",
                        help="the backward holds its incoming gradients (torch 2.11's autograd)")
    parser.add_argument("--stages", action="store_true", help="also print each saved set's Rotor chain")
    parser.add_argument("--out", default=None, help="write the outcome as JSON there")
    args = parser.parse_args(argv)

    import torch

    import frontier_models

    efficient_attention()
    torch.manual_seed(0)
    built = frontier_models.build(args.model, args.scale, json.loads(args.sizes))
    started = time.perf_counter()
    joint, inputs, kwargs, handed_back = capture(built.model.train(), built.batch)
    print(f"captured the joint graph ({len(joint.graph.nodes)} nodes) in {time.perf_counter() - started:.1f} s",
          flush=True)
    inputs = to_fake_cuda(joint, inputs)
    torch.cuda.get_device_name = lambda *a, **k: args.gpu

    import fxremat  # noqa: F401 (after the patches above)
    from fxremat import _compat, memo, partition
    from fxremat.options import Budget, Options
    from fxremat.plans import BudgetError
    from frontier_strategies import FX_OPTIONS_DEFAULT

    if args.held_incoming:
        _compat.backward_frees_incoming_gradients = lambda: False
    options = Options.from_user({**FX_OPTIONS_DEFAULT, "solver": args.solver})
    budget = (Budget(fraction=float(args.budget)) if "." in args.budget
              else Budget(bytes=int(args.budget), later_graphs=handed_back))
    options = dataclasses.replace(options, memory_budget=budget)
    result = {"model": args.model, "scale": args.scale, "sizes": built.sizes, "budget": args.budget,
              "solver": args.solver, "gpu": args.gpu, "held_incoming": args.held_incoming,
              "joint_nodes": len(joint.graph.nodes), "handed_back_bytes": handed_back}
    print(f"the outputs' gradients handed back at the turn: {handed_back} bytes", flush=True)
    if args.stages:
        from fxremat.strategies import SOLVERS, mincut, staged

        ctx = partition.context(joint, kwargs["num_fwd_outputs"], options, kwargs.get("static_lifetime_input_indices"))
        with memo.planning():
            traffic = staged.traffic(ctx, mincut.traffic_optimal(ctx))
            for saved_set in staged.saved_sets(ctx, traffic):
                lin, _ = staged.linearize(saved_set.ctx, saved_set.backward, saved_set.saved,
                                          SOLVERS["rotor"].max_stages, weigh_memory=True)
                result.setdefault("stages", {})[saved_set.label] = len(lin.stages)
                print(f"saved set {saved_set.label}: {len(lin.stages)} stages, pinned "
                      f"{[n.name for n in lin.pinned][:8]}", flush=True)
    started = time.perf_counter()
    try:
        _, _, plan = partition.partition(joint, inputs, num_fwd_outputs=kwargs["num_fwd_outputs"], options=options,
                                         static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"))
        result.update(solver_used=plan.solver, predicted_peak_bytes=plan.predicted_peak_bytes,
                      saved_activation_bytes=plan.saved_activation_bytes, plan_stages=plan.notes.get("stages"),
                      why=plan.notes.get("why"))
    except BudgetError as error:
        least = getattr(error, "least_candidate", None)
        result.update(error=str(error).splitlines()[0][:800], least_bytes=error.least_bytes,
                      least_stages=least.plan.notes.get("stages") if least is not None else None)
    result["plan_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1), flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
