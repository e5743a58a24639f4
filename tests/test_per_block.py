"""Issue #26: per-block checkpointing is a plan fxremat's search can return, so its least
plan needs no more memory; stages are cut where a block's output alone crosses; every
graph's floor is stated, and no plan predicts under it."""

import contextlib
import copy

import pytest
import torch

import fxremat
from fxremat import chain, models
from fxremat.floor import graph_floor
from fxremat.measure import measure_peak_bytes
from fxremat.sizes import node_bytes

from conftest import SquaredPatchResidual, bench_module, linearization_of, train_step_matches_eager

DECODER = dict(batch=2, seq=64, layers=4, dim=32, heads=2)


def test_narrow_cuts_are_the_valleys_of_the_carried_bytes():
    # A pre-LN decoder's cuts: the residual stream alone (1) between attention (wider
    # cuts: the stream and q/k/v) and the MLP (the stream and its 4x hidden).
    carried = [1, 2, 3, 2, 1, 1, 2, 5, 5, 2, 1, 2, 3, 1]
    assert chain._narrow_cuts(list(range(len(carried))), carried) == [4, 10]  # the first of a run
    # A plain CNN's cuts that differ by a batch norm's statistics are no valleys.
    assert chain._narrow_cuts([0, 1, 2, 3, 4], [1000, 1008, 1000, 1008, 1000]) == []
    # Of a run of equal cuts, the one at the shallowest module boundary: a bottleneck block's
    # cut after its ReLU (depth 1: "layer1.0.relu" | "layer1.1.conv1") rather than after its
    # residual add (depth 2: "layer1.0" | "layer1.0.relu").
    carried, depth = [3, 2, 1, 1, 2, 3], [2, 2, 2, 1, 2, 2]
    assert chain._narrow_cuts(list(range(6)), carried, depth) == [3]
    assert chain._narrow_cuts(list(range(6)), carried, [2] * 6) == [2]


def test_a_bottleneck_resnets_blocks_end_stages():
    # Each block's last op (the ReLU after the residual add) ends a stage: "keep each block's
    # output, recompute the next block" is a plan the chain contains. (Before: the cut fell
    # after the add, which carries as much, and the next stage began with the ReLU.)
    from fxremat.joint import module_path
    built = bench_module("frontier_models").build("resnet50", "tiny", {"depths": (2, 2, 1, 1)})
    lin = linearization_of(built.model, *built.batch)

    def block(n):
        parts = module_path(n).split(".")
        return ".".join(parts[:2]) if parts[0] == "blocks" and len(parts) > 1 else None

    ends = {st.forward[-1] for st in lin.stages if st.forward}
    order = [n for st in lin.stages for n in st.forward]
    last_of_block = {}
    for n in order:
        if block(n) is not None:
            last_of_block[block(n)] = n
    assert len(last_of_block) == 6
    assert all(n.target is torch.ops.aten.relu.default for n in last_of_block.values())
    # (The last block's output is pooled into a smaller value: the cut after the pool is narrower.)
    assert [b for b, n in list(last_of_block.items())[:-1] if n not in ends] == []


def _least_budget(model, batch, options) -> fxremat.BudgetError:
    """The BudgetError that names the least feasible budget (after the floor's error)."""
    budget = 1
    for _ in range(2):
        torch._dynamo.reset()
        with pytest.raises(Exception) as caught:
            torch.compile(model, backend="fxremat", options={**options, "memory_budget": budget})(*batch).backward()
        error = getattr(caught.value, "inner_exception", None) or caught.value
        assert isinstance(error, fxremat.BudgetError)
        if "below the floor" not in str(error):
            return error
        budget = error.least_bytes
    raise AssertionError(f"no least budget named: {error}")


@pytest.mark.inductor
def test_the_least_plan_needs_less_than_per_block_checkpointing_and_is_exact():
    # Through Inductor on both sides: per-block checkpointing's measured peak against
    # fxremat's least feasible budget (found before any code is generated), then fxremat
    # at per-block checkpointing's peak, measured.
    torch.manual_seed(0)
    model, batch = models.make_decoder(**DECODER)
    ckpt = copy.deepcopy(model)
    ckpt.checkpoint_blocks = True
    compiled_ckpt = torch.compile(ckpt)

    def ckpt_step():
        compiled_ckpt(*batch).backward()

    ckpt_step()
    ckpt.zero_grad(set_to_none=True)
    ckpt_peak = measure_peak_bytes(ckpt_step)["peak_bytes"]

    least = _least_budget(model, batch, {})
    assert least.floor_bytes <= least.least_bytes <= 0.9 * ckpt_peak, str(least)

    torch._dynamo.reset()
    fxremat.inspect.clear()
    compiled = torch.compile(model, backend="fxremat", options={"memory_budget": ckpt_peak})

    def step():
        compiled(*batch).backward()

    step()
    model.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(step)["peak_bytes"]
    plan = fxremat.inspect.plans()[-1]
    # The README's tolerance for the measured peak: 5% over the budget. (Here it measures
    # about 1.3% over its prediction: a gap of issue #27's kind, not yet modelled.)
    assert plan.predicted_peak_bytes <= ckpt_peak and measured <= 1.05 * ckpt_peak
    assert plan.notes["floor_bytes"] <= plan.predicted_peak_bytes


