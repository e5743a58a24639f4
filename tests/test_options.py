"""Options: parsing, clear errors, and the partitioner's cache key."""

import contextlib
import json
import os
import warnings

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
    ({"memory_budget": 1.5}, "[0, 1]"),
    ({"memory_budget": -0.5}, "[0, 1]"),
    ({"memory_budget": -3}, "positive"),
    ({"memory_budget": 0}, "the float 0.0"),
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


@pytest.mark.parametrize("options, fragments", [
    ("memory_budget=0.5", ["options='memory_budget=0.5'", "not a string"]),
    ([("memory_budget", 0.5)], ["(list)", "dict(pairs)"]),
    ((("memory_budget", 0.5),), ["(tuple)", "dict(pairs)"]),
    ({1: 0.5}, ["option names are strings", "memory_budget"]),
    ({"memory_budget": "0.5"}, ["memory_budget='0.5'", "memory_budget=0.5", "predicted peak"]),
    ({"memory_budget": "50%"}, ["memory_budget='50%'", "memory_budget=0.5", "predicted peak"]),
    ({"memory_budget": "1.5"}, ["memory_budget='1.5'", "whole number"]),
    ({"memory_budget": 2.0}, ["memory_budget=2.0", "least-memory plan's predicted peak (0.0)",
                              "unconstrained (min-cut) plan's (1.0)", "[0, 1]", "memory_budget=2"]),
    ({"memory_budget": "1.0"}, ["memory_budget='1.0'", "memory_budget=1", "predicted peak"]),
    ({"memory_budget": 6e9}, ["memory_budget=6000000000"]),
    ({"memory_budget": float("nan")}, ["memory_budget=nan", "[0, 1]"]),
    ({"memory_budget": float("inf")}, ["memory_budget=inf", "[0, 1]"]),
    ({"memory_budget": True}, ["memory_budget=True", "'6GiB'", "[0, 1]"]),
    ({"memory_budget": [1]}, ["memory_budget=[1] (list)", "'6GiB'"]),
])
def test_malformed_options_say_what_to_write(options, fragments):
    with pytest.raises(OptionError) as err:
        Options.from_user(options)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


def test_numpy_numbers_are_budgets():
    np = pytest.importorskip("numpy")
    assert Options.from_user({"memory_budget": np.int64(1000)}).memory_budget.bytes == 1000
    assert Options.from_user({"memory_budget": np.float64(0.5)}).memory_budget.fraction == 0.5


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
    budget = plan.predicted_peak_bytes // 2
    for attempt in range(2):  # under the graph's floor (x's gradient), the error names the floor first
        tight = torch.compile(_budget_fn, backend="fxremat", options={"compiler": compiler, "memory_budget": budget})
        try:
            tight(x).backward()
        except Exception as error:  # noqa: BLE001 - Dynamo may wrap it
            cause = getattr(error, "inner_exception", None) or error
        else:
            # At the floor the error named, the min-cut plan fits: the floor was its peak
            # (through Inductor: x's gradient and the loss's gradient, all this graph holds).
            assert attempt == 1 and budget == plan.predicted_peak_bytes
            return
        finally:
            torch._dynamo.reset()
        assert isinstance(cause, BudgetError)
        if "below the floor" not in str(cause):
            break
        assert x.numel() * 4 <= cause.least_bytes <= plan.predicted_peak_bytes
        budget = cause.least_bytes
    assert f"at least {plan.predicted_peak_bytes} bytes" in str(cause)


@contextlib.contextmanager
def _no_budget_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", fxremat.BudgetWarning)
        yield


def test_a_graph_with_nothing_to_trade_keeps_its_plan_at_every_fraction():
    # Nothing to trade: every value the backward reads is the input or made from it by
    # one op, so no plan predicts much less than the min-cut plan. That plan is both ends
    # of the fraction's range: the graph keeps it, within the budget, with no warning.
    x = torch.randn(4096, requires_grad=True)
    for fraction in (0.5, 0.0):
        torch._dynamo.reset()
        f = torch.compile(_budget_fn, backend="fxremat", options={"compiler": "eager", "memory_budget": fraction})
        with _no_budget_warning():
            f(x).backward()
        plan = fxremat.inspect.plans()[-1]
        assert plan.solver == "mincut" and plan.notes["nothing_to_trade"]
        assert plan.notes["why"].startswith("auto finds no plan predicting much less than the min-cut plan")
        assert plan.predicted_peak_bytes == plan.budget_bytes
    x.grad = None
    f(x).backward()
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


def test_a_fraction_applies_to_every_graph_of_a_step_with_a_loss_graph_apart():
    torch.manual_seed(0)
    model = _LossAfterGraphBreak().double()
    x, target = torch.randn(512, 128, dtype=torch.float64), torch.randint(0, 16, (512,))
    model(x, target).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    fxremat.inspect.clear()
    compiled = torch.compile(model, backend="fxremat", options={"compiler": "eager", "memory_budget": 0.5})
    with _no_budget_warning():
        compiled(x, target).backward()
    body, loss = fxremat.inspect.plans()
    assert body.solver == "rotor" and body.predicted_peak_bytes <= body.budget_bytes
    between = body.notes["fraction_between"]
    assert body.budget_bytes == between["least_bytes"] + (between["unconstrained_bytes"] - between["least_bytes"]) // 2
    assert loss.notes["nothing_to_trade"] and loss.predicted_peak_bytes == loss.budget_bytes
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=1e-12, atol=1e-12)


