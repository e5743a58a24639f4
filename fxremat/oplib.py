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


def _overload(node: fx.Node):
    return node.target if isinstance(node.target, torch._ops.OpOverload) else None


def is_random(node: fx.Node) -> bool:
    """Draws random numbers: recomputing it would not reproduce its values. Attention
    ops are tagged nondeterministic_seeded for their dropout; with ``dropout_p == 0``
    (inference, or models built without attention dropout, as most LLMs are) they
    draw nothing and recompute exactly."""
    op = _overload(node)
    if op is None:
        return False
    if op in _random_prims():
        return True
    if not _seeded(op):
        return False
    return _dropout_p(node, op) != 0.0


@functools.lru_cache(maxsize=None)
def _seeded(op) -> bool:
    return torch.Tag.nondeterministic_seeded in op.tags


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
    op = _overload(node)
    return op is not None and _view_op(op)


@functools.lru_cache(maxsize=None)
def _view_op(op) -> bool:
    return op.is_view or op.overloadpacket is aten._unsafe_view


def is_getitem(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def is_pointwise(node: fx.Node) -> bool:
    op = _overload(node)
    return op is not None and torch.Tag.pointwise in op.tags


def is_reduction(node: fx.Node) -> bool:
    op = _overload(node)
    return op is not None and torch.Tag.reduction in op.tags


def is_compute_intensive(node: fx.Node) -> bool:
    op = _overload(node)
    return op is not None and op.overloadpacket in _compute_intensive()


def is_fusible(node: fx.Node) -> bool:
    """Can Inductor fuse this op into a kernel with its neighbours (so recomputing it is
    nearly free)? Random ops are excluded: recomputing them would draw new numbers."""
    if node.op != "call_function":
        return False
    if is_getitem(node):
        return is_fusible(node.args[0]) if isinstance(node.args[0], NODES) else False
    op = _overload(node)
    return op is not None and _fusible_op(op) and not is_random(node)


@functools.lru_cache(maxsize=None)
def _fusible_op(op) -> bool:
    # Per op overload, cached: the planners ask this of every node many times.
    return (
        torch.Tag.pointwise in op.tags
        or torch.Tag.reduction in op.tags
        or op.is_view
        or op.overloadpacket in _cheap_fusible()
    )


def fusible_pair(producer: fx.Node, user: fx.Node) -> bool:
    return is_fusible(producer) and is_fusible(user)
