"""Options: parsing, clear errors, and the partitioner's cache key."""

import json
import os

import pytest
import torch

import fxremat
from fxremat import BudgetError, OptionError, Options, parse_bytes
from fxremat.backend import FxrematPartitioner


@pytest.mark.parametrize("text, expected", [
    ("6GiB", 6 * 2**30), ("500MB", 500 * 10**6), ("1024", 1024), ("1.5KiB", 1536), (" 2 gb ", 2 * 10**9),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("options, fragment", [
    ({"memory_bugdet": 0.5}, "memory_bugdet"),
    ({"max_autotune": True}, "under the 'inductor' key"),
    ({"memory_budget": 1.5}, "(0, 1]"),
    ({"memory_budget": 0.0}, "(0, 1]"),
    ({"memory_budget": -3}, "positive"),
    ({"memory_budget": "6 gigs"}, "GiB"),
    ({"memory_budget": True}, "memory_budget"),
    ({"solver": "magic"}, "allowed values"),
    ({"compiler": "tvm"}, "compiler"),
    ({"cost_model": "guess"}, "allowed values"),
    ({"inductor": {"no_such_setting": 1}}, "no_such_setting"),
    ({"hold_outputs": "no"}, "True or False"),
])
def test_bad_options_name_the_option_and_what_is_allowed(options, fragment):
    with pytest.raises(OptionError, match=None) as err:
        Options.from_user(options)
    assert fragment in str(err.value)


def test_bad_option_raises_through_torch_compile():
    f = torch.compile(lambda x: x.sin(), backend="fxremat", options={"budget": 1})
    with pytest.raises(Exception, match="unknown fxremat option"):
        f(torch.randn(3, requires_grad=True))


def test_cache_key_covers_every_plan_option():
    base = FxrematPartitioner(Options.from_user({})).uuid()
    variants = [{"memory_budget": 0.5}, {"memory_budget": "1GiB"}, {"solver": "mincut"},
                {"compiler": "eager"}, {"inductor": {"max_autotune": True}}, {"mode": "max-autotune"},
                {"cost_model": "measured"}, {"hold_outputs": False}]
    keys = {FxrematPartitioner(Options.from_user(v)).uuid() for v in variants}
    assert base not in keys and len(keys) == len(variants)
    assert FxrematPartitioner(Options.from_user({})).uuid() == base  # stable
    # debug_dir: every graph must be partitioned to write its files, so no caching at all
    assert FxrematPartitioner(Options.from_user({"debug_dir": "x"})).uuid() is None


def _budget_fn(x):
    return (x.sin() * x.cos()).tanh().sum()


@pytest.mark.parametrize("compiler", ["eager", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_unmet_budget_is_an_error_naming_the_minimum(compiler):
    x = torch.randn(4096, requires_grad=True)
    ok = torch.compile(_budget_fn, backend="fxremat", options={"compiler": compiler, "memory_budget": 1.0})
    ok(x).backward()
    plan = fxremat.inspect.plans()[-1]
    assert plan.budget_bytes == plan.predicted_peak_bytes
    torch._dynamo.reset()
    # Same graph, smaller budget: a stale cache entry would hand back the first plan
    # silently. The budget is in the cache key, so the partitioner runs and refuses.
    half = plan.predicted_peak_bytes // 2
    tight = torch.compile(_budget_fn, backend="fxremat", options={"compiler": compiler, "memory_budget": half})
    with pytest.raises(Exception) as err:
        tight(x).backward()
    assert isinstance(err.value, BudgetError) or "BudgetError" in repr(err.value)
    assert f"at least {plan.predicted_peak_bytes} bytes" in str(err.value)


def test_a_fraction_a_graph_cannot_reach_at_all_keeps_its_plan_with_a_warning():
    # Nothing to trade: every value the backward reads is the input or made from it by
    # one op, so no plan predicts much less than the min-cut plan. A fraction of the
    # unconstrained plan cannot apply; the graph keeps that plan and says so.
    x = torch.randn(4096, requires_grad=True)
    f = torch.compile(_budget_fn, backend="fxremat", options={"compiler": "eager", "memory_budget": 0.5})
    with pytest.warns(fxremat.BudgetWarning, match="cannot apply to this graph"):
        f(x).backward()
    plan = fxremat.inspect.plans()[-1]
    assert plan.solver == "mincut" and plan.notes["budget_unreachable"]
    assert plan.predicted_peak_bytes > plan.budget_bytes
    torch.testing.assert_close(x.grad, torch.func.grad(_budget_fn)(x.detach()))


class _LossAfterGraphBreak(torch.nn.Module):
    """A chain of layers, then the loss in a graph of its own (as Hugging Face models
    compute it, after a graph break)."""

    def __init__(self, width=128, depth=16, classes=16):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x, target):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        logits = self.head(x)
        torch._dynamo.graph_break()
        return torch.nn.functional.cross_entropy(logits, target)


def test_a_fraction_applies_to_the_graphs_that_can_reach_it_when_the_loss_graph_cannot():
    torch.manual_seed(0)
    model = _LossAfterGraphBreak().double()
    x, target = torch.randn(512, 128, dtype=torch.float64), torch.randint(0, 16, (512,))
    model(x, target).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    fxremat.inspect.clear()
    compiled = torch.compile(model, backend="fxremat", options={"compiler": "eager", "memory_budget": 0.5})
    with pytest.warns(fxremat.BudgetWarning) as caught:
        compiled(x, target).backward()
    body, loss = fxremat.inspect.plans()
    assert body.solver == "rotor" and body.predicted_peak_bytes <= body.budget_bytes
    assert loss.notes["budget_unreachable"] and len(caught) == 1 and loss.graph_id in str(caught[0].message)
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=1e-12, atol=1e-12)


def test_a_graph_with_nothing_inside_its_chain_takes_a_fraction_with_a_warning():
    # One linear layer: every byte its backward needs is an input or a gradient, so the
    # Rotor chain holds nothing (a model budget of 0, which the DP once rejected).
    model = torch.nn.Linear(4, 4).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    f = torch.compile(model, backend="fxremat", options={"compiler": "eager", "memory_budget": 0.5})
    with pytest.warns(fxremat.BudgetWarning, match="cannot apply to this graph"):
        f(x).sum().backward()
    assert fxremat.inspect.plans()[-1].notes["budget_unreachable"]
    assert torch.equal(model.bias.grad, torch.full((4,), 2.0, dtype=torch.float64))


def test_outputs_the_caller_drops_do_not_count_in_the_backward():
    # The body graph returns the logits to the loss graph. Held by the caller (the
    # default), they count through the backward beside their own gradient; with
    # hold_outputs=False they count only until the forward returns.
    torch.manual_seed(0)
    x, target = torch.randn(512, 128, dtype=torch.float64), torch.randint(0, 16, (512,))
    peaks = {}
    for hold in (True, False):
        torch._dynamo.reset()
        fxremat.inspect.clear()
        model = _LossAfterGraphBreak().double()
        f = torch.compile(model, backend="fxremat", options={"compiler": "eager", "hold_outputs": hold})
        f(x, target).backward()
        body = fxremat.inspect.plans()[0]
        backward_start = next(i for i, s in enumerate(body.timeline.steps) if s.phase == "backward")
        peaks[hold] = body.timeline.live_bytes[backward_start]
    logits_bytes = 512 * 16 * 8
    assert peaks[True] - peaks[False] == logits_bytes


@pytest.mark.inductor
def test_turning_inductor_buffer_reuse_back_on_under_a_budget_warns():
    f = torch.compile(_budget_fn, backend="fxremat",
                      options={"memory_budget": 1.0, "inductor": {"allow_buffer_reuse": True}})
    with pytest.warns(fxremat.BudgetWarning, match="allow_buffer_reuse"):
        f(torch.randn(64, requires_grad=True)).backward()


def test_byte_budget_that_fits_is_accepted():
    x = torch.randn(4096, requires_grad=True)
    f = torch.compile(_budget_fn, backend="fxremat", options={"compiler": "eager", "memory_budget": "1GiB"})
    f(x).backward()
    assert fxremat.inspect.plans()[-1].budget_bytes == 2**30


def test_debug_dir_writes_graphs_and_plan(tmp_path):
    x = torch.randn(64, requires_grad=True)
    f = torch.compile(_budget_fn, backend="fxremat", options={"compiler": "eager", "debug_dir": str(tmp_path)})
    f(x).backward()
    (folder,) = list(tmp_path.iterdir())
    assert sorted(os.listdir(folder)) == ["backward.py", "forward.py", "plan.json"]
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["saved"] and {"name", "shape", "dtype", "bytes"} <= set(plan["saved"][0])
    assert plan["predicted_peak_bytes"] == max(t["live_bytes"] for t in plan["timeline"])
    backward = (folder / "backward.py").read_text()
    assert plan["recomputed"] and all(f"    {r['name']} = " in backward for r in plan["recomputed"])
    for name in ("forward.py", "backward.py"):
        compile((folder / name).read_text(), name, "exec")  # readable, valid Python


def test_backend_is_found_by_name_without_importing_fxremat():
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "f = torch.compile(lambda x: x.sin().sum(), backend='fxremat', options={'compiler': 'eager'})\n"
        "f(torch.randn(8, requires_grad=True)).backward()\n"
        "import fxremat\n"
        "print(len(fxremat.inspect.plans()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