def test_the_least_plan_of_the_decoder_computes_exact_gradients():
    # float64 doubles every tensor the budget counts: twice the least float32 budget (op by op).
    torch.manual_seed(0)
    model, batch = models.make_decoder(**DECODER)
    least = _least_budget(model, batch, {"compiler": "eager"})
    torch._dynamo.reset()
    error = train_step_matches_eager(lambda: models.make_decoder(**DECODER), memory_budget=2 * least.least_bytes)
    assert error < 1e-10


def test_the_decoder_is_cut_where_a_block_output_alone_crosses():
    torch.manual_seed(0)
    model, batch = models.make_decoder(**DECODER)
    stream = DECODER["batch"] * DECODER["seq"] * DECODER["dim"] * 4
    # Each block has two such cuts (after attention's residual add, after the MLP's).
    lin = _linearization(model, batch)
    single = [st for st in lin.stages if len(st.boundary) == 1 and node_bytes(st.boundary[0]) == stream]
    assert len(single) >= 2 * DECODER["layers"] - 1, [[b.name for b in st.boundary] for st in lin.stages]


def _linearization(model, batch):
    """The chain Rotor plans on for ``model`` (around its traffic-optimal saved set)."""
    return linearization_of(model, *batch)


@pytest.mark.parametrize("make,solver", [(models.make_transformer, "auto"), (models.make_deep_cnn, "twremat"),
                                         (models.make_unet, "rotor"), (models.make_decoder, "knapsack")])
def test_no_plan_predicts_under_the_floor(make, solver):
    from fxremat.plans import Planned, planning_only, wrapped

    torch.manual_seed(0)
    model, batch = make(**(DECODER if make is models.make_decoder else {}))
    for compiler in ("eager", "inductor"):
        for budget in (None, 0.6, 0.4):
            torch._dynamo.reset()
            fxremat.inspect.clear()
            options = {"compiler": compiler, "solver": solver}
            if budget is not None:
                options["memory_budget"] = budget
            # Inductor's plans (its timeline) are read where they are made: compiling their C++
            # adds nothing to the question and took most of this test's time.
            stop = planning_only() if compiler == "inductor" else contextlib.nullcontext()
            try:
                with stop:
                    torch.compile(model, backend="fxremat", options=options)(*batch).backward()
                plans = fxremat.inspect.plans()
            except Exception as caught:
                planned = wrapped(caught, (Planned,))
                if planned is None:
                    error = getattr(caught, "inner_exception", None) or caught
                    assert isinstance(error, fxremat.BudgetError)
                    assert error.floor_bytes is None or error.floor_bytes <= error.least_bytes
                    continue
                plans = [planned.plan]
            model.zero_grad(set_to_none=True)
            assert plans
            for plan in plans:
                assert 0 < plan.notes["floor_bytes"] <= plan.predicted_peak_bytes, (compiler, budget)


def test_the_floor_names_the_largest_operation():
    def f(x, w):
        return torch.ops.aten.mm.default(x, w)

    gm = torch.fx.symbolic_trace(f)
    x, w, mm = list(gm.graph.nodes)[:3]
    x.meta["val"], w.meta["val"], mm.meta["val"] = torch.ones(4, 8), torch.ones(8, 16), torch.ones(4, 16)
    floor = graph_floor(gm, {"w"}, end_bytes=100)
    assert floor.bytes == floor.op_bytes == 4 * 8 * 4 + 4 * 16 * 4 and floor.largest_op == "mm_default"
    assert "largest single operation (mm_default)" in floor.describe()
    assert graph_floor(gm, {"x", "w"}, end_bytes=1000).describe().startswith("the parameter gradients")


@pytest.mark.inductor
def test_the_tied_heads_gradient_is_kept_apart_through_inductor_exactly():
    """The head's weight gradient is written where it runs, not folded into an ``addmm`` at
    the end of the backward (``fx_passes.keep_products_apart``); float64 gradients through
    Inductor equal eager's."""
    fxremat.inspect.clear()
    error = train_step_matches_eager(lambda: models.make_decoder(**DECODER), compiler="inductor",
                                     memory_budget=0.5)
    plan = fxremat.inspect.plans()[-1]
    assert "torch.ops.aten.sub.Tensor" in plan.backward_code and "alpha = -1" in plan.backward_code
    assert error < 1e-10


class _ReshapedMLP(torch.nn.Module):
    """Blocks whose hidden activation is reshaped between its matmul and its activation
    function (Hugging Face GPT-2's ``Conv1D``: ``addmm`` on a 2-D view, then ``view`` back)."""

    def __init__(self, dim=32, hidden=128, layers=3):
        super().__init__()
        self.ups = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(dim, hidden) / dim ** 0.5)
                                          for _ in range(layers))
        self.downs = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(hidden, dim) / hidden ** 0.5)
                                            for _ in range(layers))

    def forward(self, x):
        b, s, d = x.shape
        for up, down in zip(self.ups, self.downs):
            h = torch.mm(x.view(-1, d), up).view(b, s, -1)  # the hidden activation, then a view of it
            x = x + torch.mm(torch.nn.functional.gelu(h).view(b * s, -1), down).view(b, s, d)
        return x.sum()