def test_a_graph_with_nothing_inside_its_chain_takes_a_fraction():
    # One linear layer: every byte its backward needs is an input or a gradient, so the
    # Rotor chain holds nothing (a model budget of 0, which the DP once rejected).
    model = torch.nn.Linear(4, 4).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    f = torch.compile(model, backend="fxremat", options={"compiler": "eager", "memory_budget": 0.5})
    f(x).sum().backward()
    assert fxremat.inspect.plans()[-1].notes["nothing_to_trade"]
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
def test_inductor_reuses_buffers_under_fxremat_with_the_plan_as_its_peak_estimate():
    """Buffer reuse stays on, bounded by the predicted timeline: the generated code reuses
    buffers (``# reuse`` lines), and every predicted level it consults is the plan's.
    That the holds keep the measured peak at the prediction is
    ``test_rotor_plans.py::test_measured_peak_equals_the_prediction_at_a_small_budget``
    (Inductor's own estimate put that plan 10.5% over)."""
    from torch._inductor.utils import run_and_get_code

    from fxremat import _compat
    from fxremat.models import TransformerStack

    assert _compat.planned_reuse_supported()
    torch.manual_seed(0)
    model = TransformerStack(dim=32, heads=4, layers=4)
    x, y = torch.randn(4, 32, 32), torch.randn(4, 32, 32)
    f = torch.compile(model, backend="fxremat", options={"memory_budget": 0.6})
    consulted = []
    original = _compat._predicted_levels

    def recording(snodes):
        consulted.append(original(snodes))
        return consulted[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_compat, "_predicted_levels", recording)
        _, codes = run_and_get_code(lambda: f(x, y).backward())
    plan = fxremat.inspect.plans()[-1]
    assert len(codes) == 2 and all("# reuse" in code for code in codes)
    assert len(consulted) == 2 and all(c is not None and c[1] == plan.predicted_peak_bytes for c in consulted)
    assert all(max(c[0]) <= plan.predicted_peak_bytes for c in consulted)


def test_predicted_levels_per_kernel_are_the_most_over_its_fx_nodes():
    from types import SimpleNamespace as NS

    from fxremat import _compat

    def snode(*levels):  # a scheduler node lowered from FX nodes with these predictions
        origins = [NS(meta={} if lv is None else {_compat.LIVE_BYTES_KEY: (lv, 100)}) for lv in levels]
        return NS(get_nodes=lambda: [NS(node=NS(origins=origins))])

    # a kernel with no predicted FX node (made by a post-grad pass) counts as at the peak
    assert _compat._predicted_levels([snode(10, 30), snode(None), snode(20)]) == ([30, 100, 20], 100)
    assert _compat._predicted_levels([snode(None)]) is None  # a graph fxremat did not plan


def test_inductor_buffer_reuse_without_the_planned_bound_warns(monkeypatch):
    """On an Inductor whose reuse fxremat cannot bound, reuse is off by default and
    turning it on under a budget warns."""
    from fxremat import _compat, backend

    monkeypatch.setattr(_compat, "planned_reuse_supported", lambda: False)
    seen = {}
    monkeypatch.setattr(_compat, "compile_fx", lambda gm, inputs, config_patches: seen.update(config_patches))
    backend.fxremat_backend(None, [], {"memory_budget": 1.0})
    assert seen["allow_buffer_reuse"] is False
    with pytest.warns(fxremat.BudgetWarning, match="allow_buffer_reuse"):
        backend.fxremat_backend(None, [], {"memory_budget": 1.0, "inductor": {"allow_buffer_reuse": True}})


def test_inductor_keeps_the_plans_node_order_unless_told_otherwise(monkeypatch):
    """Inductor's peak-memory reordering is off for the graphs fxremat plans (its estimate
    is not the plan's); turning it back on under a budget warns."""
    from fxremat import _compat, backend

    if not _compat.inductor_keeps_node_order():
        pytest.skip("this torch's Inductor has no peak-memory reordering")
    seen = {}
    monkeypatch.setattr(_compat, "compile_fx", lambda gm, inputs, config_patches: seen.update(config_patches))
    backend.fxremat_backend(None, [], {})
    assert seen["reorder_for_peak_memory"] is False
    with pytest.warns(fxremat.BudgetWarning, match="reorder_for_peak_memory"):
        backend.fxremat_backend(None, [], {"memory_budget": 1.0, "inductor": {"reorder_for_peak_memory": True}})
    assert seen["reorder_for_peak_memory"] is True


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
    assert sorted(os.listdir(folder)) == ["backward.py", "forward.py", "memory_snapshot.pickle", "plan.json", "report.html"]
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
