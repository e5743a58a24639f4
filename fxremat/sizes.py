"""Bytes of FX nodes, from their fake-tensor metadata.

Symbolic sizes (``dynamic=True`` or ``mark_dynamic``) are kept as sympy
expressions (``node_bytes_expr``: the peak at every size, ``fxremat.dynamic``) and
evaluated with the shape environment's hints for planning (``node_bytes``);
data-dependent sizes, which have no hint, at an assumed value (``assumed_sizes``).
"""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from . import _compat, aliasing, memo


# Data-dependent (unbacked) size symbols planned at an assumed value since the last
# ``reset_assumed``: name -> {"value", "from": "range" (its largest value) or "fallback"}.
_ASSUMED: dict[str, dict] = {}


def _hint(value) -> int:
    if isinstance(value, torch.SymInt):
        node = value.node
        hint = getattr(node, "hint", None)
        if hint is None:
            hint = _compat.size_hint(node.shape_env, node.expr)
            if hint is None:
                hint = _assumed_hint(node.shape_env, node.expr)
        return int(hint)
    return int(value)


def _assumed_hint(env, expr: sympy.Expr) -> int:
    """``expr`` with each data-dependent symbol at the largest value of its range, or, with
    none known, at Inductor's fallback (``_compat.unbacked_fallback``); the others at their
    hints. Recorded for ``assumed_sizes``."""
    values = {}
    backed = _compat.shape_env_values(env)
    for symbol in expr.free_symbols:
        if symbol in backed:
            values[symbol] = backed[symbol]
            continue
        bounds = env.var_to_range.get(symbol)
        upper = bounds.upper if bounds is not None else sympy.oo
        if upper.is_finite:
            values[symbol] = int(upper)
            _ASSUMED[str(symbol)] = {"value": int(upper), "from": "range"}
        else:
            values[symbol] = _compat.unbacked_fallback()
            _ASSUMED[str(symbol)] = {"value": values[symbol], "from": "fallback"}
    return int(expr.xreplace(values))


def reset_assumed() -> None:
    _ASSUMED.clear()


def assumed_sizes() -> dict[str, dict]:
    """The data-dependent sizes planned at an assumed value since ``reset_assumed``."""
    return dict(_ASSUMED)


# The CUDA caching allocator hands out blocks in multiples of 512 bytes (kMinBlockSize; its
# round_size, c10/cuda/CUDACachingAllocator.cpp), and torch.cuda.max_memory_allocated counts
# blocks: a tensor on a CUDA device takes its bytes rounded up to 512. A CPU tensor takes its
# exact bytes (c10's CPU allocator, as the profiler reports them).
CUDA_BLOCK_BYTES = 512


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes the tensor's allocation takes on its device (a 512-byte multiple on CUDA)."""
    nbytes = _hint(t.numel()) * t.element_size()
    if nbytes and t.device.type == "cuda":
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


def strided_bytes(t: torch.Tensor) -> int:
    """Bytes of a buffer allocated with ``t``'s sizes and strides (``empty_strided``): its
    span, more than ``tensor_bytes`` where the strides leave gaps (a copy into a column of a
    matrix, returned with the column's strides: 4 elements 128 apart span 385)."""
    if any(_hint(n) == 0 for n in t.shape):
        return 0
    elements = 1 + sum((_hint(n) - 1) * abs(_hint(st)) for n, st in zip(t.shape, t.stride()))
    nbytes = max(elements, _hint(t.numel())) * t.element_size()
    if t.device.type == "cuda":
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


def _expr(value) -> sympy.Expr:
    if isinstance(value, torch.SymInt):
        return sympy.sympify(value.node.expr)
    return sympy.Integer(int(value))


def tensor_bytes_expr(t: torch.Tensor) -> sympy.Expr:
    # Exact bytes, without tensor_bytes' CUDA rounding (at most 511 bytes a tensor): a ceiling
    # in the peak expression would reach the guards that fxremat.dynamic adds.
    return sympy.Mul(*(_expr(s) for s in t.shape), sympy.Integer(t.element_size()))


def node_bytes_expr(node: fx.Node) -> sympy.Expr:
    """Bytes of the node's value(s) as a sympy expression in the graph's size symbols."""
    return sympy.Add(*(tensor_bytes_expr(t) for t in flat_tensors(node.meta.get("val"))))


def symbolic_dims(values) -> list[torch.SymInt]:
    """The symbolic sizes among ``values`` (tensors' dimensions and bare SymInts): what a
    dynamic graph takes (``dynamic=True``, ``mark_dynamic``); empty for a static one."""
    found = []
    for value in values:
        dims = list(value.shape) if isinstance(value, torch.Tensor) else [value]
        found += [d for d in dims if isinstance(d, torch.SymInt)]
    return found


