"""The timeline's store-or-inline choice (``timeline.Inlining``) against the buffers Inductor
actually makes, graph by graph, on models through Inductor (issue #27: the next gap between
prediction and measurement is found here, not by a user).

Each compiled graph is captured as Inductor receives it (before its post-grad passes) and,
after code generation, with the buffers Inductor allocates and the FX node each one computes.
Every value the timeline says is written must have such a buffer, and every such buffer must
be a value the timeline writes. Values that differ only in name are matched: a view the
timeline copies for a matmul whose base Inductor writes; a multi-output op's items.

Found this way (a 16-layer decoder's least-memory plan measured 3.7% over its prediction):
the embedding lookups are pointwise kernels to Inductor, so the residual stream is written
one add later than the timeline said (every later choice shifted with it); the positions'
``iota`` is loaded inside the embedding gradient's scatter; the attention gradients' ``clone``
reshaped twice for the input projection's ``mm`` is written; and flash attention's CPU
kernels take per-thread scratch from c10's allocator (``workspace.scratch_model``). The
decoder's prediction now measures to the byte."""

from __future__ import annotations

import copy
import operator
import os

import pytest
import torch

import fxremat
from fxremat import _compat, models, oplib, timeline
from fxremat.measure import measure_peak_bytes

from conftest import bench_module

pytestmark = pytest.mark.inductor


class _Captured:
    """Inductor's graphs as fxremat hands them over, and each one's buffers when lowered
    (those its scheduler later fuses away included: that saving is not the store-or-inline
    choice): ``(the FX node it computes or None, the FX nodes it was lowered from, laid out
    in another buffer's storage)``."""

    def __init__(self, monkeypatch):
        import torch._inductor.compile_fx as compile_fx
        from torch._inductor import ir
        from torch._inductor.graph import GraphLowering

        self.graphs: list[dict] = []
        post_grad, codegen = compile_fx._recursive_post_grad_passes, GraphLowering.codegen

        def before_post_grad(gm, *args, **kwargs):
            self.graphs.append({"graph": copy.deepcopy(gm)})
            return post_grad(gm, *args, **kwargs)

        def recording_codegen(lowering):
            result = codegen(lowering)
            # A buffer laid out in another's storage (a concatenation's input computed into
            # its slice) allocates nothing: not written.
            self.graphs[-1]["buffers"] = [
                (getattr(b.get_origin_node(), "name", None), {o.name for o in b.origins},
                 isinstance(getattr(b, "layout", None), ir.NonOwningLayout))
                for b in lowering.buffers]
            return result

        monkeypatch.setattr(compile_fx, "_recursive_post_grad_passes", before_post_grad)
        monkeypatch.setattr(GraphLowering, "codegen", recording_codegen)


def _disagreements(graph: dict) -> list[tuple[str, bool, int]]:
    """``(node, the timeline writes it, bytes)`` for every pointwise value (one Inductor may
    inline: reductions and library calls are always written) whose written or inlined state
    differs between the timeline and Inductor."""
    gm = graph["graph"]
    inlining = timeline.Inlining()
    # (the layouts a lowering reads: the graph's own, its inputs taken as arriving contiguous)
    inlining.channels_last_buffer = timeline.channels_last_buffers(
        inlining, _compat.inductor_prefers_channels_last(gm), set())
    kept = [(node, origins) for node, origins, in_another in graph["buffers"] if not in_another]
    inductor = {node for node, _ in kept if node is not None}
    # a multi-output op's items (var_mean's two reductions, an attention's outputs): buffers
    # named after the item, the op, or (a reduction's) with no node of their own
    lowered_from = set().union(*(origins for node, origins in kept if node is None))
    copied_for = set()  # the bases whose view the timeline copies (the same buffer, another name)
    for n in gm.graph.nodes:
        if n.op == "call_function" and oplib.is_view(n) and inlining.copied(n):
            base = n.args[0]
            while base.op == "call_function" and oplib.is_view(base) and not inlining.copied(base):
                base = base.args[0]
            copied_for.add(base.name)
    found = []
    for n in gm.graph.nodes:
        if (n.op != "call_function" or not isinstance(n.meta.get("val"), torch.Tensor) or oplib.is_view(n)
                or not inlining.fusible(n) or oplib.is_reduction(n)  # no choice: always written
                or timeline._lazy_constant(n)):  # constants: made where first needed, or never
            continue
        ours = not inlining.fused_away(n)
        # (an item of a tuple Inductor lowers item by item, a max-pool's, is a buffer of its own or none)
        tuple_item = n.target is operator.getitem and not oplib.lowered_item_by_item(n.args[0])
        theirs = n.name in inductor or (tuple_item and (n.args[0].name in inductor or n.args[0].name in lowered_from))
        if not ours and theirs and n.name in copied_for:
            continue
        if ours and not theirs and n.name in lowered_from and timeline._reshaped_for_convolution_backward(
                n, lambda: True):
            continue  # written, then copied for its convolution backward: a buffer named after neither
        if ours != theirs:
            found.append((n.name, ours, n.meta["val"].numel() * n.meta["val"].element_size()))
    return found


