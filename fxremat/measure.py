"""Measurements of a training step that do not rely on fxremat's own predictor.

* ``measure_peak_bytes``: peak CPU bytes allocated during a step, from the
  PyTorch profiler's allocation events.
* ``saved_activation_bytes``: bytes of the tensors a forward saves for backward,
  from ``torch.autograd.graph.saved_tensors_hooks``.
* ``time_steps``: wall-clock seconds of each step.
* ``record_step``: a step's live-bytes curve and peak, for ``fxremat explain``.
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


# What FSDP2 (``fully_shard``) allocates itself, in its profiler scopes ("FSDP::pre_forward",
# "FSDP::all_gather", "FSDP::post_backward_reduce", ...): the all-gathered parameters, the
# reduce-scatter buffers, the sharded gradients. A budget does not count them (the gathered
# parameters are a compiled graph's inputs; docs/distributed.md, "What a budget counts, per rank").
FSDP2_OWN = ("FSDP::",)


def measure_peak_bytes(step_fn: Callable[[], Any], not_counted: tuple[str, ...] = ()) -> dict[str, int]:
    """Run ``step_fn()`` once under the profiler; return the peak and the final bytes
    allocated by it, above what was live when it started.

    ``not_counted``: profiler scope names (prefixes, e.g. ``FSDP2_OWN``) whose allocations are
    left out of ``peak_bytes`` and ``end_bytes``; ``all_peak_bytes`` is then the peak with them.

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
    events = sorted(_compat.cpu_allocation_events(prof, tuple(not_counted)), key=lambda e: e[0])  # stable sort
    curve = replay([(ptr, size) for _, ptr, size, counted in events if counted])
    measured = {"peak_bytes": max(curve, default=0), "end_bytes": curve[-1] if curve else 0}
    if not_counted:
        measured["all_peak_bytes"] = max(replay([(ptr, size) for _, ptr, size, _ in events]), default=0)
    return measured


def replay(events: Iterable[tuple[int, int]]) -> list[int]:
    """The bytes live after each ``(address, bytes)`` event (bytes > 0: an allocation; < 0:
    a free), counting only blocks allocated among the events: a free of an older block
    does not lower the total (see ``measure_peak_bytes``)."""
    live: dict[int, int] = {}  # address -> bytes, blocks allocated inside the window
    total = 0
    curve = []
    for ptr, size in events:
        if size > 0:
            live[ptr] = size
            total += size
        else:
            total -= live.pop(ptr, 0)
        curve.append(total)
    return curve


# On CUDA the same allocations are told apart by where they are made: the caching allocator's
# history keeps each allocation's Python stack, and FSDP2 makes its own in its package.
FSDP2_OWN_FILES = ("torch/distributed/fsdp/",)


def cuda_peak_bytes(step_fn: Callable[[], Any], not_counted_files: tuple[str, ...] = ()) -> dict[str, int]:
    """``measure_peak_bytes`` on CUDA: run ``step_fn()`` once with the caching allocator's
    history on (Python stacks) and replay it. ``peak_bytes`` leaves out allocations made in a
    file whose path contains one of ``not_counted_files`` (``FSDP2_OWN_FILES``: the parameters
    FSDP2 all-gathers, its reduce-scatter buffers); ``all_peak_bytes`` counts everything;
    ``max_memory_allocated_bytes`` is the allocator's own peak above the start, the check of the
    replay (sizes are rounded to its 512-byte blocks as it counts them)."""
    snapshot, peak_allocated = cuda_step_history(step_fn)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    return {**peaks_of_cuda_trace(trace, not_counted_files), "max_memory_allocated_bytes": peak_allocated}


