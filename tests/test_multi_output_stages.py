"""Multi-output ops (a layer norm's ``var_mean``, attention) in staged plans.

What a stage boundary a^s carries and what is pinned, the forward saves; a saved value
must be a tensor, so a multi-output op is saved item by item (its ``getitem`` nodes),
never as its tuple. A saved tuple becomes an output of the forward graph, which
Inductor's ``GraphLowering.output`` rejects with an AssertionError (and AOTAutograd's
runtime with "expected all tensors_saved_with_vc_check to be Tensors"); a ViT at
memory_budget=0.5 crashed so.
"""

import pytest
import torch
import torch.nn as nn
from conftest import train_step_matches_eager

import fxremat
from fxremat import chain, oplib
from fxremat.models import PreLNBlock
from fxremat.sizes import is_multi_output


class _Blocks(nn.Module):
    def __init__(self, layers: int = 2, dim: int = 64, heads: int = 4):
        super().__init__()
        self.blocks = nn.Sequential(*(PreLNBlock(dim, heads, causal=False) for _ in range(layers)))  # a ViT's
        self.ln = nn.LayerNorm(dim)

    def forward(self, x):
        return self.ln(self.blocks(x)).square().mean()


def _make():
    return _Blocks(), (torch.randn(2, 17, 64),)


def _no_tuple_saved(plan) -> bool:
    return all(row["dtype"] not in ("tuple", "list") for row in plan.saved)


def test_a_cut_after_var_mean_saves_its_items():
    """Rotor's least-memory plan cuts this chain right after a layer norm's var_mean."""
    worst = train_step_matches_eager(_make, memory_budget=1.0, solver="rotor")
    plan = fxremat.inspect.plans()[-1]
    assert plan.solver == "rotor"
    assert _no_tuple_saved(plan)
    assert worst < 1e-12


def test_no_cut_separates_a_multi_output_op_from_its_items(monkeypatch):
    """Whatever cuts the linearization picks: one after every op of the chain."""
    calls = []
    real = chain._stages

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(chain, "_stages", spy)
    torch.manual_seed(0)
    model, batch = _make()
    compiled = torch.compile(model, backend="fxremat", options={"compiler": "eager", "solver": "rotor",
                                                                 "memory_budget": 2**40})
    compiled(*batch).backward()
    order, _, *rest = calls[-1]
    assert sum(is_multi_output(n) for n in order) >= 5  # var_mean x 5, attention x 2
    lin = real(order, list(range(len(order) - 1)), *rest)
    home = {n: stage.index for stage in lin.stages for n in stage.forward}
    for stage in lin.stages:
        assert not [v.name for v in stage.boundary if is_multi_output(v)], stage.index
        for n in stage.forward:  # an item is made in its op's stage
            if oplib.is_getitem(n) and n.args[0] in home:
                assert home[n.args[0]] == stage.index, n.name
    assert not [n.name for n in lin.pinned if is_multi_output(n)]


@pytest.mark.parametrize("solver", ["rotor", "twremat"])
def test_a_pinned_multi_output_op_is_pinned_item_by_item(monkeypatch, solver):
    """Attention taken as random (torch tags it nondeterministic_seeded for its dropout;
    on CUDA with dropout it is): pinned, made once, kept for the step. Without
    dropout its recomputation is exact, so gradients must equal eager."""
    real = oplib.is_random
    monkeypatch.setattr(oplib, "is_random", lambda n: real(n) or "scaled_dot_product" in str(n.target))
    worst = train_step_matches_eager(_make, memory_budget=2**40, solver=solver)
    plan = fxremat.inspect.plans()[-1]
    assert plan.solver == solver
    assert _no_tuple_saved(plan)
    assert worst < 1e-12