def _step(model, batch, options):
    torch._dynamo.reset()
    fxremat.inspect.clear()
    compiled = torch.compile(model, backend="fxremat", options=options)

    def step():
        model.zero_grad(set_to_none=True)
        compiled(*batch).backward()

    return step


@pytest.fixture
def fresh_inductor():
    # Every graph compiled here, not taken from a cache (whose hit skips the lowering seen).
    with torch._functorch.config.patch(enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False):
        yield


def test_the_decoders_least_plan_writes_what_inductor_writes_and_measures_its_prediction(monkeypatch, fresh_inductor):
    captured = _Captured(monkeypatch)
    torch.manual_seed(0)
    model, batch = models.make_decoder(batch=2, seq=32, vocab=64, dim=32, heads=2, layers=4)
    step = _step(model, batch, {"memory_budget": 0.0})
    step()
    assert len(captured.graphs) == 2 and all("buffers" in g for g in captured.graphs)
    for graph in captured.graphs:
        assert _disagreements(graph) == []
    step()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    assert plan.recomputed  # the least plan recomputes the blocks in the backward
    assert measured <= plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)
    assert measured >= 0.99 * plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=86, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    return _hf_loss(transformers.LlamaForCausalLM, config, batch=2, seq=16)


def _tiny_transformer():
    """The 2-layer transformer of ``bench/frontier_models.py``'s tiny scale (seed 0) and a batch."""
    torch.manual_seed(0)
    model = models.TransformerStack(dim=64, heads=4, layers=2)
    return model, (torch.randn(2, 32, 64), torch.randn(2, 32, 64))


def _warm_step_and_plan(model, batch, options):
    """Compile, run two steps, and return the third step's measured peak and the one plan."""
    step = _step(model, batch, options)
    step()
    step()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    return measured, plan


def _hf_loss(model_class, config, batch: int, seq: int):
    """A Hugging Face model with a language-modelling head (seed 0), as a module returning its
    loss on random tokens, and those tokens."""
    torch.manual_seed(0)
    hf = model_class(config)
    ids = torch.randint(0, config.vocab_size, (batch, seq))

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = hf

        def forward(self, ids):
            return self.hf(input_ids=ids, labels=ids).loss

    return Loss(), (ids,)


def test_a_hugging_face_llamas_rotary_concatenation_is_written_as_inductor_writes_it_on_cpu(monkeypatch,
                                                                                         fresh_inductor):
    """Inductor on CPU writes every ``cat`` to a buffer of its own (``ConcatKernel``), its
    pointwise inputs computed into its slices: Llama's ``rotate_half`` (``cat(-x2, x1)``) is
    a buffer the size of the queries (keys) in each attention, which the timeline had inlined
    into the rotary multiply. No value Inductor writes is inlined by the timeline."""
    model, batch = _tiny_llama()
    captured = _Captured(monkeypatch)
    _step(model, batch, {})()
    cats = [n for g in captured.graphs for n in g["graph"].graph.nodes if n.target is torch.ops.aten.cat.default]
    assert cats and len(captured.graphs) == 2
    for graph in captured.graphs:
        assert [d for d in _disagreements(graph) if not d[1]] == []


def test_a_hugging_face_llamas_norm_weight_gradients_run_where_the_timeline_puts_them(fresh_inductor):
    """The default plan saves the residual stream's terms, so every RMSNorm weight gradient
    sums over the same saved values. Inductor fused those sums, which read nothing from
    one another, into one kernel at the end of the backward, and every weight gradient's
    matmul ran after it: gradients and saved values the timeline frees in each layer were
    held to the end (tiny Llama of ``bench/frontier_models.py``: 11.9% over the prediction
    with Inductor's buffer reuse holding more on top). Kernels that share no data are now
    fused only between the same two library calls; the step measures its prediction."""
    model, batch = _tiny_llama()
    step = _step(model, batch, {})
    step()
    step()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    assert measured <= plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)
    assert measured >= 0.99 * plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)


class _PatchEmbedding(torch.nn.Module):
    """A ViT's stem: 8×8 patches, a class token in front, a linear head on the tokens."""

    def __init__(self, dim=32):
        super().__init__()
        self.patches = torch.nn.Conv2d(3, dim, 8, 8)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, dim))
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x, y):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), tokens], 1)
        tokens = torch.nn.functional.layer_norm(tokens, tokens.shape[-1:])
        return torch.nn.functional.cross_entropy(self.head(tokens).mean(1), y)


