"""Every use of a private torch API goes through this module.

``torch._functorch`` and ``torch._inductor`` move between releases; keeping the
shims in one place means a new torch release is fixed here and nowhere else.
Checked on torch 2.9 (the floor: ``custom_partitioner_fn`` arrived after the
2.8 branch cut), 2.11 and 2.13.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import operator
import re
import threading
import warnings
from typing import Any, Callable, Iterator, NamedTuple, TypeVar

import torch
import torch.fx as fx

MIN_TORCH = (2, 9)


def torch_version() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    assert match, torch.__version__
    return int(match.group(1)), int(match.group(2))


def check_torch() -> None:
    """Fail early, with the reason, on a torch that lacks the hooks we build on."""
    import torch._inductor.config as inductor_config

    if torch_version() < MIN_TORCH or not hasattr(inductor_config, "custom_partitioner_fn"):
        raise RuntimeError(
            f"fxremat needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} "
            f"(for torch._inductor.config.custom_partitioner_fn); this is torch {torch.__version__}. "
            "Install a newer torch, e.g. `pip install torch==2.13.0`."
        )


check_torch()

# --- Inductor -----------------------------------------------------------------
import torch._inductor.inductor_prims  # noqa: E402  (registers prims.inductor_random & co)
from torch._inductor.compile_fx import compile_fx  # noqa: E402,F401
from torch._inductor.custom_graph_pass import CustomPartitionerFn  # noqa: E402,F401


def inductor_mode_options(mode: str) -> dict[str, Any]:
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def inductor_relayouts_convolutions(gm: fx.GraphModule) -> bool:
    """Will Inductor's layout optimization convert this graph's convolution inputs and
    weights to channels-last copies? (Its own per-graph heuristic.)"""
    from torch._inductor.graph import GraphLowering

    try:
        return bool(GraphLowering.decide_layout_opt(gm, is_inference=False))
    except Exception:  # the heuristic reads metadata a hand-made graph may lack
        return False


@functools.cache
def inductor_orders_convolution_backward_operands() -> bool:
    """Does Inductor hand a convolution backward its operands in the order the call computes
    in (torch 2.13: a lowering of its own, ``kernel/conv.py``'s
    ``convolution_backward_lowering``, asks for the gradient's stride order, channels-last
    after a channels-last input, and writes a copy where a value is laid out otherwise),
    rather than in the strides the traced graph gives them (torch 2.11: a fallback under
    ``constrain_to_fx_strides``), where ATen's convolution backward copies an operand laid
    out otherwise itself, while it runs, beside the buffer Inductor wrote (a group norm's
    input gradient, traced contiguous, before a channels-last convolution: one activation
    more at the call, 17% over the prediction of a two-layer CNN)?"""
    try:
        from torch._inductor import lowering
    except Exception:  # noqa: BLE001 - no Inductor: nothing is laid out by it
        return False
    constraint = lowering.maybe_layout_constraints(torch.ops.aten.convolution_backward.default)
    return constraint is not getattr(lowering, "constrain_to_fx_strides", None)


def inductor_convolution_backward_strides(args: tuple) -> tuple[tuple[int, ...] | None, ...]:
    """The strides of the gradient, input and weight Inductor hands a convolution backward
    (``args``: its positional arguments, the tensors fake or real, in the strides Inductor has
    them) in a graph without its layout optimization, where it orders them itself (torch 2.13,
    ``inductor_orders_convolution_backward_operands``): ``kernel/conv.py``'s
    ``convolution_backward_lowering`` asks the input and the gradient for the stride order of
    the weight's gradient as ATen's meta function lays it out, then the gradient and the weight
    for the input gradient's, and writes a copy where a value is ordered otherwise. Ties between
    equal strides follow Inductor's ``get_stride_order``: a depthwise weight (C, 1, kh, kw)
    laid out channels-last orders the others (N, H, C, W) innermost last, HF ConvNeXt's 7x7
    convolution (where oneDNN takes 65 KB of scratch, and 1.6 MB with every operand
    channels-last). None for an operand that is not a 4-d tensor. With the layout optimization
    every 4-d operand is channels-last (``require_channels_last``) and this is not asked."""
    from torch._inductor import ir

    grad, input_, weight = args[:3]
    mask = args[10] if len(args) > 10 else (True, True, True)
    rest = tuple(args[4:10])

    def ordered(t: torch.Tensor, order: list[int]) -> torch.Tensor:
        # ``Layout.is_stride_ordered``: dimensions of size 1 ignored, equal strides in either order
        kept = [i for i in range(t.dim()) if t.shape[i] != 1]
        by_rank = [t.stride(i) for i in sorted(kept, key=lambda i: order[i])]
        if all(a <= b for a, b in zip(by_rank, by_rank[1:])):
            return t
        strides = [int(s) for s in ir.FlexibleLayout.stride_ordered([int(n) for n in t.shape], order)]
        return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)

    def order_of(t: torch.Tensor) -> list[int]:
        return list(ir.get_stride_order([int(s) for s in t.stride()]))

    four_d = all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (grad, input_, weight))
    if four_d and mask[1]:
        _, weight_grad, _ = torch.ops.aten.convolution_backward(grad, input_, weight, None, *rest, (False, True, False))
        order = order_of(weight_grad)
        input_, grad = ordered(input_, order), ordered(grad, order)
    if four_d and mask[0]:
        input_grad, _, _ = torch.ops.aten.convolution_backward(grad, input_, weight, None, *rest, (True, False, False))
        order = order_of(input_grad)
        grad, weight = ordered(grad, order), ordered(weight, order)
    # (dense in their order: a view whose strides leave gaps is copied dense by oneDNN, which the
    # timeline counts apart, ``timeline._view_with_gaps``)
    return tuple(tuple(int(s) for s in ir.FlexibleLayout.stride_ordered([int(n) for n in t.shape], order_of(t)))
                 if isinstance(t, torch.Tensor) and t.dim() == 4 else None for t in (grad, input_, weight))


def inductor_calls_aten(target) -> bool:
    """Does Inductor run this op as a call of its ATen kernel (a fallback: ``cumsum`` on CPU, a
    flash attention) rather than generate code for it (``lowering.lowerings`` without being
    among ``lowering.fallbacks``: an index, a max-pool's prims, a scatter, a copy)? Ops with
    no lowering at all are called too. A library call of Inductor's own making (a convolution,
    a matmul) is neither: ask ``oplib.is_compute_intensive`` for those."""
    try:
        from torch._inductor import lowering
    except Exception:  # noqa: BLE001 - no Inductor here: everything runs as ATen calls
        return True
    return target in lowering.fallbacks or target not in lowering.lowerings


def inductor_prefers_channels_last(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes whose values Inductor's layout optimization lays out channels-last
    (``GraphLowering.find_nodes_prefer_channels_last``: a convolution's inputs and outputs,
    what they are computed from, and what is computed from them up to the last convolution).
    Empty where the method is missing."""
    import types

    from torch._inductor.graph import GraphLowering

    find = getattr(GraphLowering, "find_nodes_prefer_channels_last", None)
    if find is None:
        return set()
    return set(find(types.SimpleNamespace(module=gm)))


