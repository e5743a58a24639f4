"""Scratch memory of library kernels run op by op (``compiler="eager"``), measured.

A library call can allocate more than its outputs while it runs: on CPU, oneDNN's
convolution copies a contiguous (NCHW) input, output or gradient to its blocked layout and
back (a 16-channel 32x32 convolution: one output-sized buffer in the forward, two
activation-sized ones in the backward), and with a batch of one or in float64 it takes
another algorithm whose im2col buffer is larger still. Which path a kernel takes depends on
the library, its version, the shapes and the thread count, so the bytes are measured: each
distinct call (op, argument shapes, strides and dtypes, other arguments) runs once on
random inputs of the node's shapes, and what it allocated beyond its outputs is its
workspace, cached for the process. Inductor's code is modelled in ``timeline.py``
instead (its convolutions run channels-last, where the copies are weight-sized).

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: torch.ops.aten.mm.default(x, x), tracing_mode="fake")(torch.randn(8, 8))
>>> mm = next(n for n in gm.graph.nodes if n.op == "call_function")
>>> library_workspace_bytes(mm) >= 0
True
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

import torch

from . import memo, oplib
from ._compat import inductor_falls_back, inductor_scatters_in_aten, real_tensors
from .aliasing import is_alias
from .lite import NODES
from .optimer import _random_like, _spec
from .sizes import _hint

log = logging.getLogger("fxremat")

_MEASURED: dict[str, int] = {}  # call key -> bytes beyond the outputs

# What an op raises when random inputs of its shapes break its contract (an index out of
# range, a singular matrix, an unsupported combination): torch's checks raise these.
UNSATISFIED_BY_RANDOM_INPUTS = (RuntimeError, ValueError, IndexError)
RAISE_UNEXPECTED = False  # the tests set it: any other exception is raised, not logged


def is_library_call(node: Any) -> bool:
    """An op the eager path runs as one library kernel that may use scratch memory: not a
    view, item, pointwise or reduction op (those allocate their outputs only), nor a
    random or factory op, and reading at least one tensor. A ``prims`` op is one whatever it
    is: run op by op it is its Python reference, several aten calls (``prims.fma(a, b, c)``,
    from Inductor's softmax backward decomposition, makes ``a * b`` before adding ``c``: an
    attention-scores-sized temporary, measured 12% over the prediction on a transformer)."""
    if not (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and not is_alias(node) and not oplib.is_getitem(node) and not oplib.is_random(node)
            and not oplib.is_collective(node)
            and any(isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes)):
        return False
    return not oplib.is_fusible(node) or node.target.namespace == "prims"


def library_workspace_bytes(node: Any) -> int:
    """Bytes ``node``'s kernel allocates beyond its outputs while it runs, op by op (0 for
    what is not a library call, ``is_library_call``).

    Parameters: ``node``, a node of a torch.fx or light graph with fake values in ``meta["val"]``.
    Returns: the measured peak of the call's allocations minus what it returns, on the
    device of its inputs (CPU: the profiler's allocation events; CUDA: the allocator's peak).
    A call that does not run on random inputs counts 0, and the log says so.
    Cost: one run of each distinct call per process."""
    return memo.per_meta("library scratch", node, _scratch_bytes)


def channels_last_scratch_bytes(node: Any) -> int:
    """Bytes a CPU convolution (or its backward) allocates beyond its outputs when its 4-d
    tensors are channels-last, as Inductor's layout optimization calls it: oneDNN's copy of
    the weight to its blocked layout, the weight gradient computed there, and its scratchpad
    (12–22 KB in a U-Net's convolution backwards, the measured peak of its step). Measured as
    ``library_workspace_bytes`` is, with the inputs laid out channels-last, a broadcast left
    as it is: Inductor hands over an expand (a summed convolution's incoming gradient) and
    oneDNN copies it dense while it runs (64 KiB in a 4x64x8x8 backward, the step's peak)."""
    return memo.per_meta("channels-last scratch", node, lambda n: _scratch_bytes(n, channels_last=True))


def convolution_scratch_bytes(node: Any, channels_last: frozenset[int]) -> int:
    """Bytes a CPU convolution backward allocates beyond its outputs when Inductor hands it its
    operands in their own strides (torch 2.11, ``constrain_to_fx_strides``): the positional
    operands in ``channels_last`` laid out so, the others contiguous. oneDNN computes in one
    layout (channels-last where the input or the weight is laid out so) and copies, while it
    runs, an operand laid out otherwise, and its contiguous path reorders the gradient to a
    blocked layout besides: a 16-channel 16x16 backward computing the weight's gradient from a
    channels-last gradient and a contiguous input allocates two gradient-sized buffers, none
    with every operand channels-last. Measured as ``library_workspace_bytes`` is."""
    return memo.per_meta(f"scratch, channels-last operands {sorted(channels_last)}", node,
                         lambda n: _scratch_bytes(n, channels_last=channels_last))


def strided_scratch_bytes(node: Any, strides: tuple[tuple[int, ...] | None, ...]) -> int:
    """Bytes a CPU convolution backward allocates beyond its outputs when Inductor hands it its
    positional operands in these ``strides`` (None: as traced), where it orders them itself
    without its layout optimization (torch 2.13, ``_compat.inductor_convolution_backward_strides``):
    HF ConvNeXt's depthwise 7x7 backward, a contiguous gradient and an input ordered (N, H, C, W),
    takes 65 KB where every operand channels-last takes 1.6 MB. Measured as
    ``library_workspace_bytes`` is."""
    return memo.per_meta(f"scratch, operand strides {list(strides)}", node,
                         lambda n: _scratch_bytes(n, strides=tuple(strides)))


def _scratch_bytes(node: Any, channels_last: bool | frozenset[int] = False,
                   strides: tuple[tuple[int, ...] | None, ...] | None = None) -> int:
    """``channels_last``: every 4-d tensor laid out channels-last (True), or the positional
    operands at these indices (the others contiguous); a broadcast (an expand) as traced.
    ``strides``: the positional operands in these strides instead (None: as traced)."""
    if not is_library_call(node):
        return 0
    # (a set, even empty, lays every 4-d operand out: a key apart from the traced strides')
    key = _key(node) + (":channels_last" if channels_last is True else
                        "" if channels_last is False else f":channels_last{sorted(channels_last)}")
    if strides is not None:
        key += f":strides{list(strides)}"
    if key not in _MEASURED:
        try:
            with real_tensors():  # the partitioner runs under torch.compile's fake mode
                _MEASURED[key] = _measure(node, channels_last, strides)
        except UNSATISFIED_BY_RANDOM_INPUTS as error:  # torch's check of an op's arguments
            log.info("fxremat: could not measure the scratch memory of %s (%s: %s); counted as none",
                     node.target, type(error).__name__, error)
            _MEASURED[key] = 0
        except Exception as error:  # noqa: BLE001
            # Not what an op says of its arguments: a fault of the measurement itself. A user's
            # step still compiles (the call counted as no scratch, which the log names), and
            # the tests raise it (RAISE_UNEXPECTED): a TypeError here once hid a broken fake of
            # ``_measure`` as a plan without scratch.
            if RAISE_UNEXPECTED:
                raise
            log.warning("fxremat: measuring the scratch memory of %s failed unexpectedly (%s: %s); "
                        "counted as none", node.target, type(error).__name__, error, exc_info=True)
            _MEASURED[key] = 0
    return _MEASURED[key]


def scratch_model(inductor: bool) -> Callable[[Any], int]:
    """The ``workspace`` the timeline counts for each node (``timeline.predict``), one rule for
    every caller. Op by op, every library call's measured scratch (``library_workspace_bytes``).
    Through Inductor, the library calls it runs as extern kernels (``library_call``): on CUDA every one (cuDNN
    convolutions, memory-efficient attention's backward take their workspace from the
    caching allocator, which ``max_memory_allocated`` counts: an H200 measured 2.1 MB in each
    attention backward of issue #26's decoder, unpredicted); on CPU the ops Inductor falls
    back to ATen for (``_compat.inductor_falls_back``): flash attention's CPU kernels take
    per-thread buffers from c10's allocator (256 KiB in each attention backward of the
    decoder, 2 threads: the measured peak). Inductor's CPU convolutions are modelled in
    ``timeline.py`` (oneDNN's channels-last copies) and not asked here.

    >>> scratch_model(inductor=True) is _extern_scratch
    True
    """
    return _extern_scratch if inductor else library_workspace_bytes


def _extern_scratch(node: Any) -> int:
    return memo.per_meta("extern scratch", node, _extern_scratch_bytes)


def library_call(node: Any) -> bool:
    """Does Inductor run this op as a library call (an extern kernel: a matmul, convolution
    or attention, one of its ATen fallbacks, a scatter-add it leaves to ATen) rather than as
    a kernel it generates? (A fact of its op and its inputs' values: asked once a plan.)"""
    return memo.per_meta("library call", node, _library_call)


def _library_call(node: Any) -> bool:
    return oplib.is_compute_intensive(node) or inductor_falls_back(node) or inductor_scatters_in_aten(node)


def _extern_scratch_bytes(node: Any) -> int:
    # Only an extern kernel takes scratch of its own: an op Inductor generates code for
    # (``prims.fma``, an ``index_put``) is fused, though op by op it allocates (GPT on an
    # H100: 33.5 MB predicted for a ``prims.fma`` fused into a softmax backward).
    if not library_call(node):
        return 0
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    on_cuda = any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in vals)
    if not on_cuda and not inductor_falls_back(node):
        return 0
    return library_workspace_bytes(node)


def measured() -> dict[str, int]:
    """The scratch bytes measured in this process so far, by call."""
    return dict(_MEASURED)


def adopt(entries: dict[str, int]) -> None:
    """Take another process's measurements (``ranks``: rank 0's) over this one's."""
    _MEASURED.update(entries)


def _key(node: Any) -> str:
    def arg(a):
        if isinstance(a, NODES):
            return _spec(a.meta.get("val"))
        if isinstance(a, (list, tuple)):
            return [arg(x) for x in a]
        if isinstance(a, dict):
            return {str(k): arg(v) for k, v in sorted(a.items())}
        return _spec(a)

    return json.dumps([str(node.target), arg(node.args), arg(node.kwargs), torch.get_num_threads()], sort_keys=True)


def _broadcast(t: torch.Tensor) -> bool:
    return any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride()))


