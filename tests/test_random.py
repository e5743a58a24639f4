"""Random ops are never recomputed with fresh randomness (cf. pytorch/pytorch#190758)."""

import pytest
import torch
import torch.nn.functional as F

import fxremat


@pytest.mark.parametrize("compiler", ["eager", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_dropout_backward_uses_the_forward_mask(compiler):
    torch.manual_seed(0)
    w = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)
    x = torch.randn(32, 64, dtype=torch.float64)

    def f(x, w):
        h = F.dropout((x @ w).sin(), p=0.5, training=True)
        return h, (h.tanh() * 2).sum()

    compiled = torch.compile(f, backend="fxremat", options={"compiler": compiler})
    h, loss = compiled(x, w)
    loss.backward()
    plan = fxremat.inspect.plans()[-1]
    assert plan.recomputed, "the plan must recompute part of the dropout region for this test to bite"
    assert not any("rand" in r["op"] or "dropout" in r["op"] or "bernoulli" in r["op"] for r in plan.recomputed)
    assert "bool" in {s["dtype"] for s in plan.saved}  # the mask, not the float random tensor

    # The gradient eager autograd computes with the forward's own mask.
    mask = (h != 0).detach()
    assert 0.3 < mask.double().mean() < 0.7
    w_ref = w.detach().clone().requires_grad_()
    ((((x @ w_ref).sin() * mask * 2.0).tanh() * 2).sum()).backward()
    assert torch.allclose(w.grad, w_ref.grad, rtol=1e-12, atol=1e-12)


def test_random_nodes_are_banned_in_the_plan():
    x = torch.randn(128, requires_grad=True)
    compiled = torch.compile(lambda x: (x * torch.randn_like(x)).exp().sum(), backend="fxremat",
                             options={"compiler": "eager"})
    compiled(x).backward()
    plan = fxremat.inspect.plans()[-1]
    assert "random" in plan.banned.values()
    assert not any("rand" in r["op"] for r in plan.recomputed)


@pytest.mark.parametrize("dropout_p, random", [(0.0, False), (0.1, True), (None, False)])
def test_attention_is_random_only_with_dropout(dropout_p, random):
    """SDPA ops carry the nondeterministic_seeded tag for their dropout; without it they
    recompute exactly, and treating them as random would pin every attention output."""
    from fxremat import oplib

    graph = torch.fx.Graph()
    q, k, v = (graph.placeholder(n) for n in "qkv")
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    args = (q, k, v) if dropout_p is None else (q, k, v, dropout_p)  # None: the schema's default
    node = graph.call_function(op, args)
    assert torch.Tag.nondeterministic_seeded in op.tags
    assert oplib.is_random(node) is random
    dropout = graph.call_function(torch.ops.aten.native_dropout.default, (q, 0.0, True))
    assert oplib.is_random(dropout)  # ordinary random ops stay random whatever their p