def flat_tensors(val) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in flat_tensors(v)]
    return []


def node_bytes(node: fx.Node) -> int:
    """Bytes of the value(s) the node produces (all items of a multi-output node)."""
    return memo.per_meta("bytes", node, _node_bytes)


def _node_bytes(node: fx.Node) -> int:
    return sum(tensor_bytes(t) for t in flat_tensors(node.meta.get("val")))


def is_tensor_node(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def is_scalar_tensor(node: fx.Node) -> bool:
    """A one-element tensor (a loss); one with symbolic sizes is not taken for one."""
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and all(type(d) is int and d == 1 for d in val.shape)


def incoming_gradient_held(node: fx.Node) -> bool:
    """Whether the backward's incoming gradient ``node`` (a tangent, or the forward output it
    is the gradient of) stays alive until the backward returns: always where autograd holds
    them (torch 2.11), else only a scalar's (the loss's seed, which ``loss.backward()``
    holds); the others are freed at their last use (``_compat.backward_frees_incoming_gradients``)."""
    return not _compat.backward_frees_incoming_gradients() or is_scalar_tensor(node)


def is_multi_output(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (list, tuple))


def storage_node(node: fx.Node) -> fx.Node | None:
    """The node that allocated the storage ``node`` lives in (``aliasing.storage_node``:
    views and items of a view op's tuple share their base's storage), so each storage is
    counted once; None for a value that is no tensor."""
    base = aliasing.storage_node(node)
    return base if flat_tensors(base.meta.get("val")) else None


def storage_of(node: fx.Node) -> str | None:
    """Name of :func:`storage_node`."""
    base = storage_node(node)
    return base.name if base is not None else None


def storages(nodes, exclude: set[str] = frozenset()) -> dict[str, fx.Node]:
    """The distinct storages behind ``nodes`` (name -> the node that allocates it), less
    those of the nodes named in ``exclude`` (the step's inputs)."""
    return {b.name: b for b in map(storage_node, nodes) if b is not None and b.name not in exclude}


def storage_bytes(nodes, exclude: set[str] = frozenset()) -> int:
    """Bytes of the distinct storages behind ``nodes``, less those of the nodes named in
    ``exclude`` (the step's inputs, which saving or carrying does not allocate)."""
    return sum(node_bytes(b) for b in storages(nodes, exclude).values())


def handed_over_bytes(saved, exclude: set[str] = frozenset()) -> int:
    """Bytes the forward hands the backward when it saves ``saved``: a lower bound of the
    peak of any plan with this saved set, since they are all alive when the forward
    returns. Per storage (less those named in ``exclude``, the step's inputs), the largest
    saved view of it, but no more than the storage: a saved slice may be copied out of
    its base, an expanded view is no bigger than its base."""
    largest: dict[str, int] = {}
    for node in saved:
        base = storage_node(node)
        if base is not None and base.name not in exclude:
            largest[base.name] = max(largest.get(base.name, 0), min(node_bytes(node), node_bytes(base)))
    return sum(largest.values())


def held_outputs(outputs, hold_outputs: bool) -> list:
    """The forward's outputs (nodes) the caller holds through the backward: all of them with
    ``hold_outputs``; else its scalars, a loss that ``loss.backward()`` holds until the
    backward returns (the step's peak measured the loss's 4 bytes over the plan's, 512 on
    CUDA: over a least budget by that much)."""
    if hold_outputs:
        return list(outputs)
    return [n for n in outputs if isinstance(getattr(n, "meta", None), dict)
            and isinstance(v := n.meta.get("val"), torch.Tensor) and v.dim() == 0]


def alive_at_backward_bytes(saved, held=(), incoming=(), exclude: set[str] = frozenset()) -> int:
    """Bytes alive when a plan's backward begins, a lower bound of its peak tighter than
    ``handed_over_bytes``: the saved storages (as there), the forward's outputs the caller
    holds to the end of the step (``held``; storages apart from the saved ones, less those in
    ``exclude``), and the incoming gradients (``incoming``, those the backward reads), which
    arrive before any backward op runs and frees anything."""
    return handed_over_bytes(list(saved) + list(held), exclude) + sum(node_bytes(n) for n in incoming)


def describe(node: fx.Node) -> dict:
    """Name, shape, dtype and bytes of a tensor node, for reports."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        row = {"name": node.name, "shape": [str(s) for s in val.shape], "dtype": str(val.dtype).replace("torch.", ""),
               "bytes": tensor_bytes(val)}
        expr = tensor_bytes_expr(val)
        if expr.free_symbols:
            row["bytes_symbolic"] = str(expr)  # "bytes" is its value at the traced sizes
        return row
    return {"name": node.name, "shape": None, "dtype": type(val).__name__, "bytes": 0}