def test_a_patch_embeddings_gradient_copied_dense_by_the_convolution_is_counted(fresh_inductor):
    """The patch convolution's gradient arrives as a view of the tokens' gradient past the
    class token, permuted to channels: its strides leave gaps, so the convolution's backward
    copies it to a dense buffer first (``timeline._view_with_gaps``; a tiny ViT measured 1.3%
    over its prediction without it). oneDNN's own scratchpads of a few hundred bytes are
    measured (``workspace.channels_last_scratch_bytes``): within 0.5%."""
    torch.manual_seed(0)
    batch = (torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,)))
    measured, plan = _warm_step_and_plan(_PatchEmbedding(), batch, {})
    assert 0.99 * plan.predicted_peak_bytes <= measured <= 1.005 * plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)


def test_inductor_runs_the_plans_node_order_not_its_peak_memory_reordering(monkeypatch, fresh_inductor):
    """Inductor's ``reorder_for_peak_memory`` runs whichever topological order its own
    estimate finds lowest. On a 2-layer transformer planned at per-block checkpointing's
    measured peak (611,080 B on an AMD EPYC) it chose the depth-first order, every weight
    gradient's matmul last, and the step measured 22% over the plan's prediction. fxremat
    turns the pass off: the order it emits is the plan's schedule. The pass is replaced here
    by that depth-first order so the test does not depend on Inductor's estimate."""
    from torch._inductor import memory

    reordered = []

    def depth_first(nodes, *args, **kwargs):
        reordered.append(len(nodes))
        memory.prepare_planning_info(nodes, *args)
        return memory.topological_sort_dfs(nodes)

    monkeypatch.setattr(memory, "reorder_for_peak_memory", depth_first)
    measured, plan = _warm_step_and_plan(*_tiny_transformer(), {"memory_budget": 611_080})
    assert 0.99 * plan.predicted_peak_bytes <= measured <= plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)
    assert reordered == []


def test_a_hugging_face_berts_last_kernels_free_what_they_read_after_them(fresh_inductor):
    """Inductor's C++ backend generates one function for all its kernels between two library
    calls, and frees the buffers they read only after it. At the end of a BERT's least-memory
    backward that function holds the embeddings' layer-norm backward, the three embedding
    gradients and the sum of the last attention's input gradients: those gradients, the
    layer norm's intermediates and the word embeddings' 64 KiB gradient are alive at once
    (6.8% over the prediction when the timeline freed each after its own op)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=256, max_position_embeddings=32, vocab_size=256,
                                     use_cache=False, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    measured, plan = _warm_step_and_plan(*_hf_loss(transformers.BertForMaskedLM, config, batch=2, seq=32),
                                         {"memory_budget": 0.0})
    assert 0.99 * plan.predicted_peak_bytes <= measured <= 1.005 * plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)


def test_the_transformers_least_plan_measures_its_prediction(fresh_inductor):
    """The least plan recomputes each attention's ``qkv`` projection in the backward and clones
    ``v`` out of it for the one ``bmm`` that reads it; Inductor computes that clone when it
    lowers the ``bmm``, after another one, holding ``qkv`` until then
    (``timeline.written_at_reader``; 2.8% over the prediction without it)."""
    measured, plan = _warm_step_and_plan(*_tiny_transformer(), {"memory_budget": 0.0})
    assert plan.recomputed
    assert 0.99 * plan.predicted_peak_bytes <= measured <= plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)


def test_a_unets_convolution_backward_scratchpad_is_counted(fresh_inductor):
    """The tiny U-Net's measured peak is inside a convolution backward: oneDNN's scratchpad
    (about 20 KiB) on top of its weight copies. The timeline takes each convolution's
    workspace as measured on channels-last inputs, as Inductor calls it
    (``workspace.channels_last_scratch_bytes``; 9.1% over the prediction without it)."""
    torch.manual_seed(0)
    model = models.UNet((3, 8, 16))
    batch = (torch.randn(2, 3, 16, 16), torch.randn(2, 3, 16, 16))
    measured, plan = _warm_step_and_plan(model, batch, {})
    assert 0.99 * plan.predicted_peak_bytes <= measured <= plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)


def _group_norm_cnn():
    """Two convolutions, each with a group norm and a SiLU, under a squared loss (seed 0),
    as a module returning its loss, and its batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.GroupNorm(4, 16), torch.nn.SiLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.GroupNorm(4, 16), torch.nn.SiLU())

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x):
            return self.body(x).square().mean()

    return Loss(), (torch.randn(2, 3, 16, 16),)


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_group_norms_scale_and_shift_are_written_and_its_output_inlined(monkeypatch, fresh_inductor, budget):
    """A group norm's decomposition reads its per-sample, per-channel scale and shift through
    ``as_strided``, whose lowering writes the value it reinterprets: Inductor writes those small
    values, and the normalized output, loading three buffers, is inlined into its readers. With
    the scale and shift taken as inlined, the output's body loaded five and was taken as written:
    the U-Net of ``bench/frontier_models.py`` measured 2 MiB over its prediction where a plan
    recomputed its group norms and SiLUs in the backward (``timeline._read_as_strided``)."""
    captured = _Captured(monkeypatch)
    model, batch = _group_norm_cnn()
    step = _step(model, batch, {} if budget is None else {"memory_budget": budget})
    step()
    for graph in captured.graphs:
        assert any(n.target is torch.ops.aten.as_strided.default for n in graph["graph"].graph.nodes)
        assert _disagreements(graph) == []
    step()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    assert measured <= plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)