def _measure(node: Any, channels_last: bool | frozenset[int] = False,
             strides: tuple[tuple[int, ...] | None, ...] | None = None) -> int:
    generator = torch.Generator().manual_seed(0)

    def value(a, position=None):
        if isinstance(a, NODES):
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor):
                given = strides[position] if strides is not None and position is not None and position < len(strides) else None
                if given is not None:
                    return _random_like(torch.empty_strided([_hint(n) for n in val.shape], given, dtype=val.dtype,
                                                            device="meta"),
                                        val.device, generator)
                t = _random_like(val, val.device, generator)
                if t.dim() != 4 or channels_last is False or _broadcast(t):
                    # (a broadcast is handed over as it is, by either torch's Inductor: an expand
                    # of a loss's gradient, which oneDNN copies dense while it runs)
                    return t
                laid_out = channels_last is True or position in channels_last
                return t.contiguous(memory_format=torch.channels_last if laid_out else torch.contiguous_format)
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return _hint(val) if isinstance(val, torch.SymInt) else val.node.hint
            return val
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        if isinstance(a, dict):
            return {k: value(v) for k, v in a.items()}
        return a

    args, kwargs = tuple(value(a, i) for i, a in enumerate(node.args)), value(node.kwargs)
    devices = {a.device for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
    device = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")

    def call():
        return node.target(*args, **kwargs)

    call()  # a first call sets up library state (oneDNN primitives) once
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = call()
        torch.cuda.synchronize(device)
        extra = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
        del result
        return max(extra, 0)
    from .measure import measure_peak_bytes

    measured = measure_peak_bytes(call)
    return max(measured["peak_bytes"] - measured["end_bytes"], 0)


__all__ = ["adopt", "channels_last_scratch_bytes", "convolution_scratch_bytes", "is_library_call", "library_call", "library_workspace_bytes", "measured",
           "scratch_model", "strided_scratch_bytes"]
