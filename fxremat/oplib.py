"""Op classes the min-cut needs, from torch's own op tags wherever a tag exists.

- random:       ``Tag.nondeterministic_seeded`` (+ Inductor's untagged RNG prims)
- pointwise:    ``Tag.pointwise``
- reduction:    ``Tag.reduction``
- view:         the op's schema returns an alias of an input (``OpOverload.is_view``)
- compute-intensive: no tag says this, so a short list (matmul, convolution, attention)

An op in none of the fusible classes is treated as unfusible, so it is never
recomputed: an unknown op costs a saved tensor, never a wrong or slow plan.
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.fx as fx

from .lite import NODES

aten = torch.ops.aten
prims = torch.ops.prims


@functools.cache
def _random_prims() -> frozenset:
    # Inductor's RNG prims carry no nondeterministic_seeded tag; the seed lookup is
    # cheap but feeds the generator, so it stays with the random op it serves.
    names = ["inductor_random", "inductor_randint", "inductor_lookup_seed", "inductor_seeds"]
    return frozenset(getattr(prims, n).default for n in names if hasattr(prims, n))


@functools.cache
def _compute_intensive() -> frozenset:
    packets = [
        "mm", "addmm", "bmm", "baddbmm", "matmul", "_int_mm", "_scaled_mm", "addmv", "mv", "dot",
        "convolution", "convolution_backward", "_convolution", "cudnn_convolution",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward", "_efficient_attention_forward", "_scaled_dot_product_fused_attention_overrideable",
    ]
    return frozenset(getattr(aten, n) for n in packets if hasattr(aten, n))


@functools.cache
def _cheap_fusible() -> frozenset:
    # Untagged ops Inductor fuses into their users: copies, constructors, layout ops.
    packets = [
        "_to_copy", "clone", "alias", "lift_fresh_copy", "detach",
        "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty_like", "scalar_tensor",
        "arange", "iota", "cat", "constant_pad_nd", "slice_scatter", "select_scatter", "expand_copy",
        "view_copy", "permute_copy", "squeeze_copy", "unsqueeze_copy", "t_copy",
    ]
    found = {getattr(aten, n) for n in packets if hasattr(aten, n)}
    found |= {getattr(prims, n) for n in ("iota", "convert_element_type", "broadcast_in_dim") if hasattr(prims, n)}
    return frozenset(found)


# Flags of an op, found once per op: the planners ask these of every node many times
# (the timeline of one 16-layer transformer plan asks ``is_view`` some 30,000 times), and
# hashing an ``OpOverload`` runs Python code, so ops are looked up by ``id``.
_VIEW, _FUSIBLE, _POINTWISE, _REDUCTION, _SEEDED, _RANDOM_PRIM, _COMPUTE_INTENSIVE, _LOWERED_POINTWISE = (
    1 << i for i in range(8))
# Inductor's own prims that it lowers as pointwise kernels (``Pointwise.create``) though no
# tag says so: a max-pool's values and window offsets, two values each with a body of its
# own, and the offsets' conversion to indices (``lowering.py``). Named, not looked up:
# ``torch.ops.prims`` has them only once Inductor is imported.
_POINTWISE_LOWERED_PRIMS = frozenset({"prims::_low_memory_max_pool_with_offsets",
                                      "prims::_low_memory_max_pool_offsets_to_indices"})
_flags_by_id: dict[int, tuple[object, int]] = {}  # id(target) -> (target, flags); the target kept alive


_names_by_id: dict[int, tuple[object, str]] = {}  # id(target) -> (target, str(target)); the target kept alive


def op_name(target) -> str:
    """``str(target)``, found once per op: a plan records the op of every value it
    recomputes, and formatting an ``OpOverload``'s name runs Python code (2% of a 16-layer
    transformer's planning, asked for every candidate's recomputations)."""
    entry = _names_by_id.get(id(target))
    if entry is None or entry[0] is not target:
        entry = _names_by_id[id(target)] = (target, str(target))
    return entry[1]


def _flags(node: fx.Node) -> int:
    if node.op != "call_function":
        return 0
    target = node.target
    entry = _flags_by_id.get(id(target))
    if entry is None or entry[0] is not target:
        entry = _flags_by_id[id(target)] = (target, _op_flags(target))
    return entry[1]


def _op_flags(op) -> int:
    if not isinstance(op, torch._ops.OpOverload):
        return 0
    tags = op.tags
    flags = 0
    if op.is_view or op.overloadpacket is aten._unsafe_view:
        flags |= _VIEW  # _unsafe_view shares storage at run time though its schema does not say so
    if torch.Tag.pointwise in tags:
        flags |= _POINTWISE
    if torch.Tag.reduction in tags:
        flags |= _REDUCTION
    if torch.Tag.nondeterministic_seeded in tags:
        flags |= _SEEDED
    if op in _random_prims():
        flags |= _RANDOM_PRIM
    if op.overloadpacket in _compute_intensive():
        flags |= _COMPUTE_INTENSIVE
    if op.name() in _POINTWISE_LOWERED_PRIMS:
        flags |= _LOWERED_POINTWISE
    if (flags & (_POINTWISE | _REDUCTION)) or op.is_view or op.overloadpacket in _cheap_fusible():
        flags |= _FUSIBLE
    return flags


COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d")


def is_collective(node: fx.Node) -> bool:
    """A collective or its wait (``_c10d_functional``, as torch's partitioners test it):
    never recomputed (``_compat.force_save_special_ops`` marks them MUST_SAVE) and never run
    by the planner to measure it, since a collective that one rank issues alone waits for
    the others forever."""
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace in COLLECTIVE_NAMESPACES


def is_random(node: fx.Node) -> bool:
    """Draws random numbers: recomputing it would not reproduce its values. Attention
    ops are tagged nondeterministic_seeded for their dropout; with ``dropout_p == 0``
    (inference, or models built without attention dropout, as most LLMs are) they
    draw nothing and recompute exactly."""
    flags = _flags(node)
    if flags & _RANDOM_PRIM:
        return True
    if not flags & _SEEDED:
        return False
    return _dropout_p(node, node.target) != 0.0


def _dropout_p(node: fx.Node, op) -> float | None:
    """The ``dropout_p`` argument of an attention op (its default if not passed); None
    for ops without one (ordinary random ops) or a value not known when tracing."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.name != "dropout_p":
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get("dropout_p", arg.default_value)
        return float(value) if isinstance(value, (int, float)) else None
    return None


def is_view(node: fx.Node) -> bool:
    """Returns an alias of its first input: by schema, or ``_unsafe_view`` (which shares
    storage at run time though its schema does not say so)."""
    return bool(_flags(node) & _VIEW)


def is_getitem(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def is_pointwise(node: fx.Node) -> bool:
    return bool(_flags(node) & _POINTWISE)


def is_reduction(node: fx.Node) -> bool:
    return bool(_flags(node) & _REDUCTION)


def is_compute_intensive(node: fx.Node) -> bool:
    return bool(_flags(node) & _COMPUTE_INTENSIVE)


def is_fusible(node: fx.Node) -> bool:
    """Can Inductor fuse this op into a kernel with its neighbours (so recomputing it is
    nearly free)? Random ops are excluded: recomputing them would draw new numbers."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return is_fusible(node.args[0]) if isinstance(node.args[0], NODES) else False
    return bool(_flags(node) & _FUSIBLE) and not is_random(node)


@functools.cache
def _gathers() -> frozenset:
    # Lowered by Inductor as pointwise kernels that load through an index tensor
    # (``lowering.py``: ``embedding``, ``gather``, ``index``, ``_unsafe_index``,
    # ``_unsafe_masked_index``), so inlined into their readers as any pointwise value.
    names = ("embedding.default", "gather.default", "index.Tensor", "_unsafe_index.Tensor",
             "_unsafe_masked_index.default")
    return frozenset(getattr(getattr(aten, packet), overload) for packet, overload in (n.split(".") for n in names)
                     if hasattr(aten, packet) and hasattr(getattr(aten, packet), overload))


@functools.cache
def _index_puts() -> frozenset:
    names = ("index_put", "_unsafe_index_put", "_unsafe_masked_index_put_accumulate")
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


def _integer_indices(node: fx.Node) -> bool:
    """Are the op's index arguments (schema names ``indices``, ``index``) integer tensors?
    An index by a boolean mask has a data-dependent size: Inductor calls the library."""
    for i, argument in enumerate(node.target._schema.arguments):
        if argument.name not in ("indices", "index"):
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
        for index in (value if isinstance(value, (list, tuple)) else [value]):
            val = index.meta.get("val") if isinstance(index, NODES) else None
            if isinstance(index, NODES) and (not isinstance(val, torch.Tensor) or val.dtype.is_floating_point
                                             or val.dtype in (torch.bool, torch.uint8)):
                return False
    return True


def is_inductor_pointwise(node: fx.Node) -> bool:
    """Does Inductor lower this op as a kernel its readers can inline (``is_fusible``, a
    gather through integer indices: ``embedding``, ``gather``, ``index``, one of the
    max-pool prims of ``_POINTWISE_LOWERED_PRIMS``, an item of their tuple included, or a
    max-pool backward of its own, ``is_generated_max_pool_backward``)?"""
    if is_fusible(node):
        return True
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], NODES) and bool(_flags(node.args[0]) & _LOWERED_POINTWISE)
    return (bool(_flags(node) & _LOWERED_POINTWISE) or (node.target in _gathers() and _integer_indices(node))
            or is_generated_max_pool_backward(node))


def is_gather(node: fx.Node) -> bool:
    """A gather Inductor lowers as a pointwise kernel that loads its first input through an
    index (``_gathers``: ``embedding``, ``index``, ...)."""
    return node.op == "call_function" and node.target in _gathers()


def lowered_item_by_item(node: fx.Node) -> bool:
    """Does Inductor lower this tuple-returning op as separate pointwise values, one per item,
    not as one call (a max-pool's result and offsets, ``_POINTWISE_LOWERED_PRIMS``)?"""
    return bool(_flags(node) & _LOWERED_POINTWISE) and isinstance(node.meta.get("val"), (list, tuple))


@functools.cache
def _attention_call_ids() -> frozenset:
    # The attention ops Inductor lowers with ``lowering.sdpa_constraint`` (torch 2.13), by ``id``
    # (see ``_flags``: hashing an ``OpOverload`` runs Python code).
    names = [
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_fused_attention_overrideable_backward",
        "_flash_attention_forward", "_flash_attention_backward",
        "_efficient_attention_forward", "_efficient_attention_backward",
    ]
    return _overload_ids(names)


def _overload_ids(names: list[str]) -> frozenset:
    """The ``id`` of every overload of the aten ops ``names`` this torch has."""
    found = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            found.update(id(getattr(packet, overload)) for overload in packet.overloads())
    return frozenset(found)


def copies_unwritten_inputs(node: fx.Node) -> bool:
    """Does Inductor give this call a copy of its own of each input not yet written, rather
    than write the input once for all its readers? Its attention calls do: their inputs'
    layouts are fixed (``lowering.sdpa_constraint``, ``ExternKernel.require_stride_order``),
    which copies a value not yet written (``copy_input``) and leaves the value itself
    unwritten, so a value read by two attention calls (a recomputed attention's ``v`` and its
    backward) is computed into two copies, each alive while its call runs, and what it is
    computed from stays alive until the last (checked on torch 2.13, CPU)."""
    return node.op == "call_function" and id(node.target) in _attention_call_ids()


def copied_expanded_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs Inductor copies dense for this call even when their storage is written.
    On CPU, an attention call's operand whose strides break the order Inductor requires of
    it, a broadcast's (``_compat.cpu_attention_copies_input``: HF Falcon's multi-query key and
    value). On CUDA, the efficient attention backward's attention bias read as a broadcast view (a
    stride 0 in a dimension longer than one) of a value computed in the graph, which Inductor
    fixes to a contiguous stride order (``lowering.sdpa_constraint``, ``require_stride_order``,
    which copies a view whose strides it cannot read). A Hugging Face causal mask expanded
    over the heads: a copy 4× the mask for each layer's attention backward, alive while it
    runs (measured on an H200 with torch 2.11, Qwen2's generated code). A torch whose views of computed values carry
    strides would copy none (``_compat.attention_backward_copies_broadcast_bias``)."""
    if node.op != "call_function":
        return []
    if id(node.target) in _attention_call_ids():
        from . import _compat

        cpu = [a for a in dict.fromkeys(node.all_input_nodes)
               if isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].device.type == "cpu"
               and _compat.cpu_attention_copies_input(a.meta["val"])]
        if cpu:
            return cpu
    if id(node.target) not in _efficient_backward_ids():
        return []
    bias = node.args[4] if len(node.args) > 4 else node.kwargs.get("attn_bias")
    if not isinstance(bias, fx.Node):
        return []
    val = bias.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.device.type != "cuda":
        return []
    if not any(st == 0 and size > 1 for st, size in zip(val.stride(), val.shape)):
        return []
    # A broadcast of a buffer already written when the view is lowered (a graph input, a
    # library call's output) is a view with strides, passed as it is; one of a value Inductor
    # computes in the graph is not (``_compat.attention_backward_copies_broadcast_bias``).
    # Only a value no other reader has Inductor write before the view is lowered.
    base = bias
    while isinstance(base, fx.Node) and base.op == "call_function" and is_view(base) and base.args:
        base = base.args[0]
        if not isinstance(base, fx.Node) or len(base.users) != 1:
            return []
    if not (base.op == "call_function" and is_inductor_pointwise(base)):
        return []
    from . import _compat

    return [bias] if _compat.attention_backward_copies_broadcast_bias() else []


@functools.cache
def _efficient_backward_ids() -> frozenset:
    return _overload_ids(["_scaled_dot_product_efficient_attention_backward"])


def is_index_put(node: fx.Node) -> bool:
    """An ``index_put`` that Inductor lowers as a scatter kernel into the tensor it writes
    into (``lowering.py::index_put_impl_``), not as a library call: integer indices."""
    return node.op == "call_function" and node.target in _index_puts() and _integer_indices(node)


def loads_lazily(reader: fx.Node, value: fx.Node) -> bool:
    """Does Inductor's lowering of ``reader`` load ``value`` inside its own kernel, so an
    inlined ``value`` needs no buffer? Its pointwise and reduction kernels do
    (``is_inductor_pointwise``), and so does an ``index_put`` for its indices and values
    (``lowering.py::index_put_impl_``: a scatter kernel; the tensor it writes into is
    written first): an embedding's gradient reads the positions ``iota`` inlined."""
    if is_inductor_pointwise(reader):
        return True
    return is_index_put(reader) and reader.args[0] is not value


def is_generated_max_pool_backward(node: fx.Node) -> bool:
    """A max-pool backward Inductor computes as a pointwise value of its own
    (``_compat.max_pool_backward_window``: torch 2.11), loading the gradient (``args[0]``) and
    the indices (``args[7]``) at each window position, the pooled input (``args[1]``) not at
    all."""
    from . import _compat

    return node.op == "call_function" and node.target is aten.max_pool2d_with_indices_backward.default and (
        _compat.inductor_generates_max_pool_backward(node))


def fusible_pair(producer: fx.Node, user: fx.Node) -> bool:
    return is_fusible(producer) and is_fusible(user)
