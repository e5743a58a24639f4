"""Predicted peak memory vs measured, in a fresh process, on five models (CPU).

Measured with the PyTorch profiler's allocation events (fxremat.harness), a
method independent of the predictor (fxremat.timeline). The budget definition:
bytes the compiled forward and backward allocate above the step's inputs.
"""

import pytest
import torch

from fxremat.harness import measure_step
from fxremat.timeline import predict
from conftest import aten_graph, bench_module

aten = torch.ops.aten

TOLERANCE = 0.05  # the five measure within 2.3% (bench/results/cpu/memory_prediction.md)


@pytest.mark.inductor
@pytest.mark.parametrize("model", ["mlp", "transformer", "cnn", "unet", "gpt"])
def test_predicted_peak_within_five_percent_of_measured(model):
    result = measure_step(model, "fxremat")
    (predicted,) = result["predicted_peak_bytes"]
    measured = result["peak_bytes"]
    assert measured > 0 and result["baseline_bytes"] > 0
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)
    if model == "gpt":
        assert result["recomputed_ops"][0] > 0  # the "plan that recomputes" of the five


# --- Inductor's store-or-inline choice in the timeline (partition level) -------------

N = 128  # square fp32 matrices: 64 KiB each


def _forward(x):
    relu_default = aten.relu.default(x)
    return (aten.sum.default(relu_default), relu_default)  # the loss, and the ReLU output saved for backward


def _backward_with_mask(extra_loads: bool):
    """A batch-norm-backward-like pattern: the ReLU mask applied to the incoming gradient
    (``where``), read by a reduction and by a pointwise op, with a library kernel's
    output allocated between the two readers. With ``extra_loads`` the masked value
    also adds three other buffers: its inlined body loads five."""

    def backward(relu_default, w, a, b, c, tangents_1):
        grad = aten.mm.default(relu_default, w)
        masked = aten.where.self(aten.le.Scalar(relu_default, 0), aten.full.default([], 0.0), grad)
        if extra_loads:
            masked = aten.add.Tensor(aten.add.Tensor(aten.add.Tensor(masked, a), b), c)
        total = aten.sum.dim_IntList(masked, [0])
        other = aten.mm.default(w, w)
        return (aten.add.Tensor(aten.mul.Tensor(masked, total), other), None, None, None, None)

    return backward


def _predict_mask_pattern(extra_loads: bool):
    x, w = torch.randn(N, N), torch.randn(N, N)
    fwd = aten_graph(_forward, x)
    inputs = [torch.relu(x), w, torch.randn(N, N), torch.randn(N, N), torch.randn(N, N), torch.tensor(1.0)]
    bwd = aten_graph(_backward_with_mask(extra_loads), *inputs)
    return predict(fwd, bwd, 1, fusion=True)


def test_a_cheap_value_with_several_readers_is_recomputed_in_each_and_holds_its_inputs():
    """Inductor inlines a pointwise value read by several kernels when its body loads
    few buffers (``where(relu <= 0, 0, grad)``: two), so it is never written, and the
    ReLU output and the gradient both stay alive until its last reader. Taking it as
    written (one buffer instead of two) put the deep CNN's measured peak one activation
    above the prediction at every small Rotor budget (+30% at the minimum)."""
    timeline = _predict_mask_pattern(extra_loads=False)
    allocated = {s for step in timeline.steps for s in step.allocates}
    assert not any(s.startswith("backward:where") for s in allocated)
    one = N * N * 4
    # while the second library kernel runs: the ReLU output, the gradient, its output
    assert timeline.peak_bytes >= 3 * one, timeline.as_records()
    assert timeline.peak_bytes < 3 * one + one // 2


def test_a_value_with_several_readers_loading_many_buffers_is_written():
    """Past Inductor's ``realize_reads_threshold`` (4 loads) a value with several readers
    is written once instead: its inputs are freed after it."""
    timeline = _predict_mask_pattern(extra_loads=True)
    allocated = {s for step in timeline.steps for s in step.allocates}
    assert "backward:add_tensor_2" in allocated, timeline.as_records()  # + c, the value with two readers
    one = N * N * 4
    assert timeline.peak_bytes < 3 * one


