"""Selective activation checkpointing marks (issue #27): a model whose blocks run under
``torch.utils.checkpoint`` with a ``create_selective_checkpoint_contexts`` policy that says
MUST_SAVE for the up-projection's matmul and MUST_RECOMPUTE for a sine the default plan
saves (its backward reads it through a matmul, which bans recomputing it). Under every
solver and budget the plan never recomputes a MUST_SAVE value, never saves a MUST_RECOMPUTE
one, and the float64 gradients are eager's."""

import copy
import functools
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import fxremat
from conftest import linearization_of

WIDTH = 32


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))).sin())


def _policy(ctx, op, *args, save_up=True, **kwargs):
    if save_up and op is torch.ops.aten.addmm.default and args[2].shape[-1] == 4 * WIDTH:
        return CheckpointPolicy.MUST_SAVE  # the up-projection
    if op is torch.ops.aten.sin.default:
        return CheckpointPolicy.MUST_RECOMPUTE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _Model(nn.Module):
    def __init__(self, depth=4, save_up=True):
        super().__init__()
        self.policy = functools.partial(_policy, save_up=save_up)
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(_Block() for _ in range(depth))

    def forward(self, x):
        context = functools.partial(create_selective_checkpoint_contexts, self.policy)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False, context_fn=context)
        return x.square().mean()


def _is_up_projection(entry) -> bool:
    return entry["module"].endswith(".up") and entry["name"].startswith("addmm")


@pytest.mark.parametrize("solver,budget,save_up", [
    ("mincut", None, True), ("knapsack", 0.0, True), ("rotor", 0.5, True), ("rotor", 0.0, True),
    ("checkmate", 0.0, True), ("twremat", 0.0, True), ("auto", 0.3, True),
    ("rotor", 0.0, False), ("twremat", 0.0, False),
])
def test_selective_checkpoint_marks_are_followed(solver, budget, save_up):
    model = _Model(save_up=save_up).double()
    x = torch.randn(256, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    reference = copy.deepcopy(model)
    reference(x).backward()
    options = {"compiler": "eager", "solver": solver}
    if budget is not None:
        options["memory_budget"] = budget
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*PREFER_.*")
        torch.compile(model, backend="fxremat", options=options)(x).backward()
    (plan,) = fxremat.inspect.plans()[-1:]
    assert plan.solver == solver or solver == "auto", plan.solver  # a real plan of that solver
    saved_sines = [e["name"] for e in plan.saved if e["name"].startswith("sin")]
    recomputed_up = [e["source"] for e in plan.recomputed if _is_up_projection({**e, "name": e["source"]})]
    assert not saved_sines, f"{plan.solver} saved MUST_RECOMPUTE values {saved_sines}"
    assert not (save_up and recomputed_up), f"{plan.solver} recomputed MUST_SAVE values {recomputed_up}"
    assert any(e["source"].startswith("sin") for e in plan.recomputed)
    if save_up:
        assert sum(_is_up_projection(e) for e in plan.saved) == len(model.blocks)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("save_up", [True, False])
def test_rotors_chain_keeps_must_save_values_and_never_cuts_at_must_recompute_ones(save_up):
    """The chain Rotor, Checkmate and TWRemat plan on: a stage's boundary is saved when the
    stage is checkpointed, so no boundary holds a MUST_RECOMPUTE value; MUST_SAVE values are
    pinned (made once, read by every recomputation of their stage). With the up-projection
    pinned, the sine is made from pinned values alone (``free``: made where read); without,
    the cut after it is one a chain could take."""
    from fxremat import _compat

    model = _Model(save_up=save_up).double()
    lin = linearization_of(model, torch.randn(256, WIDTH, dtype=torch.float64))
    assert len(lin.stages) > len(model.blocks)
    boundaries = {n.name for st in lin.stages for n in st.boundary}
    assert not {name for name in boundaries if name.startswith("sin")}, sorted(boundaries)
    pinned_up = [n.name for n in lin.pinned if _compat.is_must_save(n) and n.name.startswith("addmm")]
    assert len(pinned_up) == (len(model.blocks) if save_up else 0), [n.name for n in lin.pinned]