@functools.lru_cache(maxsize=None)
def inductor_hands_on_a_view_of_a_view() -> bool:
    """Does Inductor's layout optimization leave a view of a view of a convolution's input out
    of its channels-last set (``find_nodes_prefer_channels_last`` marks the input's readers,
    not theirs, and stops at the last convolution), so that a forward returning an input through
    two views after its last convolution hands it on as given (``fx_passes.return_inputs_as_given``)?
    Checked on a small graph; where the rule differs or the method is missing, inputs are
    returned as Inductor lays them out, and the timeline counts its copies."""
    from torch._inductor.graph import GraphLowering

    if getattr(GraphLowering, "find_nodes_prefer_channels_last", None) is None:
        return False
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    x.meta["val"], w.meta["val"] = torch.empty(2, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta")
    conv = graph.call_function(torch.ops.aten.convolution.default,
                               (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
    first = graph.call_function(torch.ops.aten.permute.default, (x, [0, 1, 2, 3]))
    second = graph.call_function(torch.ops.aten.permute.default, (first, [0, 1, 2, 3]))
    graph.output((conv, second))
    try:
        prefer = inductor_prefers_channels_last(fx.GraphModule(torch.nn.Module(), graph))
    except Exception:  # a rule that reads what this small graph lacks: do not rely on it
        return False
    return x in prefer and second not in prefer


def inductor_realize_thresholds(device_type: str) -> dict[str, int]:
    """Inductor's store-or-inline limits for a pointwise value (``GraphLowering.run_node``,
    ``StorageBox.should_realize_on_reuse``/``has_exceeded_max_reads``): a value read by
    several ops is written to memory when its inlined body loads more than ``reads``
    buffers or has more than ``ops`` ops; any value when it loads more than ``acc_reads``
    buffers or has more than ``ops`` ops and loads more than one buffer of more than one
    element (``has_exceeded_max_reads``, ``realize_hint``), or has more than ``max_ops`` ops
    (ops counted as ``inner_fn_opcount`` does: ``inductor_op_count``). Older torch lacks the CPU
    variants (defaults then as on the GPU)."""
    import torch._inductor.config as c

    cpu = device_type == "cpu"
    ops = c.realize_opcount_threshold
    if ops is None:
        ops = getattr(c, "realize_cpu_opcount_threshold", None) if cpu else None
        ops = ops if ops is not None else getattr(c, "_realize_opcount_threshold_default", 30)
    acc = getattr(c, "realize_acc_reads_threshold", None)
    if acc is None:
        acc = getattr(c, "realize_cpu_acc_reads_threshold", None) if cpu else None
        acc = acc if acc is not None else getattr(c, "_realize_acc_reads_threshold_default", 8)
    # (``GraphLowering.run_node`` writes a pointwise value past 100 ops or the op limit,
    # whichever is larger, whatever it loads: ``has_large_inner_fn(threshold=100)``)
    return {"reads": int(c.realize_reads_threshold), "ops": int(ops), "acc_reads": int(acc),
            "max_ops": max(100, int(ops))}


_OP_COUNTS: dict[Any, int | None] = {}


def inductor_op_count(target: Any, args: tuple, kwargs: dict, val: Any) -> int | None:
    """The ops Inductor's lowering of ``target(*args, **kwargs)`` computes in its body beyond
    loading its inputs, counted as its store-or-inline rule counts them
    (``Loops.inner_fn_opcount``: constants, index expressions, dtype conversions, each op
    once), or None where it lowers to no pointwise body of its own (a view, a reduction, a
    library call) or cannot be lowered alone. ``args`` hold fake tensors where the graph has
    values; ``val`` is the op's (fake) result. Asked of Inductor by lowering the op alone in a one-node graph (a few ms),
    memoized by the op, its arguments' shapes, strides and dtypes: a model's layers share
    their answers. A ``slice_scatter`` is 5 ops, a rotary embedding's cosine of positions
    from ``iota`` 3, a ``mul`` by a scalar 2, a ``clone`` 0."""
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    return _remembered(_OP_COUNTS, lambda: (target, str(spec), tuple(_value_key(x) for x in leaves)),
                       lambda: _lowered_op_count(target, leaves, spec, val))


def _remembered(cache: dict, key: Callable[[], Any], lower: Callable[[], int | None]) -> int | None:
    """``lower()`` remembered in ``cache`` under ``key()``; None, and remembered so, where the
    key cannot be made (a value whose strides cannot be read: sparse, nested) or Inductor
    cannot lower the op or body alone (a symbolic size it cannot read)."""
    try:
        found = key()
    except Exception:
        return None
    if found not in cache:
        try:
            cache[found] = lower()
        except Exception:
            cache[found] = None
    return cache[found]


def _lowered_op_count(target: Any, leaves: list, spec: Any, val: Any) -> int | None:
    from torch._guards import detect_fake_mode

    graph = fx.Graph()
    example = [x for x in leaves if isinstance(x, torch.Tensor)]
    placeholders = iter([graph.placeholder(f"input_{i}") for i in range(len(example))])
    for p, x in zip(graph.nodes, example):
        p.meta["val"] = x
    args, kwargs = torch.utils._pytree.tree_unflatten(
        [next(placeholders) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
    node = graph.call_function(target, tuple(args), dict(kwargs))
    node.meta["val"] = val
    graph.output(node)
    fake = detect_fake_mode(example)
    counted = None if fake is None else _lowered_output_count(graph, example, fake)
    return None if counted is None else counted.num_ops - len(counted.read_buffers)


def _lowered_output_count(graph: fx.Graph, example: list, fake: Any) -> Any:
    """``inner_fn_opcount()`` of the pointwise value ``graph`` outputs, lowered by Inductor on
    ``example`` (fake) inputs; None where its output is no pointwise body of its own."""
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    with V.set_fake_mode(fake):
        lowering = GraphLowering(make_graph_module({}, graph), example_inputs=example, shape_env=fake.shape_env)
        with V.set_graph_handler(lowering):
            lowering.run(*example)
            box = lowering.graph_outputs[0]
            while not isinstance(box, ir.ComputedBuffer):  # (the output, written)
                box = getattr(box, "data", None)
                if box is None:
                    return None  # a view of an input: no body
            if type(box.data) is not ir.Pointwise:
                return None
            return box.data.inner_fn_opcount()


_BODY_COUNTS: dict[Any, int | None] = {}


def inductor_body_op_count(body: list, inputs: list, channels_last: Any = ()) -> int | None:
    """Inductor's op count (``Loops.inner_fn_opcount().num_ops``, loads included) of the value
    computed by ``body`` (graph nodes in order, the value last) with every other node inlined
    into it and ``inputs`` (the nodes it reads, each a buffer) loaded: the count its
    store-or-inline rule compares with ``realize_opcount_threshold``. Asked of Inductor by
    lowering those nodes alone (a few ms), memoized by their ops and their inputs' shapes,
    strides and dtypes; None where that cannot be done (the value lowers to no pointwise
    body, an op needs what a lone graph lacks). Each op counted once as Inductor's CSE counts
    it: constants, index expressions and index-independent ops of an unrolled sum shared.
    Each input is given contiguous strides, those in ``channels_last`` channels-last ones: a
    buffer Inductor makes has no fixed layout while its readers are lowered, and a lowering
    that reads layouts (torch 2.11's max-pool backward asks for a channels-last result where
    an input is fixed so) must see what it sees in the whole graph."""
    layouts = [x in channels_last for x in inputs]
    where = {x: i for i, x in enumerate(inputs)}
    where.update({x: len(inputs) + j for j, x in enumerate(body)})
    calls = [torch.utils._pytree.tree_flatten((x.args, x.kwargs)) for x in body]

    def key() -> tuple:  # (fails on a node read that is neither in the body nor an input)
        return tuple([(_value_key(x.meta.get("val")), cl) for x, cl in zip(inputs, layouts)] + [
            (x.target, str(spec), tuple(("node", where[v]) if v in where else _value_key(v) for v in leaves),
             _value_key(x.meta.get("val"))) for x, (leaves, spec) in zip(body, calls)])

    return _remembered(_BODY_COUNTS, key, lambda: _lowered_body_count(body, inputs, layouts, calls, where))


def _laid_out(v: torch.Tensor, channels_last: bool) -> torch.Tensor:
    fmt = torch.channels_last if channels_last and v.dim() == 4 else (
        torch.channels_last_3d if channels_last and v.dim() == 5 else torch.contiguous_format)
    return torch.empty(v.shape, dtype=v.dtype, device=v.device).to(memory_format=fmt)


def _value_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (tuple(map(str, v.shape)), tuple(map(str, v.stride())), v.dtype, v.device.type)
    return (type(v).__name__, str(v))


def _lowered_body_count(body: list, inputs: list, layouts: list, calls: list, where: dict) -> int | None:
    from torch._guards import detect_fake_mode

    values = [x.meta.get("val") for x in inputs]
    fake = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)] + [body[-1].meta.get("val")])
    if fake is None:
        return None
    with fake:
        example = [_laid_out(v, cl) if isinstance(v, torch.Tensor) else v for v, cl in zip(values, layouts)]
    graph = fx.Graph()
    made = []
    for i, v in enumerate(example):
        made.append(graph.placeholder(f"input_{i}"))
        made[-1].meta["val"] = v
    for x, (leaves, spec) in zip(body, calls):
        args, kwargs = torch.utils._pytree.tree_unflatten(
            [made[where[v]] if v in where else v for v in leaves], spec)
        made.append(graph.call_function(x.target, tuple(args), dict(kwargs)))
        made[-1].meta["val"] = x.meta.get("val")
    graph.output(made[-1])
    counted = _lowered_output_count(graph, example, fake)
    return None if counted is None else counted.num_ops


@functools.cache
def inductor_tells_loop_reuse_apart() -> bool:
    """Does this torch's Inductor tell a broadcast's loop reuse from graph fan-out
    (``StorageBox.mark_reuse(..., graph_reuse=)``, torch 2.13; not 2.11): a broadcast value
    is then written for a heavy or long body only, not for loading many buffers."""
    from torch._inductor import ir

    return "graph_reuse" in inspect.signature(ir.StorageBox.mark_reuse).parameters


@functools.cache
def backward_frees_incoming_gradients() -> bool:
    """Does a compiled backward free each incoming gradient at its last use: autograd's
    engine hands AOTAutograd's backward its gradients in a list the backward empties
    (``Function.boxed_grads_call``, ``BackwardCFunction.apply_boxed``: pytorch#177837, March
    2026, in torch 2.13), not in a tuple it holds until the backward returns (torch 2.11, not
    checked on it here). Measured on 2.13, CPU, Inductor and op by op: Hugging Face GPT-2's
    logits gradient (1 MiB) freed after the head's matmuls."""
    from torch.autograd.function import BackwardCFunction

    return callable(getattr(BackwardCFunction, "apply_boxed", None))


@functools.cache
def inductor_keeps_half_addmm_fused() -> bool:
    """Does Inductor keep a GPU ``addmm`` in float16/bfloat16 fused, where it splits a float32
    one into ``mm`` and a pointwise add (``config.keep_addmm_fused_for_half_dtypes``: True on
    2.13; a torch without the setting splits every dtype)?"""
    from torch._inductor import config

    return bool(getattr(config, "keep_addmm_fused_for_half_dtypes", False))


@functools.cache
def inductor_heavy_ops_on_cpu() -> frozenset[str]:
    """The ops whose use makes Inductor write a CPU value read more than once
    (``StorageBox.should_realize_on_reuse``'s ``heavy_ops``: exp and sigmoid on torch 2.11;
    logarithms and tanh too on 2.13), read from the installed torch's source."""
    from torch._inductor import ir

    try:
        source = inspect.getsource(ir.StorageBox.should_realize_on_reuse)
        found = re.search(r"heavy_ops\s*=\s*\[([^\]]*)\]", source)
        if found:
            return frozenset(re.findall(r"[\"']([\w.]+)[\"']", found.group(1)))
    except (OSError, TypeError):
        pass
    return frozenset({"exp", "sigmoid"})  # the list since torch 2.1


@functools.cache
def attention_backward_copies_broadcast_bias() -> bool:
    """Does Inductor copy a broadcast attention bias dense for CUDA's efficient attention
    backward (``oplib.copied_expanded_inputs``)? Its ``lowering.sdpa_constraint`` passes an
    aligned written tensor through as it is only when it can read its strides
    (``is_aligned_realized_tensor``); a broadcast of a value computed in the graph is an
    ``ExpandView``, which has none (``IRNode.get_stride`` raises), so it is fixed to a
    contiguous stride order: a dense copy. Measured on an H200 with torch 2.11 (a Hugging
    Face causal mask's copy for each layer's attention backward); torch 2.13's constraint and
    views are the same."""
    from torch._inductor import ir

    return getattr(ir.ExpandView, "get_stride", None) is getattr(ir.IRNode, "get_stride", None)


def cpu_attention_copies_input(val: torch.Tensor) -> bool:
    """Does Inductor copy this tensor dense for a CPU attention call even when its storage is
    written? ``lowering.sdpa_constraint`` requires each operand's traced stride order
    (``ir.get_stride_order``) where that order has the last dimension innermost, and the
    contiguous order otherwise (``ExternKernel.require_stride_order``, which copies an operand
    not so ordered). A broadcast (a stride 0 in a dimension longer than one) puts a dimension
    inside the last: HF Falcon's multi-query key and value, one head expanded over four, are
    copied as four heads for the attention and again for its backward (two 4 KiB copies at
    the measured peak of its least plan, transformers 5.25; checked on torch 2.13)."""
    from torch._inductor import ir

    if val.numel() <= 1 or val.dim() == 0:
        return False
    order = list(ir.get_stride_order([int(st) for st in val.stride()]))
    if order[-1] != 0:
        order = list(reversed(range(val.dim())))
    # ``Layout.is_stride_ordered``: dimensions of size one ignored, equal strides in order
    strides = [int(st) for _, st in sorted((order[i], val.stride()[i]) for i in range(val.dim())
                                           if int(val.shape[i]) != 1)]  # innermost first
    return any(left > right for left, right in zip(strides, strides[1:]))


def inductor_writes_every_cat(device_type: str) -> bool:
    """Does Inductor write every concatenation to a buffer of its own on this device
    (``lowering.cat``: on CPU always a ``ConcatKernel``, whose pointwise inputs are computed
    into its slices; on GPU often a pointwise kernel inlined into its readers)?"""
    import torch._inductor.config as c

    return device_type == "cpu" and not c.force_pointwise_cat


def inductor_falls_back(node) -> bool:
    """Does Inductor run this op as its ATen kernel (``lowering.fallbacks``: flash
    attention's CPU kernels, ``convolution_backward``, ...; a max-pool backward its lowering
    hands to ATen, ``inductor_generates_max_pool_backward``) rather than code of its own?"""
    if node.op != "call_function":
        return False
    from torch._inductor import lowering

    if node.target is torch.ops.aten.max_pool2d_with_indices_backward.default and node.target in lowering.lowerings:
        return not inductor_generates_max_pool_backward(node)
    return node.target in lowering.fallbacks


# Inductor's own max-pool backward kernel gives up above this many window positions per
# output element (``lowering.py::max_pool2d_with_indices_backward``: "Kernel size too big").
_MAX_POOL_BACKWARD_WINDOW = 25


def inductor_generates_max_pool_backward(node) -> bool:
    """Does Inductor compute this ``max_pool2d_with_indices_backward`` in a kernel of its own
    (``max_pool_backward_window``)?"""
    return max_pool_backward_window(node) is not None


def max_pool_backward_window(node) -> int | None:
    """How many window positions Inductor's own kernel for this ``max_pool2d_with_indices_backward``
    visits per input element, loading the gradient and the indices at each; None where it
    computes none. Inductor lowers the op as a pointwise value over the input's positions
    (``lowering.py``; it reads the pooled input for its layout only, and asks the result
    channels-last where that input or the gradient is a buffer laid out so) where the op
    reaches it: torch 2.11's decompositions leave it, 2.13's turn it into a scatter-add first.
    Not with a dilation or a window of more than ``_MAX_POOL_BACKWARD_WINDOW`` positions (ATen's
    kernel then), nor where it is no lowering of Inductor's."""
    target = torch.ops.aten.max_pool2d_with_indices_backward.default
    if getattr(node, "op", None) != "call_function" or node.target is not target:
        return None
    from torch._inductor import lowering

    if target not in lowering.lowerings or target in lowering.fallbacks:
        return None
    kernel, stride, dilation = node.args[2], node.args[3] or node.args[2], node.args[5]
    if isinstance(dilation, int):
        dilation = [dilation, dilation]
    if any(d != 1 for d in dilation) or len(kernel) != 2 or len(stride) != 2:
        return None

    def window(k: int, s: int) -> int:  # as the lowering counts it (``FloorDiv``: Python's //)
        return max(max(h // s - max(0, (h - k) // s), 1) for h in range(2 * k))

    positions = window(kernel[0], stride[0]) * window(kernel[1], stride[1])
    return positions if positions <= _MAX_POOL_BACKWARD_WINDOW else None


def inductor_scatters_in_aten(node) -> bool:
    """Does Inductor run this scatter-add (``scatter_add``, ``scatter_reduce``) as ATen's kernel,
    an extern call (``lowering.scatter_fallback``): on CPU a summing scatter with more than one
    thread (``cpp.fallback_scatter_reduce_sum``), a max-pool's backward among them? Asked of
    Inductor's own rule (``utils.use_scatter_fallback``)."""
    if node.op != "call_function" or node.target not in _scatters():
        return False
    aten = torch.ops.aten
    reduce = "sum" if node.target is aten.scatter_add.default else (
        node.args[4] if len(node.args) > 4 else node.kwargs.get("reduce"))
    target, src = node.args[0], node.args[3] if len(node.args) > 3 else node.kwargs.get("src")
    # a torch.fx node or a light copy of one (``lite``): read through ``meta``
    target_val = target.meta.get("val") if hasattr(target, "meta") else None
    src_val = src.meta.get("val") if hasattr(src, "meta") else None
    if not isinstance(target_val, torch.Tensor):
        return False
    try:
        from torch._inductor.utils import use_scatter_fallback

        src_is_tensor = isinstance(src_val, torch.Tensor)
        return bool(use_scatter_fallback(aten.scatter_reduce_.two, reduce, target_val.dtype,
                                         src_val.dtype if src_is_tensor else type(src),
                                         src_val.device.type if src_is_tensor else "not impl", src_is_tensor))
    except (ImportError, TypeError):  # another torch's signature: a kernel of Inductor's own
        return False


@functools.cache
def _scatters() -> tuple:
    return torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_reduce.two


def inductor_keeps_node_order() -> dict[str, bool]:
    """Inductor options that keep the scheduler in the graph's node order (after fusion):
    ``reorder_for_peak_memory`` off where this torch has it."""
    return {"reorder_for_peak_memory": False} if "reorder_for_peak_memory" in inductor_config_keys() else {}


def inductor_config_keys() -> set[str]:
    import torch._inductor.config as inductor_config

    return set(inductor_config._config.keys())  # type: ignore[attr-defined]


# --- AOTAutograd joint-graph conventions -----------------------------------------
from torch._functorch import partitioners as _partitioners  # noqa: E402
from torch._functorch._aot_autograd.utils import (  # noqa: E402,F401
    _is_bwd_seed_offset as is_bwd_seed_offset,
    _is_fwd_seed_offset as is_fwd_seed_offset,
    _is_primal as is_primal,
    _is_tangent as is_tangent,
)
from torch.fx.experimental.proxy_tensor import is_sym_node  # noqa: E402,F401
from torch.utils.checkpoint import CheckpointPolicy  # noqa: E402

must_be_in_backward = _partitioners._must_be_in_backward
# Older torch's extractor has no forward placement rule (nothing must be in the forward).
must_be_in_forward = getattr(_partitioners, "_must_be_in_forward", lambda node: False)


def dead_code_elimination_keeps_random() -> bool:
    """Whether ``torch.fx.Graph.eliminate_dead_code`` here keeps unread random ops
    (``nondeterministic_seeded``: a dead SDPA, dropout). Inside Dynamo's tracing context
    (every real compile) it removes them unless Inductor's ``fallback_random`` is set;
    outside it, it keeps them."""
    if torch._guards.TracingContext.try_get() is not None:
        return bool(torch._inductor.config.fallback_random)
    return True


def survives_dead_code_elimination(node: fx.Node, keeps_random: bool | None = None) -> bool:
    """Whether ``torch.fx.Graph.eliminate_dead_code`` keeps ``node`` unread: impure ops do
    (``keeps_random``: ``dead_code_elimination_keeps_random()`` unless given). The light
    graphs and Rotor's emitter ask this, so they drop exactly what torch's extractor drops."""
    if node.op in ("placeholder", "output"):
        return True
    if node.op != "call_function":
        return False
    if keeps_random is None:
        keeps_random = dead_code_elimination_keeps_random()
    return node.is_impure(keeps_random)


def fwd_bwd_outputs(joint: fx.GraphModule, num_fwd_outputs: int) -> tuple[list, list]:
    """The joint graph's forward outputs and backward outputs (gradients)."""
    result = _partitioners._extract_fwd_bwd_outputs(joint, num_fwd_outputs=num_fwd_outputs)
    return list(result[0]), list(result[1])  # 2.9 returns 2 lists, later 4 (with descs)


def force_save_special_ops(joint: fx.GraphModule) -> None:
    """Mark collectives, effectful ops and backward-mutation sources MUST_SAVE, as torch's
    own partitioners do: recomputing them would repeat a side effect."""
    from torch._functorch import config as functorch_config

    if not getattr(functorch_config, "unsafe_allow_optimization_of_collectives", False):
        getattr(_partitioners, "force_save_collectives", lambda gm: None)(joint)
    getattr(_partitioners, "force_save_effectful_ops", lambda gm: None)(joint)
    getattr(_partitioners, "force_save_bw_mutation_src", lambda gm: None)(joint)


def recompute_policy(node: fx.Node) -> CheckpointPolicy | None:
    """The torch.utils.checkpoint policy recorded on a node, if any."""
    return node.meta.get("recompute", None)


def is_must_save(node: fx.Node) -> bool:
    return recompute_policy(node) == CheckpointPolicy.MUST_SAVE


def is_must_recompute(node: fx.Node) -> bool:
    return recompute_policy(node) == CheckpointPolicy.MUST_RECOMPUTE


def is_prefer_policy(node: fx.Node) -> bool:
    return recompute_policy(node) in (CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.PREFER_SAVE)


def is_opaque_node(node: fx.Node) -> bool:
    fn = getattr(_partitioners, "is_opaque_node", None)
    return bool(fn and fn(node))


_EXTRACT_PARAMS = inspect.signature(_partitioners._extract_fwd_bwd_modules).parameters


def extract_fwd_bwd_modules(
    joint: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    *,
    num_fwd_outputs: int,
    static_lifetime_input_nodes: Any = None,
    backward_template: bool = False,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Build the forward and backward GraphModules for a chosen saved set.

    The forward returns ``outputs + saved``; the backward takes ``saved + tangents``
    and computes everything else it needs (the recomputation). The calling
    convention (order of saved tensors, symints, opaque objects, seeds, backward
    state) belongs to AOTAutograd and changes between releases, so we let torch's
    own extractor lay it out rather than copy it.

    ``backward_template``: the caller writes the backward's body itself (Rotor's and the
    DAG solvers' plans), so the backward returned is only its inputs -- every saved value
    kept, even one torch's own backward would not read -- and an empty output. Torch's
    extractor copies the whole backward twice to get there, most of a staged plan's
    planning time; here it only lays out the inputs.
    """
    kwargs: dict[str, Any] = {"num_fwd_outputs": num_fwd_outputs}
    if backward_template:
        import unittest.mock

        real_remove, real_extract = _partitioners._remove_by_name, _partitioners._extract_graph_with_inputs_outputs
        keep = {n.name for n in saved_values} | {n.name for n in saved_sym_nodes}

        def inputs_only(joint_graph, inputs, outputs, outputs_descs, subgraph=None, *args, **kw):
            if subgraph != "backward":
                return real_extract(joint_graph, inputs, outputs, outputs_descs, subgraph, *args, **kw)
            graph = fx.Graph()
            for node in inputs:  # as torch's extractor lays out its placeholders
                graph.placeholder(node.name).meta = node.meta
            graph.output(())
            return graph

        with unittest.mock.patch.object(
                _partitioners, "_remove_by_name", lambda values, name: None if name in keep else real_remove(values, name)
        ), unittest.mock.patch.object(_partitioners, "_extract_graph_with_inputs_outputs", inputs_only):
            return extract_fwd_bwd_modules(joint, saved_values, saved_sym_nodes, num_fwd_outputs=num_fwd_outputs,
                                           static_lifetime_input_nodes=static_lifetime_input_nodes)
    if "saved_opaque_nodes" in _EXTRACT_PARAMS:
        opaque = [n for n in saved_values if is_opaque_node(n)]
        saved_values = [n for n in saved_values if not is_opaque_node(n)]
        kwargs["saved_opaque_nodes"] = opaque
    if "static_lifetime_input_nodes" in _EXTRACT_PARAMS:
        kwargs["static_lifetime_input_nodes"] = static_lifetime_input_nodes
    return _partitioners._extract_fwd_bwd_modules(
        joint, saved_values, saved_sym_nodes=saved_sym_nodes, **kwargs
    )


def cse(joint: fx.GraphModule) -> fx.GraphModule:
    """Common-subexpression elimination, when functorch's config asks for it (default on)."""
    from torch._functorch import config as functorch_config
    from torch._functorch.compile_utils import fx_graph_cse

    if functorch_config.cse:
        joint.graph = fx_graph_cse(joint.graph)
    return joint


def default_partition_fn():
    """PyTorch's own partitioner, for side-by-side comparisons (never used by fxremat's plans)."""
    return _partitioners.min_cut_rematerialization_partition


def save_all_partition_fn():
    """PyTorch's partitioner without recomputation (saves what autograd would), for comparisons."""
    return _partitioners.default_partition


def activation_memory_budget(budget: float):
    """Context manager: PyTorch's own partitioner under ``activation_memory_budget`` (comparisons)."""
    from torch._functorch import config as functorch_config

    return functorch_config.patch(activation_memory_budget=budget)


def inductor_decompositions():
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def shape_env_values(env) -> dict:
    """A shape environment's size symbols with a value at the traced sizes (backed ones):
    ``backed_var_to_val`` on torch 2.13 (``var_to_val`` is deprecated there), ``var_to_val`` before."""
    values = getattr(env, "backed_var_to_val", None)
    return values if values is not None else env.var_to_val


def symbolic_max(*exprs):
    """The largest of size expressions, as a shape environment takes it: torch's own ``Max``
    (``torch.utils._sympy.functions``), whose construction does not compare every pair of
    arguments under sympy's assumptions as ``sympy.Max`` does (a dynamic plan's guard at a
    fraction took 40 of a test's 92 seconds in those comparisons); ``sympy.Max`` where torch
    has none."""
    try:
        from torch.utils._sympy.functions import Max
    except ImportError:
        import sympy

        Max = sympy.Max
    return Max(*exprs)


def size_hint(env, expr) -> int | None:
    """A size expression's value at the traced sizes, or None where it has a data-dependent
    (unbacked) symbol. ``ShapeEnv.size_hint`` is deprecated on torch 2.13 for
    ``guarding_hint_or_throw``/``optimization_hint``, which raise or guess there; it still works."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return env.size_hint(expr, allow_none=True)


def unbacked_fallback() -> int:
    """The size Inductor assumes for a data-dependent size it knows nothing of."""
    from torch._inductor import config as inductor_config

    return int(getattr(inductor_config, "unbacked_symint_fallback", 8192))


def autograd_cache_disabled():
    """Context manager: no AOTAutograd cache lookups, so the partitioner runs on every compile."""
    from torch._functorch import config as functorch_config

    return functorch_config.patch(enable_autograd_cache=False)


# --- Profiler -------------------------------------------------------------------


def partition_context() -> Callable[[], contextlib.AbstractContextManager]:
    """The contexts a partition runs in, to enter again later: Dynamo's tracing context (dead
    code elimination drops unread random ops inside it: ``dead_code_elimination_keeps_random``)
    and Inductor's config as it is now (its store-or-inline thresholds, ``force_pointwise_cat``,
    ``fallback_random`` and a compile's patches, which the timeline reads)."""
    import torch._inductor.config as inductor_config

    tracing = torch._guards.TracingContext.try_get()
    config = inductor_config.get_config_copy()

    @contextlib.contextmanager
    def entered():
        with (torch._guards.tracing(tracing) if tracing is not None else contextlib.nullcontext()), \
                inductor_config.patch(config):
            yield

    return entered


def cpu_allocation_events(prof, not_counted: tuple[str, ...] = ()) -> list[tuple[int, int, int, bool]]:
    """``(start_ns, address, bytes, counted)`` of every CPU allocation (bytes > 0) and free
    (bytes < 0) that a stopped ``torch.profiler.profile(profile_memory=True)``
    recorded, walked in the profiler's event-tree order. The public
    ``prof.events()`` has no addresses, and lists as ``"[memory]"`` only the events
    outside every operator. ``counted`` is False for an allocation inside a scope (an operator
    or ``record_function``) whose name starts with one of ``not_counted``; frees are all
    counted (a free of a block left out is one of an unknown block)."""
    from torch._C._profiler import _EventType

    def walk(nodes, inside: bool):
        for node in nodes:
            if node.tag == _EventType.Allocation:
                if node.extra_fields.device.type == "cpu":
                    size = node.extra_fields.alloc_size
                    yield node.start_time_ns, node.extra_fields.ptr, size, not (inside and size > 0)
                continue
            yield from walk(node.children, inside or (bool(not_counted) and node.name.startswith(not_counted)))

    return list(walk(prof.profiler.kineto_results.experimental_event_tree(), False))


# --- Inductor scheduler: keep fusion inside a recomputation segment -------------

SEGMENT_KEY = "fxremat_segment"


def _origins(sub) -> Any:
    """The FX nodes one kernel of a scheduler node was lowered from (Inductor's
    ``origins``): where fxremat's marks on the graph it emitted are read back."""
    return getattr(getattr(sub, "node", None), "origins", None) or ()


def _segments(snode) -> set[int]:
    """The fxremat segments (``node.meta[SEGMENT_KEY]``) of the FX nodes a scheduler
    node was lowered from; empty for graphs fxremat did not emit."""
    found: set[int] = set()
    for sub in snode.get_nodes():
        for origin in _origins(sub):
            segment = origin.meta.get(SEGMENT_KEY)
            if segment is not None:
                found.add(segment)
    return found


def _fuses_across_segments(node1, node2) -> bool:
    s1, s2 = _segments(node1), _segments(node2)
    return bool(s1) and bool(s2) and s1 != s2


CALL_WINDOW_KEY = "fxremat_call_window"


def _call_windows(snode) -> set[int]:
    """Where each kernel fused into a scheduler node stands among the library calls: the
    latest call window (``node.meta[CALL_WINDOW_KEY]``) of the FX nodes it was lowered from
    (the values inlined into it come from earlier ones); empty for graphs fxremat did not emit."""
    found: set[int] = set()
    for sub in snode.get_nodes():
        windows = [origin.meta[CALL_WINDOW_KEY] for origin in _origins(sub) if CALL_WINDOW_KEY in origin.meta]
        if windows:
            found.add(max(windows))
    return found


def _fuses_across_calls(node1, node2) -> bool:
    """Would fusing these kernels join kernels from different stretches between library
    calls? Inductor runs a fused kernel where its earliest member stands, so the later
    members are computed early and what they write stays alive across the calls between,
    which fxremat's timeline (each kernel where its op stands) does not count. Side by side
    (two kernels sharing reads, not data: a Llama's RMSNorm weight gradients joined at the end
    of the backward) or along the data (a value of one stretch fused into its reader in a later
    one, which then takes in kernels of the first that share its reads: a T5's recomputed
    layer norms of four decoder blocks computed in one kernel at the first and held through
    the backward), the same."""
    w1, w2 = _call_windows(node1), _call_windows(node2)
    if not w1 or not w2:
        return False
    return len(w1 | w2) > 1


class ScheduledNode(NamedTuple):
    segments: set[int]  # fxremat segments of the FX nodes it was lowered from
    writes: set[str]  # buffer names
    reads: set[str]


@contextlib.contextmanager
def scheduled_nodes():
    """Yields a list that gets, for each graph Inductor generates code for within the
    context, its scheduler nodes (``ScheduledNode``) in the order they will run (after
    fusion and every reordering pass). Tests check with it that Inductor keeps the order
    fxremat emitted."""
    import unittest.mock

    from torch._inductor import scheduler

    graphs: list[list[ScheduledNode]] = []
    original = scheduler.Scheduler.codegen

    def codegen(self, *args, **kwargs):
        graphs.append([ScheduledNode(_segments(n), set(n.get_buffer_names()),
                                     {dep.name for dep in n.read_writes.reads}) for n in self.nodes])
        return original(self, *args, **kwargs)

    with unittest.mock.patch.object(scheduler.Scheduler, "codegen", codegen):
        yield graphs


_fusion_guard_installed = False


def install_segment_fusion_guard() -> None:
    """Refuse Inductor fusions of nodes from different segments of a Rotor backward.

    Inductor places a fused node at the position of its earliest member, so fusing
    a recomputation with an unrelated kernel of an earlier segment (the C++
    backend's horizontal fusion does this freely; GPU backends when the two share a
    read) runs the recomputation early and keeps its output alive across segments
    the plan meant it not to span: measured 28% over budget on a 4-block
    transformer. Nor does it join kernels from either side of a library call
    (``_fuses_across_calls``): a Hugging Face Llama's four RMSNorm weight gradients, each
    summing over the saved residual-stream terms, were fused into one kernel at the end of
    the backward, and every weight gradient's matmul after it, holding seven gradients and
    the MLP's saved values to the end (a tiny Llama 11.9% over its prediction, Inductor's
    buffer reuse holding more on top); a small T5's least plan measured 27% over its
    prediction while fusions along the data were let across calls (the recomputed layer norms
    of every decoder block joined in one kernel at the start of the backward). Graphs without
    the marks (everything fxremat did not emit) are untouched.
    Idempotent."""
    global _fusion_guard_installed
    if _fusion_guard_installed:
        return
    from torch._inductor import scheduler

    name = "_can_fuse" if hasattr(scheduler.Scheduler, "_can_fuse") else "can_fuse"
    original = getattr(scheduler.Scheduler, name)

    @functools.wraps(original)
    def guarded(self, node1, node2, *args, **kwargs):
        if _fuses_across_segments(node1, node2) or _fuses_across_calls(node1, node2):
            return False
        return original(self, node1, node2, *args, **kwargs)

    setattr(scheduler.Scheduler, name, guarded)
    _fusion_guard_installed = True


# --- Inductor's buffer reuse, bounded by fxremat's predicted timeline ---------------

LIVE_BYTES_KEY = "fxremat_live_bytes"  # node.meta: (predicted live bytes while it runs, predicted peak)


def planned_reuse_supported() -> bool:
    """Does this Inductor decide its buffer reuse with a per-kernel peak estimate
    (``EfficientPeakEstimate``, ``AllocateLine.should_reuse_buffer``) that
    ``install_planned_reuse_bound`` can replace? Where not, fxremat keeps reuse off."""
    try:
        from torch._inductor.codegen import segmented_tree, wrapper
    except ImportError:
        return False
    return (hasattr(wrapper, "EfficientPeakEstimate") and hasattr(wrapper.AllocateLine, "should_reuse_buffer")
            and hasattr(segmented_tree, "SegmentedTree"))


def _predicted_levels(snodes) -> tuple[list[int], int] | None:
    """Per scheduler node, the predicted live bytes while it runs (the most over the FX
    nodes it was lowered from), and the predicted peak; None for a graph fxremat did
    not plan. A kernel none of whose FX nodes has a prediction (one a post-grad pass
    made) counts as at the peak: no buffer is held across it."""
    levels: list[int | None] = []
    peak = None
    for snode in snodes:
        level = None
        for sub in snode.get_nodes():
            for origin in _origins(sub):
                found = origin.meta.get(LIVE_BYTES_KEY)
                if found is not None:
                    level = found[0] if level is None else max(level, found[0])
                    peak = found[1]
        levels.append(level)
    if peak is None:
        return None
    return [peak if level is None else level for level in levels], peak


_planned_reuse_installed = False


def install_planned_reuse_bound() -> None:
    """Let Inductor reuse a dead buffer for a later one of the same size only where
    holding it in between keeps fxremat's predicted live bytes within the predicted peak.

    Inductor's wrapper (``allow_buffer_reuse``) keeps a freed buffer for a later
    allocation of the same size when the hold does not raise its own estimate of the
    graph's peak; that estimate is not fxremat's (HF Llama's least-memory plan measured
    10.6% over the prediction with it). Reuse itself matters on CPU: without it every
    64 MiB attention-score buffer is a fresh ``mmap`` whose pages fault in on each
    step (issue transformer at per-block checkpointing's memory: 650k-750k minor faults
    and 1.25-1.4 s of system time a step, against 460k-540k and 0.86-0.92 s with reuse
    bounded as below). So the estimate Inductor consults is swapped for fxremat's: per
    kernel, the predicted live bytes (``LIVE_BYTES_KEY``, set by the partitioner on the
    graphs it returns); the bound, the predicted peak. The measured peak then stays the
    predicted one. Graphs without the marks keep Inductor's own estimate. Idempotent."""
    global _planned_reuse_installed
    if _planned_reuse_installed:
        return
    from torch._inductor.codegen import wrapper
    from torch._inductor.codegen.segmented_tree import SegmentedTree
    from torch._inductor.virtualized import V

    original = wrapper.EfficientPeakEstimate.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        planned = _predicted_levels(V.graph.scheduler.nodes)
        if planned is not None:
            levels, peak = planned
            self.overall_peak_memory = peak
            self.segmented_tree = SegmentedTree(levels, operator.add, max, 0)

    wrapper.EfficientPeakEstimate.__init__ = init
    _planned_reuse_installed = True


# --- Dynamo: compile-phase timings (benchmarks) ------------------------------------


def compile_phase_seconds() -> dict[str, list[float]]:
    """Seconds of each compile phase timed by Dynamo (``dynamo_timed``) in this process so
    far, one entry per call. The partitioner's key is ``min_cut_rematerialization_partition``
    for PyTorch's own, else the custom partitioner's class name (``FxrematPartitioner``)."""
    from torch._dynamo import utils as dynamo_utils

    return {key: list(values) for key, values in dynamo_utils.compilation_time_metrics.items()}


def make_graph_module(root: Any, graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule whose Python code is generated on first use, not now (torch's
    ``_LazyGraphModule``): planning builds many candidate graphs and runs few."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    return _LazyGraphModule(root, graph)


def graph_source(gm: fx.GraphModule) -> str:
    """``gm.code`` without compiling it: a lazy GraphModule (``make_graph_module``,
    ``lazy_graph_modules``) whose code is not made yet gets its source from its graph, as its
    ``recompile`` would, and stays lazy (compiled where it is first run, as PyTorch's own
    partitioner leaves its graphs)."""
    needs_recompile = getattr(gm, "_needs_recompile", None)  # torch's _LazyGraphModule
    if needs_recompile is not None and needs_recompile():
        return gm.graph.python_code(root_module="self").src
    return gm.code


def lazy_graph_modules():
    """Within it, GraphModules torch makes (its partitioner's extractor) are lazy too."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(True)


def register_torch_log(name: str) -> None:
    """Let ``TORCH_LOGS`` show the ``logging`` logger ``name`` (``TORCH_LOGS="fxremat"`` for
    INFO, ``"+fxremat"`` for DEBUG) in torch.compile's log format, once a line. Torch 2.13
    takes the name as a module's logger and may give it two handlers to one stream (each
    line printed twice): one is removed. Where torch set nothing up, a handler is added
    here (reading the variable again, ``_init_logs``, would double torch's own handlers).
    Called at each plan: torch sets its handlers up lazily."""
    import logging

    settings = os.environ.get("TORCH_LOGS", "").replace(",", " ").split()
    wanted = [s for s in settings if s.lstrip("+-") == name]
    log = logging.getLogger(name)
    if not wanted:
        return
    if log.handlers:
        streams = set()
        for handler in list(log.handlers):
            key = (type(handler), getattr(handler, "stream", None))
            if key in streams:
                log.removeHandler(handler)
            streams.add(key)
        return
    log.setLevel(logging.DEBUG if wanted[-1].startswith("+") else
                 logging.ERROR if wanted[-1].startswith("-") else logging.INFO)
    handler = logging.StreamHandler()
    try:
        from torch._logging._internal import TorchLogsFormatter

        handler.setFormatter(TorchLogsFormatter())
    except ImportError:  # another torch: the default format
        pass
    log.addHandler(handler)
    log.propagate = False


def boxed_eager_compiler() -> Callable[[fx.GraphModule, Any], Callable[..., Any]]:
    """AOTAutograd's compiler that runs a graph as it is, boxed: the generated code takes its
    inputs as a list and clears it, so each input is freed after its last use (aot_eager's
    ``boxed_nop``; an Interpreter's ``boxed_run`` where a torch lacks it)."""
    try:
        from torch._dynamo.backends.debugging import boxed_nop

        return boxed_nop
    except ImportError:
        def interpret(gm: fx.GraphModule, _inputs: Any) -> Callable[..., Any]:
            def run(args: list) -> Any:
                return fx.Interpreter(gm).boxed_run(args)

            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        return interpret


# --- the planner's thread, and real tensors while planning ---------------------------

_T = TypeVar("_T")


def on_fresh_stack(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` on a thread of its own, waited for: its result, or what it raised.

    Why: CPython keeps a thread's frames in chunks of memory, and a loop whose calls cross
    from one chunk into the next allocates and frees a chunk at every call (CPython issue
    gh-142183; fixed in 3.14 and backported to 3.13 in 2026, not in 3.11 or 3.12). Inductor
    calls the partitioner deep in torch.compile's stack, where the planner's loops sat on
    such a boundary: the same plan of a 16-layer transformer took 10-12 s there and 5-6 s
    from a shallow stack (CPython 3.11). A new thread's stack is shallow.

    The thread is the caller's as far as planning can tell. Carried over: the context
    variables, Dynamo's thread-local ``TracingContext`` and ``CompileContext`` (with a
    tracing context, ``Graph.eliminate_dead_code`` may drop unused random ops, as Inductor
    does; without one it keeps them, and the plan recomputed ``rand``), the active fake mode
    and Python dispatcher, grad mode, and the current CUDA device."""
    import contextvars

    try:
        from torch._guards import _TLS, CompileContext, TracingContext  # noqa: F401 (_TLS: see _dynamo_contexts)
    except ImportError:  # a torch that keeps them elsewhere: plan on the caller's stack
        return fn(*args, **kwargs)

    carried = contextvars.copy_context()
    tracing_context, compiling = TracingContext.try_get(), CompileContext.try_get()
    fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    python_dispatcher = torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)
    grad = torch.is_grad_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            with contextlib.ExitStack() as stack:
                if device is not None:
                    torch.cuda.set_device(device)
                stack.enter_context(_dynamo_contexts(tracing_context, compiling))
                if fake_mode is not None:
                    stack.enter_context(fake_mode)
                if python_dispatcher:
                    stack.enter_context(torch._C._EnablePythonDispatcher())
                stack.enter_context(torch.set_grad_enabled(grad))
                outcome["value"] = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 (raised again in the caller's thread)
            outcome["error"] = error

    # daemon: an interrupted caller (Ctrl-C reaches the main thread's join) is not held up
    worker = threading.Thread(target=carried.run, args=(run,), name="fxremat-planner", daemon=True)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@contextlib.contextmanager
def _dynamo_contexts(tracing_context: Any, compiling: Any) -> Iterator[None]:
    """This thread's ``TracingContext`` and ``CompileContext`` set to the given ones. Not
    ``torch._guards.tracing``: on exit it cleans up the shape environment's stacks, which
    the caller, still tracing, keeps for its error messages."""
    from torch._guards import _TLS

    old = getattr(_TLS, "tracing_context", None), getattr(_TLS, "compile_context", None)
    _TLS.tracing_context, _TLS.compile_context = tracing_context, compiling
    try:
        yield
    finally:
        _TLS.tracing_context, _TLS.compile_context = old


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Real kernels on real tensors, even where torch.compile's fake mode and Python
    dispatcher are active (the partitioner runs inside both): what ``cost_model="measured"``
    times must be the device's work, not fake propagation."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch._C._DisablePythonDispatcher():
        yield


def compile_id() -> str | None:
    """Dynamo's id of the frame compile under way (``"0/0"``; None outside one): the graphs one
    compile hands the backend (DDPOptimizer's buckets) share it."""
    try:
        from torch._guards import CompileContext

        found = CompileContext.current_compile_id()
    except (ImportError, AttributeError):
        return None
    return None if found is None else str(found)


def splitting_for_ddp() -> bool:
    """Is Dynamo's DDPOptimizer compiling its buckets now? It runs each bucket it has compiled
    on fake tensors, for the next bucket's inputs. True where this torch does not tell."""
    try:
        from torch._guards import TracingContext
    except ImportError:
        return True
    context = TracingContext.try_get()
    return context is not None and getattr(context, "ddp_optimizer_ctx", True) is not None


def traced_values(args) -> bool:
    """Whether a compiled graph is called on fake values (traced, not run): DDPOptimizer
    propagates fake tensors through the buckets it has compiled. Asked at every call of a
    step graph: a plain tensor or parameter (no subclass, no functionalization or functorch
    wrapper) is not fake by ``is_fake``'s own tests, which cost 1.3 ms a call over a
    ResNet-50's 322 inputs when asked of each (2-3% of its step on one CPU thread)."""
    from torch._subclasses.fake_tensor import is_fake

    wrapped, functional = _FUNCTORCH_WRAPPED, torch._is_functional_tensor
    for a in args:
        if not isinstance(a, torch.Tensor):
            continue
        if wrapped is not None and type(a) in _PLAIN_TENSORS and not functional(a) and not wrapped(a):
            continue
        if is_fake(a):
            return True
    return False


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
# ``is_fake``'s test for a functorch wrapper (absent: every tensor takes ``is_fake``'s walk).
_FUNCTORCH_WRAPPED = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)


def register_backend(name: str, compiler_fn) -> None:
    """Make ``torch.compile(backend=name)`` find ``compiler_fn`` once this package is imported.
    The ``torch_dynamo_backends`` entry point does it for an installed fxremat; a checkout on
    ``PYTHONPATH`` has no entry point (its egg-info is not copied with it), so the import
    registers the name itself. Not when Dynamo knows the name already, nor when it knows the
    entry point: ``lookup_backend`` registers what the entry point loads, after the import
    that loading runs, and a second registration of the name is an error there."""
    from torch._dynamo.backends import registry

    if name in registry._COMPILER_FNS or registry._BACKENDS.get(name) is not None:
        return
    registry.register_backend(compiler_fn=compiler_fn, name=name)


# --- FSDP2 -----------------------------------------------------------------------


def fsdp2_parameters_reduced_after_backward() -> set[int]:
    """The ids of the unsharded parameters of every FSDP2 (``fully_shard``) module but the
    roots: FSDP2 reduce-scatters their gradients right after the module's backward and frees
    the unsharded ones (a root's are reduced at the end of the whole backward). Empty without
    FSDP2. Read from the composable-state registry (private, torch >= 2.4; checked on 2.13).
    Assumed: a non-root module's inputs need gradients (FSDP2 hooks its post-backward to
    them; otherwise it reduces at the end of the backward too, and the step under-counts)."""
    try:
        from torch.distributed._composable_state import _module_state_mapping
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError:
        return set()
    found = set()
    for ref in list(_module_state_mapping.values()):
        state = ref()
        group = getattr(state, "_fsdp_param_group", None) if isinstance(state, FSDPState) else None
        if group is None or getattr(state, "_is_root", False):
            continue
        for fsdp_param in group.fsdp_params:
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                found.add(id(unsharded))
    return found