def cuda_step_history(step_fn: Callable[[], Any]) -> tuple[dict, int]:
    """Run ``step_fn()`` once with the CUDA caching allocator's history on (Python stacks):
    ``(torch.cuda.memory._snapshot(), torch.cuda.max_memory_allocated() above the start)``.
    The one recording every CUDA measurement here and ``harness.record_cuda_step`` make."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        result = step_fn()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    del result
    return snapshot, torch.cuda.max_memory_allocated() - before


def peaks_of_cuda_trace(trace: list[dict], not_counted_files: tuple[str, ...] = ()) -> dict[str, int]:
    """``{"peak_bytes", "all_peak_bytes"}`` of a caching allocator history (``device_traces``
    of ``torch.cuda.memory._snapshot()``): allocations (``alloc``) and frees (``free_completed``)
    replayed with ``replay``, each size rounded up to 512 bytes; ``peak_bytes`` without the
    allocations whose stack has a frame in ``not_counted_files``.

    >>> t = [{"action": "alloc", "addr": 1, "size": 1000, "frames": [{"filename": "model.py"}]},
    ...      {"action": "alloc", "addr": 2, "size": 512, "frames": [{"filename": "torch/distributed/fsdp/x.py"}]},
    ...      {"action": "free_completed", "addr": 1, "size": 1000}]
    >>> peaks_of_cuda_trace(t, FSDP2_OWN_FILES)
    {'peak_bytes': 1024, 'all_peak_bytes': 1536}
    """
    counted, every = [], []
    left_out: set[int] = set()
    for event in trace:
        action, addr = event["action"], event["addr"]
        size = -(-event["size"] // 512) * 512
        if action == "alloc":
            every.append((addr, size))
            if any(f in frame.get("filename", "") for frame in event.get("frames", []) for f in not_counted_files):
                left_out.add(addr)
            else:
                left_out.discard(addr)
                counted.append((addr, size))
        elif action == "free_completed":
            every.append((addr, -size))
            if addr not in left_out:
                counted.append((addr, -size))
    return {"peak_bytes": max(replay(counted), default=0), "all_peak_bytes": max(replay(every), default=0)}


MAX_CURVE_POINTS = 20_000  # a recorded curve is thinned to this many points, each keeping its bucket's largest


def record_step(step_fn: Callable[[], Any], debug_dir: str | None = None) -> dict[str, Any]:
    """Measure one step ``step_fn()`` (forward and backward) with its live-bytes curve, for
    reports: ``{"peak_bytes", "end_bytes", "live_bytes", "method", "device"}``; with
    ``debug_dir``, also written to ``debug_dir/measured.json``, where ``fxremat explain``
    draws it beside the prediction.

    On CPU, the profiler's allocation events (``measure_peak_bytes``' method); on CUDA,
    when CUDA tensors are in use, the caching allocator's history
    (``torch.cuda.memory._record_memory_history``), whose peak is checked against
    ``torch.cuda.max_memory_allocated``. Either way the bytes counted are those the step
    allocated above what was live when it started, as the budget counts them. The curve is
    one point an allocator event, thinned to ``MAX_CURVE_POINTS`` keeping each bucket's
    largest value, so its peak is the measured peak."""
    import json

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        measured = _record_cuda(step_fn)
    else:
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_fd2():
            prof.start()
        try:
            result = step_fn()
        finally:
            with _quiet_fd2():
                prof.stop()
        del result
        events = sorted(_compat.cpu_allocation_events(prof), key=lambda e: e[0])
        curve = replay([(ptr, size) for _, ptr, size, _ in events])
        measured = {"live_bytes": curve, "method": "profiler allocation events (CPU)", "device": "cpu"}
    curve = measured["live_bytes"]
    measured.update(peak_bytes=max(curve, default=0), end_bytes=curve[-1] if curve else 0,
                    live_bytes=_thinned(curve))
    if debug_dir is not None:
        os.makedirs(debug_dir, exist_ok=True)
        with open(os.path.join(debug_dir, "measured.json"), "w") as f:
            json.dump(measured, f)
    return measured


def _thinned(curve: list[int]) -> list[int]:
    if len(curve) <= MAX_CURVE_POINTS:
        return curve
    size = -(-len(curve) // MAX_CURVE_POINTS)
    return [max(curve[i:i + size]) for i in range(0, len(curve), size)]


def _record_cuda(step_fn: Callable[[], Any]) -> dict[str, Any]:
    device = torch.cuda.current_device()
    snapshot, peak_allocated = cuda_step_history(step_fn)
    trace = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
    events = [(e["addr"], e["size"] if e["action"] == "alloc" else -e["size"]) for e in trace
              if e["action"] in ("alloc", "free_completed")]
    curve = replay(events)
    return {"live_bytes": curve, "method": "CUDA caching allocator history", "device": torch.cuda.get_device_name(device),
            "max_memory_allocated_above_start": peak_allocated}


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
