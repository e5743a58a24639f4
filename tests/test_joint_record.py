"""A joint graph saved where it is planned (``$FXREMAT_SAVE_JOINTS``) plans the same elsewhere."""

from __future__ import annotations

import os

import torch

import fxremat
from conftest import bench_module
from fxremat import joint_record


def test_a_saved_joint_graph_plans_again_to_the_same_plan(tmp_path, monkeypatch):
    """A small Hugging Face Qwen2 (attention, a causal mask, rotary embeddings) compiled at
    0.5: its joint graph, saved as it was planned, planned again from the file gives the same
    plan (saved values, recomputed ops, sequence, predicted peak). Replanning outside a compile
    has to drop unread random ops as the compile did: without that the recomputed set differed."""
    monkeypatch.setenv(joint_record.ENV, str(tmp_path))
    frontier_models = bench_module("frontier_models")
    torch.manual_seed(0)
    built = frontier_models.build("qwen2", "tiny", {})
    options = {"memory_budget": 0.5, "compiler": "eager"}
    since = fxremat.inspect.plan_count()
    with torch._functorch.config.patch(enable_autograd_cache=False):
        torch.compile(built.model, backend="fxremat", options=options)(*built.batch).backward()
    (plan,) = fxremat.inspect.plans_since(since)
    path = os.path.join(tmp_path, f"{plan.graph_id}.json")
    assert os.path.isfile(path)
    _, _, again = joint_record.replan(path, options)
    assert (again.solver, again.saved, again.recomputed, again.sequence, again.predicted_peak_bytes) == (
        plan.solver, plan.saved, plan.recomputed, plan.sequence, plan.predicted_peak_bytes)


def test_a_cuda_graph_loads_on_fake_cuda_tensors(tmp_path):
    """A graph of CUDA values (an efficient attention backward reading a broadcast mask) saves
    and loads on a machine without a GPU: the same ops, names, shapes, strides and devices."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    aten = torch.ops.aten

    def attention_backward(i0, i1, q, out, lse, seed, offset, grad):
        bias = torch.where(i0 <= i1, 0.0, float("-inf")).expand(2, 4, 64, 64)
        return aten._scaled_dot_product_efficient_attention_backward(
            grad, q, q, q, bias, out, lse, seed, offset, 0.0, [True, True, True, False])[0]

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(2, 1, 64, 1, dtype=torch.int64, device="cuda"),
                torch.empty(2, 1, 1, 64, dtype=torch.int64, device="cuda"),
                torch.empty(2, 4, 64, 32, device="cuda"), torch.empty(2, 4, 64, 32, device="cuda"),
                torch.empty(2, 4, 64, device="cuda"), torch.empty((), dtype=torch.int64, device="cuda"),
                torch.empty((), dtype=torch.int64, device="cuda"), torch.empty(2, 4, 64, 32, device="cuda")]
        gm = make_fx(attention_backward)(*args)
    path = str(tmp_path / "joint.json")
    joint_record.save(gm, args, {"num_fwd_outputs": 0}, path)
    loaded, inputs, kwargs = joint_record.load(path)

    def described(graph):
        return [(n.name, n.op, str(n.target), *[(tuple(v.shape), v.stride(), str(v.device))
                                                for v in [n.meta.get("val")] if isinstance(v, torch.Tensor)])
                for n in graph.nodes]

    assert described(loaded.graph) == described(gm.graph)
    assert kwargs == {"num_fwd_outputs": 0} and [str(t.device) for t in inputs] == ["cuda:0"] * len(args)
