"""Outputs, gradients and buffers under fxremat equal eager PyTorch, in float64.

A correct plan lands near 1e-12 relative error; the bound 1e-9 leaves room for
reordered float64 arithmetic only, not for a wrong recomputation.
"""

import pytest
import torch

from fxremat import models
from conftest import train_step_matches_eager

TOL = 1e-9


@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn", "inplace", "gpt"])
def test_partition_level_matches_eager(name):
    assert train_step_matches_eager(models.ZOO[name]) < TOL


def test_batchnorm_running_stats_follow_eager():
    torch.manual_seed(0)
    model, batch = models.make_cnn()
    model = model.double()
    batch = (batch[0].double(), batch[1])
    compiled = torch.compile(model, backend="fxremat", options={"compiler": "eager"})
    compiled(*batch).backward()
    bn = model.features[1]
    assert bn.num_batches_tracked.item() == 1
    expected = 0.9 * torch.zeros_like(bn.running_mean) + 0.1 * model.features[0](batch[0]).mean(dim=(0, 2, 3))
    assert torch.allclose(bn.running_mean, expected, rtol=1e-12, atol=1e-12)


def test_recomputing_plan_matches_eager():
    # A pointwise chain after a matmul: the plan recomputes it in the backward.
    w = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)
    x = torch.randn(32, 64, dtype=torch.float64)
    fn = lambda x, w: torch.nn.functional.gelu((x @ w).sin() * 3).tanh().sum()  # noqa: E731
    compiled = torch.compile(fn, backend="fxremat", options={"compiler": "eager"})
    compiled(x, w).backward()
    import fxremat

    assert fxremat.inspect.plans()[-1].recomputed, "this test needs a plan that recomputes"
    ours = w.grad.clone()
    w.grad = None
    fn(x, w).backward()
    assert torch.allclose(ours, w.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.inductor
@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn"])
def test_inductor_matches_eager(name):
    assert train_step_matches_eager(models.ZOO[name], compiler="inductor", steps=1) < TOL


def test_checkpointed_block_is_correct_and_its_marks_are_reported():
    import copy

    from torch.utils.checkpoint import checkpoint

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

        def forward(self, x):
            h = checkpoint(lambda t: self.a(t).sin().tanh(), x, use_reentrant=False)
            return self.b(h).cos().sum()

    model = M().double()
    x = torch.randn(8, 32, dtype=torch.float64)
    ours = copy.deepcopy(model)
    model(x).backward()
    with pytest.warns(UserWarning, match="PREFER_"):
        torch.compile(ours, backend="fxremat", options={"compiler": "eager"})(x).backward()
    for p, q in zip(model.parameters(), ours.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=1e-12)