def test_no_stage_is_made_of_views_alone():
    # Cut before and after a view, a^(s-1) and a^s are one storage, which the chain counts
    # twice whenever both are alive (GPT-2's least plan measured 7.51 MiB, 6.54 MiB without).
    from fxremat import oplib

    torch.manual_seed(0)
    lin = _linearization(_ReshapedMLP(), (torch.randn(4, 16, 32, requires_grad=True),))
    assert len(lin.stages) >= 6
    for st in lin.stages:
        assert not all(oplib.is_view(n) for n in st.forward), [n.name for n in st.forward]
    # and Rotor's least plan on it computes exact gradients (float64: twice the float32 bytes)
    least = _least_budget(_ReshapedMLP(), (torch.randn(4, 16, 32, requires_grad=True),),
                          {"compiler": "eager", "solver": "rotor"})
    torch._dynamo.reset()
    error = train_step_matches_eager(lambda: (_ReshapedMLP(), (torch.randn(4, 16, 32, requires_grad=True),)),
                                     memory_budget=2 * least.least_bytes, solver="rotor")
    assert error < 1e-10


def _hf_gpt2(layers=3, seq=64):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    built = bench_module("frontier_models").build("gpt2", "tiny", {"layers": layers, "seq": seq})
    return built.model.double().train(), built.batch


def test_a_pinned_attention_mask_is_read_not_remade_in_a_stages_backward():
    """Hugging Face GPT-2 builds its attention mask from position indices, and every block's
    attention reads it: pinned, in memory for the whole step. The lean saved set's backward
    makes it again from the indices (cheap to recompute); placed in the last block's ``B``, it
    read the first stage's values there and merged the whole chain into one stage (8 stages
    for 3 blocks where the traffic-optimal set has 28; on CUDA, where the efficient attention
    reads an expanded view of the mask, both sets: GPT-2 small's model graph had 5 stages, and
    Rotor's least plan 4.59 GiB where per-block checkpointing measures 3.62 GB). A ``B^s``
    reads a pinned value instead. Rotor's least plan gives the gradients of the plan without a
    budget, bit for bit in float64 (against eager both differ by ~1e-8: Hugging Face's loss
    casts the logits to float32, and the decomposed loss rounds apart from eager's:
    ``bench/results/cpu/grad_check_models.md``)."""
    model, batch = _hf_gpt2()
    chains = {label: linearization_of(model, *batch, saved_set=label) for label in ("traffic", "lean")}
    for label, lin in chains.items():
        pinned = set(lin.pinned)
        assert pinned, label  # the mask
        assert not [n.name for stage in lin.stages for n in stage.backward if n in pinned], label
    assert len(chains["lean"].stages) == len(chains["traffic"].stages)
    grads, saved_sets = [], []
    for options in ({}, {"solver": "rotor", "memory_budget": 0.0}, {"solver": "rotor", "memory_budget": 0.3}):
        torch._dynamo.reset()
        model, batch = _hf_gpt2()
        since = fxremat.inspect.plan_count()
        torch.compile(model, backend="fxremat", options={"compiler": "eager", "hold_outputs": False, **options})(
            *batch).backward()
        grads.append([p.grad for p in model.parameters()])
        saved_sets.append(fxremat.inspect.plans_since(since)[0].notes.get("saved_set"))  # the model graph's
    assert saved_sets[2] == "lean"  # a plan around the set whose backward remade the mask
    assert all(torch.equal(a, b) for other in grads[1:] for a, b in zip(grads[0], other))


def test_a_saved_value_only_the_backward_reads_comes_with_what_it_is_made_from():
    """Before: the saved ``2 * x**1`` was placed in the first stage and ``x**1`` in none, so
    Rotor's plans around that saved set read a value no stage made (a ``KeyError`` for
    ``memory_budget=0.0`` through Inductor). Now every value a stage's forward reads is made
    by a stage (or free, pinned, an input), and the least-memory plan is exact in float64."""
    torch.manual_seed(0)
    lin = linearization_of(SquaredPatchResidual(), torch.randn(8, 3, 32, 32), saved_set="traffic")
    staged = {n for st in lin.stages for n in st.forward}
    unmade = sorted({a.name for st in lin.stages for n in st.forward for a in n.all_input_nodes
                     if a.op != "placeholder" and a not in staged and a not in lin.free and a not in lin.pinned})
    assert unmade == []
    position = {n: i for i, n in enumerate(n for st in lin.stages for n in st.forward)}
    assert all(position[a] < position[n] for st in lin.stages for n in st.forward
               for a in n.all_input_nodes if a in position)  # made before it is read
    worst = train_step_matches_eager(lambda: (SquaredPatchResidual(), (torch.randn(8, 3, 32, 32),)),
                                     memory_budget=0.0, solver="rotor")
    assert worst < 1e-10, worst
