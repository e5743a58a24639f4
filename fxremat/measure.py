"""Measurements of a training step that do not rely on fxremat's own predictor.

* ``measure_peak_bytes``: peak CPU bytes allocated during a step, from the
  PyTorch profiler's allocation events.
* ``saved_activation_bytes``: bytes of the tensors a forward saves for backward,
  from ``torch.autograd.graph.saved_tensors_hooks``.
* ``time_steps``: wall-clock seconds of each step.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from . import _compat


def measure_peak_bytes(step_fn: Callable[[], Any]) -> dict[str, int]:
    """Run ``step_fn()`` once under the profiler; return the peak and the final bytes
    allocated by it, above what was live when it started.

    Method: the profiler (``profile_memory=True``) records the CPU allocations and
    frees made through c10's CPU allocator, with address and size. The events are
    replayed in the order they happened (by start time; ties keep the event
    tree's order), keeping a running total of the blocks allocated inside the
    window. A free of a block allocated before the window (last step's gradients,
    a dropped input) is ignored: its bytes were never counted, so it must not
    lower the total. (c10 reports such a free only if the block was allocated
    while some earlier profile was recording; otherwise it logs the warning "Memory block
    of unknown size was allocated before the profiling started" and reports
    nothing.) The result is the peak of the bytes the step allocated and still
    held, as fxremat's predicted timeline counts them: releasing older memory
    does not offset it. ``end_bytes`` includes what ``step_fn`` returns.

    The allocation events are read from the profiler's event tree, which has
    addresses (``fxremat._compat.cpu_allocation_events``); ``prof.events()``'s
    ``"[memory]"`` entries are only the events outside every operator (mostly
    frees), the allocations being folded into their operators' totals.

    Not seen: CUDA memory, memory that bypasses c10's allocator (oneDNN or
    OpenMP scratch space, ``malloc`` inside C++ kernels), and allocator overheads
    (the sizes are the bytes requested).
    """
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_fd2():
        prof.start()
    try:
        result = step_fn()  # held until the profiler stops: the step's outputs count as live at its end
    finally:
        with _quiet_fd2():
            prof.stop()
    del result
    events = sorted(_compat.cpu_allocation_events(prof), key=lambda e: e[0])  # stable sort
    live: dict[int, int] = {}  # address -> bytes, blocks allocated inside the window
    total = peak = 0
    for _, ptr, size in events:
        if size > 0:
            live[ptr] = size
            total += size
            peak = max(peak, total)
        else:
            total -= live.pop(ptr, 0)
    return {"peak_bytes": peak, "end_bytes": total}


@contextlib.contextmanager
def _quiet_fd2():
    """Silence file descriptor 2 (C++ stderr) for a moment. Kineto in torch 2.13
    writes two ``USDT: ... profiler_start/profiler_stop`` lines to stderr per
    profile, whatever ``KINETO_LOG_LEVEL`` says; only the profiler's start and stop
    run under this, never the step, so the step's own messages still show."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def saved_activation_bytes(step_fn_forward: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the storages the forward ``step_fn_forward()`` saves for backward,
    less the storages of ``exclude`` (parameters, buffers, the batch).

    Method: ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor an
    autograd node saves: eager ops' saved inputs and outputs, and the tensors a
    ``torch.compile``'d forward hands to its backward (AOTAutograd's compiled
    function saves them with ``ctx.save_for_backward``). Each storage counts once,
    whole (``untyped_storage().nbytes()``), keyed by its address; views share
    their base's storage, so a saved transposed weight is excluded with the
    weight. The packed tensors are held until the end, so no address is reused
    by a later storage during the measurement.

    ``torch.compile`` and the hooks (checked on torch 2.13): Dynamo and
    AOTAutograd react only to hooks that are FX GraphModules, which they trace
    into the graph (and guard on). These are plain Python functions: the guard
    sees no hooks either way, nothing recompiles, and the compiled code is the
    one built without hooks. Even a first, compiling call under the hooks gives
    the same result (the hooks see no fake tensors while tracing); warming up
    first is still advisable, to measure the steady-state forward.
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}
    held: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            storages[storage.data_ptr()] = storage.nbytes()
        held.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = step_fn_forward()
    del result
    held.clear()
    return sum(storages.values())


def time_steps(step_fn: Callable[[], Any], warmup: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` calls of ``step_fn()``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step_fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step_fn()
        times.append(time.perf_counter() - start)
    return times