def test_where_inductor_hands_a_convolution_backward_its_traced_strides_aten_copies_the_gradient(monkeypatch,
                                                                                               fresh_inductor):
    """torch 2.11's Inductor hands a convolution backward its operands in the strides its graph
    traced them in (``constrain_to_fx_strides``), and ATen copies a gradient traced contiguous
    to channels-last while the call runs (measured on torch 2.11: the group norm below, one
    32 KiB activation over the prediction; torch 2.13 writes that copy itself). The traced
    strides are Inductor's, propagated from the inputs as they arrive: the first convolution
    backward's gradient, reshaped from the group norm's groups, is contiguous and copied; the
    second's, computed from channels-last saved activations, is channels-last and is not (the
    planner's graph, traced contiguous, would have copied both). Checked here on the
    layouts the timeline measures each backward's scratch in (the bytes oneDNN takes for them
    differ between CPUs: on an AVX-512 Xeon the copy is one gradient, 32 KiB, on an AVX2-only
    EPYC 27 KiB more in all); the measurement on torch 2.11 (the two group-norm tests above)."""
    from fxremat import timeline

    predicted, handed = {}, []
    measure = timeline.convolution_scratch_bytes
    monkeypatch.setattr(timeline, "convolution_scratch_bytes",
                        lambda node, channels_last: handed.append((node.name, 0 in channels_last))
                        or measure(node, channels_last))
    for orders in (True, False):
        monkeypatch.setattr(_compat, "inductor_orders_convolution_backward_operands", lambda orders=orders: orders)
        _step(*_group_norm_cnn(), {})()
        (plan,) = fxremat.inspect.plans()
        predicted[orders] = plan.predicted_peak_bytes
    # each backward's gradient as traced: the first contiguous (copied), the second channels-last
    assert sorted(set(handed)) == [("convolution_backward", False), ("convolution_backward_1", True)], handed
    assert predicted[False] > predicted[True], predicted