def _pointwise_chain_summed(scaled_input_elements: int):
    """A chain of six scaled adds of two inputs (``a`` of N x N, ``b`` of ``scaled_input_elements``
    elements, broadcast), its one reader a sum: a value Inductor could inline, with a fake value
    on every node as ``torch.compile`` hands graphs over."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(a, b):
        v = a
        for _ in range(6):
            v = aten.add.Tensor(aten.mul.Tensor(v, 2.0), b)
        return aten.sum.dim_IntList(v, [0])

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(N, N), torch.randn(scaled_input_elements))
    (total,) = gm.graph.find_nodes(op="call_function", target=aten.sum.dim_IntList)
    return gm, total.args[0]


def test_inductors_own_op_count_shares_constants():
    """The timeline's op count of an inlined body is Inductor's (``inner_fn_opcount``): the
    scalar 2.0 of each of the six ``mul``s is one constant to Inductor's CSE, where a sum per
    op (``timeline.inductor_ops``: a ``mul`` by a scalar is 2 ops) counts it six times. At a
    limit of 16 ops the chain is inlined whole (15 ops), as Inductor does; by the sum per op
    (20) its last ``add`` would be written."""
    from fxremat import timeline

    _, value = _pointwise_chain_summed(N)
    chain = [n for n in value.graph.nodes if n.op == "call_function" and n.target in (aten.mul.Tensor, aten.add.Tensor)]
    with torch._inductor.config.patch(realize_opcount_threshold=16):
        inlining = timeline.Inlining()
        assert inlining.counts(value) == (2, 2 + 1 + 12)  # two loads, one constant, six muls and six adds
        assert sum(timeline.inductor_ops(n) for n in chain) == 18  # each mul 2 ops (op and constant), each add 1
        assert all(inlining.fused_away(n) for n in chain)


@pytest.mark.parametrize("threshold, input_elements, written", [(50, N, False), (10, N, True), (10, 1, False)])
def test_a_value_past_inductors_op_limit_is_written_where_it_loads_two_buffers(threshold, input_elements, written):
    """Any pointwise value, whatever its readers, past ``realize_opcount_threshold`` ops (30 on
    torch 2.11 and on a GPU, 50 on 2.13's CPU) is hinted to be written (``has_exceeded_max_reads``),
    which ``realize_hint`` does where its body loads more than one buffer of more than one
    element (not a one-element ``b``). On torch 2.11, Hugging Face Llama's query gradient through
    the rotary embedding (34 ops, its cosine and sine recomputed from ``iota``) is written so;
    the timeline had taken 100 as that limit and one op per FX node."""
    from fxremat import timeline

    _, value = _pointwise_chain_summed(input_elements)
    chain = [n for n in value.graph.nodes if n.op == "call_function" and n.target in (aten.mul.Tensor, aten.add.Tensor)]
    with torch._inductor.config.patch(realize_opcount_threshold=threshold):
        inlining = timeline.Inlining()
        assert any(not inlining.fused_away(n) for n in chain) is written


@pytest.mark.inductor
def test_deep_cnn_under_a_small_rotor_budget_measures_as_predicted():
    """The deep CNN's Rotor plans recompute batch norms; their backward's ReLU masks are
    inlined by Inductor (above). Before the timeline modelled that, this plan measured
    20% over its prediction and 13% over the budget (1.62 vs 1.35 MiB predicted)."""
    result = measure_step("deep_cnn", "fxremat", {"memory_budget": 0.4, "solver": "rotor"},
                          model_kwargs=dict(batch=4, size=32, depth=6))
    (predicted,) = result["predicted_peak_bytes"]
    (budget,) = result["budget_bytes"]
    measured = result["peak_bytes"]
    assert result["solver"] == ["rotor"] and result["recomputed_ops"][0] > 0
    assert measured <= 1.05 * budget, (measured, budget)
    assert abs(measured - predicted) <= 0.05 * measured, (predicted, measured)


# --- compiler="eager": the partitioned graphs run op by op ----------------------------

class _ResidualMLP(torch.nn.Module):
    """Issue #27's 8-block MLP: under compiler="eager" at a 3,000,000-byte budget it was
    predicted at 2,935,104 B and measured 3,832,144 B (the backward held every saved
    activation to its end)."""

    def __init__(self, dim=64, blocks=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
            for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.square().mean()


def _residual_mlp():
    return _ResidualMLP(), (torch.randn(256, 64),)


@pytest.mark.parametrize("model, budget", [
    ("residual_mlp", None), ("residual_mlp", 3_000_000), ("residual_mlp", 0.5),
    ("deep_cnn", None), ("deep_cnn", 0.5), ("unet", None), ("transformer_seq128", 14_000_000),
])
def test_the_eager_compiler_measures_what_it_predicts(model, budget):
    """``compiler="eager"`` keeps the budget's promise: the step's measured peak (profiler
    allocation events, in this process) equals the plan's prediction within 0.5% and stays
    under a byte budget. Two things made eager steps measure over: inputs held to the end
    of each graph (now boxed: freed at last use), and library kernels' scratch memory (CPU
    convolutions in NCHW copy to oneDNN's layout: the deep CNN measured 26% over at 0.5),
    now measured per call (``fxremat.workspace``), ``prims`` ops included (the softmax
    backward's ``fma`` makes a product before its sum: the transformer at sequence 128
    measured 12% over)."""
    import gc

    import fxremat
    from fxremat import models
    from fxremat.measure import measure_peak_bytes

    torch.manual_seed(0)
    module, batch = (_residual_mlp() if model == "residual_mlp" else
                     models.make_transformer(batch=8, seq=128) if model == "transformer_seq128" else models.ZOO[model]())
    options = {"compiler": "eager"} if budget is None else {"compiler": "eager", "memory_budget": budget}
    fxremat.inspect.clear()
    compiled = torch.compile(module, backend="fxremat", options=options)

    def step():
        loss = compiled(*batch)
        loss.backward()
        return loss

    for _ in range(2):  # compile, then a step whose allocations are all warm
        module.zero_grad(set_to_none=True)
        step()
    module.zero_grad(set_to_none=True)
    gc.collect()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    assert abs(measured - plan.predicted_peak_bytes) <= 0.005 * plan.predicted_peak_bytes, \
        (measured, plan.predicted_peak_bytes)
    if isinstance(budget, int):
        assert measured <= budget
    torch._dynamo.reset()


@pytest.mark.inductor
def test_a_recomputed_concatenation_read_by_convolutions_is_counted_as_inductor_writes_it():
    """Inductor writes a concatenation that its backward recomputes, and that convolutions
    read, three times in one kernel (its channels-last target, the value, a copy for the
    convolution), and each convolution reading it takes a copy of its own; a convolution's
    backward copies a channel slice of its incoming gradient. Uncounted, TWRemat's least plan
    of this U-Net measured 1.32x its prediction and 6% over its budget (issue #27)."""
    import gc

    import fxremat
    from fxremat.measure import measure_peak_bytes
    from fxremat.models import UNet

    torch.manual_seed(0)
    # issue #27's U-Net, smaller: three levels, SiLU, max-pooling, nearest upsampling, concatenated skips
    model, x, y = UNet((3, 16, 32, 64), norm=False), torch.randn(2, 3, 48, 48), torch.randn(2, 3, 48, 48)
    torch._dynamo.reset()
    with pytest.raises(fxremat.BudgetError) as refused:  # planning only: the error names the least plan's budget
        torch.compile(model, backend="fxremat", options={"memory_budget": 1, "solver": "twremat"})(x, y)
    least = refused.value.least_bytes
    assert least and "(twremat" in str(refused.value)
    torch._dynamo.reset()
    fxremat.inspect.clear()
    compiled = torch.compile(model, backend="fxremat", options={"memory_budget": least, "solver": "twremat"})

    def step():
        loss = compiled(x, y)
        loss.backward()
        return loss

    for _ in range(2):
        model.zero_grad(set_to_none=True)
        step()
    model.zero_grad(set_to_none=True)
    gc.collect()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    assert plan.solver == "twremat" and plan.predicted_peak_bytes <= least
    assert measured <= plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)
    torch._dynamo.reset()


def _issue27_model(name):
    """Issue #27's ViT and U-Net, smaller (``bench/frontier_models.py``; the issue's sizes are
    measured by ``bench/prediction_check.py``, bench/results/cpu/solvers_issue27_20261127.md)."""
    frontier_models = bench_module("frontier_models")
    if name == "vit":
        return frontier_models.build("vit", "tiny", {"layers": 2, "batch": 4})
    return frontier_models.build("unet", "tiny", {"channels": [3, 8, 16, 32], "image": 32, "norm": False})


@pytest.mark.inductor
@pytest.mark.parametrize("solver", ["knapsack", "rotor", "checkmate", "twremat"])
@pytest.mark.parametrize("model", ["vit", "unet"])
def test_issue27_models_measure_at_most_their_prediction_under_every_solver(model, solver, monkeypatch):
    """A ViT's knapsack plan measured 0.7% over its prediction, a U-Net's TWRemat plan 47%
    (28% over its budget) and its Rotor plan 7.6% (issue #27). Every solver's plan at a
    budget halfway to its least plan now measures at most its prediction, through Inductor."""
    import dataclasses
    import gc

    import fxremat
    from fxremat.measure import measure_peak_bytes
    from fxremat.strategies import SOLVERS, auto

    if solver == "checkmate" and model == "vit":
        # The ViT's 16 stages took Checkmate's ILP 90 s of this test's 105 (2-core CPU); at
        # the 8 that `auto` gives it, a few seconds. What is measured is the same question.
        monkeypatch.setitem(SOLVERS, "checkmate", dataclasses.replace(SOLVERS["checkmate"],
                                                                      max_stages=auto.CHECKMATE_MAX_STAGES))

    torch.manual_seed(0)
    built = _issue27_model(model)
    torch._dynamo.reset()
    fxremat.inspect.clear()
    with torch._functorch.config.patch(enable_autograd_cache=False):
        compiled = torch.compile(built.model, backend="fxremat", options={"memory_budget": 0.5, "solver": solver})

        def step():
            loss = compiled(*built.batch)
            loss.backward()
            return loss

        for _ in range(2):
            built.model.zero_grad(set_to_none=True)
            step()
    built.model.zero_grad(set_to_none=True)
    gc.collect()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    # (the knapsack keeps the min-cut plan of this U-Net, and says so: nothing to trade)
    assert plan.solver == solver or plan.notes.get("nothing_to_trade"), (plan.solver, plan.notes)
    assert measured <= plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)
    torch._dynamo.reset()