def test_a_convolution_backwards_scratch_is_measured_in_the_layouts_it_is_handed():
    """Where Inductor hands a convolution backward its operands in their traced strides (torch
    2.11), oneDNN copies, while the call runs, an operand laid out other than the layout it
    computes in (channels-last where the input or the weight is): the zoo CNN's first
    convolution backward, its input the contiguous image and its weight contiguous, got a
    channels-last gradient from a max-pool backward and allocated two gradient-sized buffers
    more than the channels-last scratch the timeline counted (its least plan measured 241,136 B
    against 237,552 predicted on 2.11; to the byte once measured in these layouts)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat import workspace

    def backward(grad, image, weight):
        return torch.ops.aten.convolution_backward.default(grad, image, weight, [16], [1, 1], [1, 1], [1, 1],
                                                            False, [0, 0], 1, [False, True, True])

    gm = make_fx(backward, tracing_mode="fake")(torch.randn(4, 16, 16, 16), torch.randn(4, 3, 16, 16),
                                                torch.randn(16, 3, 3, 3))
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution_backward.default]
    gradient_bytes = 4 * 16 * 16 * 16 * 4
    every_operand = workspace.convolution_scratch_bytes(node, frozenset({0, 1, 2}))
    gradient_only = workspace.convolution_scratch_bytes(node, frozenset({0}))
    assert every_operand == workspace.channels_last_scratch_bytes(node) < gradient_bytes
    assert gradient_only >= 2 * gradient_bytes, (gradient_only, every_operand)


@pytest.mark.skipif(not _compat.inductor_orders_convolution_backward_operands(),
                    reason="this torch's Inductor hands a convolution backward its operands in their traced strides")
def test_a_convolution_backward_without_the_layout_optimization_is_handed_its_operands_in_the_weight_gradients_order():
    """A backward that recomputes no convolution runs no layout optimization; Inductor (torch
    2.13) then asks the input and gradient for the stride order of the weight's gradient as
    ATen lays it out, and the gradient and weight for the input gradient's. A depthwise weight
    (C, 1, 7, 7) has both orders at once, so its channels-last gradient orders the input
    (N, H, C, W) innermost last: the strides HF ConvNeXt's generated backward hands its 7x7
    convolution, where oneDNN takes 65 KB of scratch (1.6 MB with every operand channels-last,
    which the timeline counted: its default plan predicted 4x its measured peak)."""
    cl = torch.channels_last
    grad = torch.randn(4, 32, 4, 4).contiguous(memory_format=cl)
    image = torch.randn(4, 32, 4, 4).contiguous(memory_format=cl)
    depthwise = _compat.inductor_convolution_backward_strides(
        (grad, image, torch.randn(32, 1, 7, 7), [32], (1, 1), (3, 3), (1, 1), False, (0, 0), 32, [True, True, True]))
    assert depthwise == ((512, 16, 4, 1), (512, 4, 128, 1), (49, 49, 7, 1))
    # (a 2x2 downsampling convolution, its operands channels-last: handed over as they are)
    downsample = _compat.inductor_convolution_backward_strides(
        (grad, torch.randn(4, 16, 8, 8).contiguous(memory_format=cl), torch.randn(32, 16, 2, 2), [32], (2, 2),
         (0, 0), (1, 1), False, (0, 0), 1, [True, True, True]))
    assert downsample == ((512, 1, 128, 32), (1024, 1, 128, 16), (64, 1, 32, 16))


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_a_hugging_face_convnext_measures_its_prediction(fresh_inductor, budget):
    """Hugging Face's ConvNeXt, tiny, outside the zoo: its default plan predicted 1,982,512 B
    and measured 485,488 (the depthwise convolution backward's scratch counted with every
    operand channels-last, ``test_a_convolution_backward_without_the_layout_optimization...``),
    and its least plan measured 1,694,768 B, 3.5x the default plan's peak. Also counted now: a
    saved activation the forward laid out channels-last, flattened for a matmul in the
    backward, is copied for it (``_unexpressible_view``). The default plan measures 4% over its
    prediction (two layer-norm row statistics and one activation-sized buffer not modelled);
    the least plan to the byte, below the default."""
    pytest.importorskip("transformers")
    built = bench_module("frontier_models").build("hf_convnext", "tiny")
    step = _step(built.model, built.batch, {} if budget == 1.0 else {"memory_budget": budget})
    step()
    step()
    measured = measure_peak_bytes(step)["peak_bytes"]
    plan = fxremat.inspect.plans()[-1]
    assert 0.99 * plan.predicted_peak_bytes <= measured <= 1.05 * plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)


@pytest.mark.parametrize("budget", [0.5, 0.0])
def test_a_hugging_face_resnets_recomputed_stem_measures_its_prediction(fresh_inductor, budget):
    """Hugging Face's ResNet (not the zoo's), tiny, its stem recomputed in the backward: the
    kernel stretch before the stem's convolution backward (one C++ function, freeing what it
    read last only at its end) writes the image's channels-last copy for that call while the
    recomputed stem and the max-pool's gradient are alive, and writes the stem's batch-norm
    gradient beside the pool's scatter, not over it (made as channels x pixels, it is read
    contiguous through its view). With the copy counted at the call and the gradient over the
    scatter, both plans measured 17% over their predictions (264,752 B against 226,224)."""
    pytest.importorskip("transformers")
    built = bench_module("frontier_models").build("hf_resnet", "tiny")
    step = _step(built.model, built.batch, {"memory_budget": budget})
    step()
    step()
    measured = measure_peak_bytes(step)["peak_bytes"]
    # (Hugging Face sets ``config.problem_type`` in the first call, so Dynamo compiles the
    # model again, to the same plan: the step runs the last one)
    plan = fxremat.inspect.plans()[-1]
    assert 0.99 * plan.predicted_peak_bytes <= measured <= plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)

# The CPU profile calibrated on the project's 2-core Intel Xeon (2026-11-29), as
# ``calibrate_cpu()`` cached it there: the profile under which the frontier U-Net's plan at
# per-block checkpointing's peak measured 15.3% over its prediction.
_CALIBRATED_XEON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results",
                                "cpu", "resnet50_time_split_20261129", "cpu_profile_calibrated.json")


@pytest.mark.parametrize("profile, budget", [("calibrated", 13_937_044), ("default", 0.0)])
def test_the_frontier_unets_group_norm_plans_measure_at_most_their_predictions(monkeypatch, tmp_path, fresh_inductor,
                                                                              profile, budget):
    """The frontier U-Net (GroupNorm + SiLU, recomputed in a channels-last backward) at
    per-block checkpointing's measured peak under the calibrated CPU profile, and its least
    plan under the default one. Before: 15.3% over the prediction and over the budget (the
    group norm's buffers as the timeline took them: its scale and shift inlined, an in-place
    write over a buffer laid out otherwise, no channels-last copy of the reshaped gradient a
    convolution backward reads), then 3.4% over at the least plan (a recomputed skip
    concatenation counted at its convolution backward, written where it is lowered)."""
    import importlib
    import json

    from fxremat import devices

    if profile == "calibrated":
        with open(_CALIBRATED_XEON) as f:
            (figures,) = json.load(f).values()
        calibrated = devices._profile_from_json(figures)
        monkeypatch.setattr(devices, "cpu_profile", lambda calibrate=False, directory=None: calibrated)
    else:  # (whatever this machine has cached)
        uncalibrated = devices.cpu_profile(directory=tmp_path)
        monkeypatch.setattr(devices, "cpu_profile", lambda calibrate=False, directory=None: uncalibrated)
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    frontier_models = importlib.import_module("frontier_models")
    torch.manual_seed(0)
    built = frontier_models.build("unet", "small", {})
    options = {"memory_budget": budget, "hold_outputs": False}
    try:
        measured, plan = _warm_step_and_plan(built.model.train(), built.batch, options)
    except Exception as error:  # (a BudgetError, or Dynamo's wrapping of one)
        # The budget is per-block checkpointing's peak on torch 2.13. Where Inductor hands a
        # convolution backward its operands in their traced strides (2.11), ATen copies the
        # group norms' reshaped gradients at each call, and the least plan predicts more
        # than that budget: the test then asks for the budget the refusal names.
        least = getattr(error, "least_bytes", None) or getattr(error.__cause__, "least_bytes", None)
        if profile != "calibrated" or _compat.inductor_orders_convolution_backward_operands() or least is None:
            raise
        budget = options["memory_budget"] = least
        measured, plan = _warm_step_and_plan(built.model.train(), built.batch, options)
    # (the step holds its float32 loss through ``backward()``: counted also with
    # ``hold_outputs=False``, as the frontier runs compile, ``sizes.held_outputs``)
    assert measured <= plan.predicted_peak_bytes, (measured, plan.predicted_peak_bytes)
    if profile == "calibrated":
        assert measured <= budget, (measured, budget)


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_max_pools_offsets_and_indices_are_made_where_inductor_makes_them(monkeypatch, fresh_inductor, budget):
    """Inductor lowers a max-pool as two pointwise values, its result and the window offsets
    (inlined into the indices computed from them), and computes the indices, read only by
    the backward's scatter, right before that ATen call; there it also copies the indices and
    the gradient (views flattening a channels-last value) for the call. The zoo's CNN measured
    16% over its prediction with those copies left out, and issue #27's U-Net held the
    pooled activation to the scatter where the timeline had freed it."""
    captured = _Captured(monkeypatch)
    torch.manual_seed(0)
    model, batch = models.make_cnn()
    options = {} if budget is None else {"memory_budget": budget}
    step = _step(model, batch, options)
    step()
    for graph in captured.graphs:
        # the pools' items, the indices made from them, and the pools' inputs
        pooling = {n for n in graph["graph"].graph.nodes if n.op == "call_function" and "max_pool" in str(n.target)}
        involved = {m.name for n in pooling for m in [n, *n.users, *n.all_input_nodes]}
        assert pooling  # the decomposition this test is about is in the graph
        assert [d for d in _disagreements(graph) if d[0] in involved] == []
    step()
    measured = measure_peak_bytes(step)["peak_bytes"]
    (plan,) = fxremat.inspect.plans()
    assert 0.99 * plan.predicted_peak_bytes <= measured <= plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)


def test_through_inductor_on_cuda_only_extern_kernels_take_scratch(monkeypatch):
    """On CUDA every op Inductor runs as an extern kernel has its scratch measured; an op it
    generates code for has none, though op by op it allocates one (``prims.fma``, from the
    softmax backward's decomposition: an H100 run predicted a 33.5 MB temporary for one that
    Inductor fused into its kernel). Fake CUDA tensors: no GPU needed to plan."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxremat import workspace

    monkeypatch.setattr(workspace, "_measure", lambda node, channels_last=False, strides=None: 12345)
    monkeypatch.setattr(workspace, "_MEASURED", {})
    with FakeTensorMode(allow_non_fake_inputs=True):
        a, b = torch.empty(64, 64, device="cuda"), torch.empty(64, 64, device="cuda")
        graph = torch.fx.Graph()
        x, y = graph.placeholder("x"), graph.placeholder("y")
        x.meta["val"], y.meta["val"] = a, b
        fma = graph.call_function(torch.ops.prims.fma.default, (x, y, x))
        fma.meta["val"] = torch.ops.prims.fma.default(a, b, a)
        mm = graph.call_function(torch.ops.aten.mm.default, (fma, y))
        mm.meta["val"] = torch.ops.aten.mm.default(a, b)
    scratch = workspace.scratch_model(inductor=True)
    assert workspace.library_workspace_bytes(fma) == 12345  # op by op, its Python reference allocates
    assert scratch(fma) == 0
    assert scratch(mm) == 12345


def test_on_a_gpu_an_addmms_readers_load_its_bias():
    """On a GPU Inductor runs an ``addmm`` whose readers are all pointwise as ``mm`` plus a
    bias add fused into each reader, so a reader loads the product and the bias. A residual
    stream ``x2 = x1 + fc(h)`` after ``x1 = e + fc(g)``, read three times: inlined on a CPU
    (it loads ``e`` and the two products), written on a GPU (and the two biases: five loads,
    over Inductor's four for a value read more than once). Measured on an H100: a GPT's
    least-memory plan 5.5% over its prediction before (fake tensors here: no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def residual(e, g, w1, b1, h, w2, b2):
        x1 = e + torch.addmm(b1, g, w1)
        x2 = x1 + torch.addmm(b2, h, w2)
        return x2.sin() * 2, x2.cos() + 1, x2.exp()

    written = {}
    for device in ("cpu", "cuda"):
        with FakeTensorMode(allow_non_fake_inputs=True):
            shapes = [(256, 64), (256, 64), (64, 64), (64,), (256, 64), (64, 64), (64,)]
            gm = make_fx(residual)(*[torch.empty(s, device=device) for s in shapes])
        inlining = timeline.Inlining()
        nodes = {n.name: n for n in gm.graph.nodes}
        assert [timeline.unfused_bias(nodes[a]) is not None for a in ("addmm", "addmm_1")] == [device == "cuda"] * 2
        written[device] = [name for name in ("add", "add_1") if not inlining.fused_away(nodes[name])]
    assert written == {"cpu": [], "cuda": ["add_1"]}


def test_on_a_gpu_a_mask_read_through_its_broadcast_by_attention_backwards_is_written_and_copied_for_each():
    """A causal mask made from positions (two loads), broadcast over the heads and read
    through that ``expand`` by two efficient attention backwards (a Hugging Face decoder's
    recomputed mask on CUDA): Inductor hints the mask to be written at the ``expand`` (a view
    passes ``realize_hint`` to its base), and copies the broadcast dense for each call
    (``sdpa_constraint`` cannot read an ``ExpandView``'s strides). Measured on an H200 with
    torch 2.11: Qwen2's, Mistral's, Gemma's, GPT-NeoX's and Phi's least plans 6.3–7.7% over
    their predictions, which had the mask computed into each copy and never written. Fake
    tensors: no GPU needed."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxremat import oplib

    aten = torch.ops.aten

    def attention_backwards(i0, i1, q, k, v, out, lse, seed, offset, grad):
        bias = torch.where(i0 <= i1, 0.0, float("-inf")).expand(2, 4, 64, 64)
        first = aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, False])
        second = aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, False])
        return first[0] + second[0]

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [torch.empty(2, 1, 64, 1, dtype=torch.int64, device="cuda"),
                torch.empty(2, 1, 1, 64, dtype=torch.int64, device="cuda"),
                *[torch.empty(2, 4, 64, 32, device="cuda") for _ in range(4)], torch.empty(2, 4, 64, device="cuda"),
                torch.empty((), dtype=torch.int64, device="cuda"), torch.empty((), dtype=torch.int64, device="cuda"),
                torch.empty(2, 4, 64, 32, device="cuda")]
        gm = make_fx(attention_backwards)(*args)
    nodes = {n.name: n for n in gm.graph.nodes}
    calls = [n for n in gm.graph.nodes if n.target is aten._scaled_dot_product_efficient_attention_backward.default]
    assert len(calls) == 2
    assert not timeline.Inlining().fused_away(nodes["where"])
    assert [oplib.copied_expanded_inputs(c) for c in calls] == [[nodes["expand"]]] * 2