def test_a_concatenation_traced_contiguous_is_copied_for_a_convolution_backward_without_layout_optimization():
    """A backward that recomputes no convolution has no layout optimization, so Inductor
    gives a convolution backward its operands in their traced strides: a concatenation laid
    out channels-last for a part that arrives so (a saved skip activation), but traced
    contiguous, is written and then copied for the call. Counted once, a U-Net's Rotor plan at
    0.6 measured 2.1 MB (12%) over its prediction (``bench/prediction_check.py unet --budget
    0.6``); with layout optimization the call takes it as it is."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat import timeline

    def backward(saved, upsampled, grad, weight):
        cat = torch.cat([upsampled * 2, saved], 1)
        return torch.ops.aten.convolution_backward(grad, cat, weight, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [True, True, True])

    gm = make_fx(backward)(torch.randn(2, 3, 8, 8), torch.randn(2, 5, 8, 8), torch.randn(2, 4, 8, 8),
                           torch.randn(4, 8, 3, 3))
    (cat,) = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.cat.default)
    saved = next(iter(gm.graph.find_nodes(op="placeholder")))
    arrives_channels_last = {saved.name}
    assert timeline._concatenation_copies(cat, set(), arrives_channels_last, relayouts=False) == 1
    assert timeline._concatenation_copies(cat, set(), arrives_channels_last, relayouts=True) == 0
    assert timeline._concatenation_copies(cat, set(), set(), relayouts=False) == 1  # every part computed in its kernel