def test_on_a_cpu_an_attention_operand_broadcast_over_the_heads_is_copied_though_written():
    """``lowering.sdpa_constraint`` on CPU requires an operand's traced stride order where
    its last dimension is innermost, else the contiguous order, and copies an operand not so
    ordered: a key or value broadcast over the heads (multi-query), not a permuted slice of a
    projection (the usual ``(B, S, H, D) -> (B, H, S, D)``)."""
    copies = _compat.cpu_attention_copies_input
    strided = torch.empty_strided
    assert copies(strided((2, 4, 16, 8), (128, 0, 8, 1)))  # one head expanded over four
    assert copies(strided((2, 4, 16, 8), (768, 0, 48, 1)))  # the same, a slice of a fused projection
    assert copies(strided((2, 4, 16, 16), (0, 0, 16, 1)))  # a mask broadcast over batch and heads
    assert not copies(strided((2, 4, 16, 8), (512, 8, 32, 1)))  # heads permuted out of a projection
    assert not copies(strided((2, 4, 16, 8), (512, 128, 8, 1)))  # contiguous
    assert not copies(strided((2, 1, 16, 16), (256, 256, 16, 1)))  # a dimension of one is no broadcast


class _MultiQueryAttention(torch.nn.Module):
    """One attention block whose key and value are one head expanded over four (HF Falcon's
    multi-query attention, without transformers)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.kv, self.out = (torch.nn.Linear(dim, dim), torch.nn.Linear(dim, 2 * dim // heads),
                                     torch.nn.Linear(dim, dim))

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 1, self.head_dim).unbind(2)
        k, v = (t.transpose(1, 2).expand(b, self.heads, s, self.head_dim) for t in (k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1)).square().mean()


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_a_multi_query_attentions_broadcast_key_and_value_are_copied_for_each_call(fresh_inductor, budget):
    """Found on HF Falcon's least plan (transformers 5.25: 1,024 B over its prediction; 5.24
    built its key and value otherwise): Inductor copies the broadcast key and value dense for
    the attention and for its backward (``oplib.copied_expanded_inputs``), 4 KiB each here.
    Without the rule both plans measure 170,248 B against 145,672 predicted (torch 2.13)."""
    torch.manual_seed(0)
    model = _MultiQueryAttention()
    batch = (torch.randn(2, 64, 32, requires_grad=True),)
    measured, plan = _warm_step_and_plan(model, batch, {"memory_budget": budget})
    assert 0.99 * plan.predicted_peak_bytes <= measured <= plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)


@pytest.mark.parametrize("name, sizes, budget", [("t5", {}, 0.5), ("t5", {"layers": 4, "seq": 128, "batch": 4}, 0.0),
                                                 ("gpt_neox", {"use_cache": True}, 0.0),
                                                 ("gpt_neox", {"layers": 4, "dim": 128, "ffn": 344, "seq": 128, "batch": 4,
                                                               "vocab": 512, "use_cache": True}, 0.5),
                                                 pytest.param("falcon", {}, 0.0, marks=pytest.mark.skipif(
                                                     torch.__version__.startswith("2.11"),
                                                     reason="torch 2.11's Inductor corrupts the heap on this model "
                                                            "without fxremat too (plain torch.compile aborts on CPU: "
                                                            "free(): corrupted unsorted chunks)"))],
                         ids=["t5-0.5", "t5-4-blocks-least", "gpt_neox-use_cache-least", "gpt_neox-small-use_cache-0.5",
                              "falcon-least"])
def test_unseen_hugging_face_models_measure_their_predictions(fresh_inductor, name, sizes, budget):
    """Hugging Face models outside the zoo (``bench/frontier_models.py``'s ``UNSEEN``, tiny)
    measured over their predictions (T5 2.9% at 0.5, 1.1% least; GPT-NeoX with its default
    ``use_cache`` 4.7% least), each for what Inductor does that the timeline did not say:
    T5's recomputed layer norm, read by a weight gradient's matmul far down the backward,
    fused with kernels sharing its reads before the attention's backward
    (``fx_passes.mark_call_windows``); its softmax backward computed inside the position
    bias's gradient, lowered before the ``bmm`` that writes it (``Inlining.written_at_call``);
    its position buckets, read from no buffer, never written, and the bias gradients' zeros
    never made; GPT-NeoX's ``v`` copied for the attention and again for its backward
    (``oplib.copies_unwritten_inputs``), which Inductor's buffer reuse, bounded by the
    prediction, then filled to the budget. With 4 blocks of each and sequence 128, T5's least
    plan measured 31.5% over while a producer could be fused into its reader across library
    calls (``_compat._fuses_across_calls``): the fused kernel took in the recomputed layer norms
    of every decoder block, held through the backward. The small GPT-NeoX at 0.5 measured 0.92%
    over: its query-key-value gradient, a contiguous copy of a permuted concatenation, was
    predicted written over the concatenation, which Inductor does only for a buffer it reads at
    the index it writes (tests/test_timeline_layouts.py). Falcon's least plan measured 3.1%
    *under* its prediction (a least feasible budget set too high): the zeros its query-key-value
    gradient scatters into, read by scatters and pointwise ops alone, were counted; Inductor
    never makes them. With transformers 5.25, whose Falcon expands its one key and value head
    over the query heads, the least plan measured 1,024 B over: Inductor copies that broadcast
    for each attention call (``oplib.copied_expanded_inputs``; first blamed on a CPU without
    AVX-512, where the same bytes were measured). Each now measures its prediction."""
    frontier_models = bench_module("frontier_models")
    torch.manual_seed(0)
    built = frontier_models.build(name, "tiny", sizes)
    measured, plan = _warm_step_and_plan(built.model, built.batch, {"memory_budget": budget})
    assert 0.99 * plan.predicted_peak_bytes <= measured <= plan.predicted_peak_bytes, (
        measured, plan.predicted_peak_bytes)
