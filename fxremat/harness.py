"""Measure a training step's memory in a fresh process, independently of fxremat's predictor.

    measure_step("unet", backend="fxremat", options={...}) -> dict

runs ``python -m fxremat.harness`` in a subprocess (so nothing earlier in the
calling process — caches, allocator state, other models — touches the figures),
compiles one bundled model (``fxremat.models.ZOO``), warms it up, and measures
one forward+backward step (gradients set to ``None`` before it, so the step
allocates them, as the budget definition counts them):

- ``peak_bytes``: on CPU, the peak of bytes allocated above what was live when
  the step began, from the PyTorch profiler's allocation events
  (``fxremat.measure.measure_peak_bytes``); on CUDA,
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, less
  what was allocated before the step.
- ``rss_peak_bytes`` (CPU, Linux): the rise of the process's peak resident set
  (``VmHWM``, reset through ``/proc/self/clear_refs``) over a second run of the
  step. glibc's mmap threshold is pinned (``MALLOC_MMAP_THRESHOLD_``) so freed
  large tensors leave the process; without it glibc keeps freed memory and RSS
  says nothing about the step.
- ``baseline_bytes``: what the inputs hold (parameters, buffers, the batch),
  reported separately and not part of the peak.
- ``predicted_peak_bytes``: fxremat's prediction for each compiled graph.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any

MMAP_THRESHOLD = 64 * 1024
# glibc's dynamic mmap threshold tops out at 32 MiB (64-bit), with the trim threshold at
# twice that: after a few steps an unpinned training process serves its tensors from the
# heap. Timing under the pinned 64 KiB threshold instead maps and faults in fresh pages for
# every tensor, every step: +20-40% step time on the CPU benchmarks, more for plans that
# allocate more (recomputation), which skews comparisons.
_MMAP_THRESHOLD_MAX = 32 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def release_malloc_pin() -> bool:
    """After the RSS measurement, before timing: set glibc's thresholds to where its dynamic
    adjustment settles (mmap 32 MiB, trim 64 MiB), undoing ``MALLOC_MMAP_THRESHOLD_``.
    False where there is no glibc ``mallopt`` (nothing pinned there either)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_MAX))


def measure_step(model: str, backend: str = "fxremat", options: dict | None = None, *, device: str = "cpu",
                 dtype: str = "float32", model_kwargs: dict | None = None, warmup: int = 2,
                 time_steps: int = 0, grad_check: bool = False, threads: int | None = None,
                 timeout: float = 900, record_dir: str | None = None) -> dict[str, Any]:
    """``time_steps``: also time that many training steps (median ``step_seconds``).
    ``grad_check``: also compile the model in float64 with the same backend and
    options and compare its gradients with eager PyTorch's (``grad_max_rel_error``:
    the largest ``|g - g_eager|`` over all parameters, relative to the largest
    ``|g_eager|`` of that parameter, floored at 1e-3 of the largest of all). ``threads``: ``torch.set_num_threads`` in the
    child (1 gives steadier step times on a shared machine). ``record_dir`` (CUDA): also write
    what explains a gap between predicted and measured peak there (``record_cuda_step``)."""
    spec = {"model": model, "backend": backend, "options": options or {}, "device": device, "dtype": dtype,
            "model_kwargs": model_kwargs or {}, "warmup": warmup, "time_steps": time_steps,
            "grad_check": grad_check, "threads": threads, "record_dir": record_dir}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-m", "fxremat.harness", json.dumps(spec)], capture_output=True,
                         text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"measurement of {spec} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory(model, batch, step, device) -> dict[str, Any]:
    """One ``step()`` (gradients set to None before it), measured as the module docstring
    says: ``baseline_bytes``, ``peak_bytes`` and, on CPU, ``rss_peak_bytes`` (None on CUDA)."""
    import torch

    from fxremat.measure import measure_peak_bytes

    inputs = list(model.parameters()) + list(model.buffers()) + list(batch)
    result: dict[str, Any] = {
        "baseline_bytes": sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in inputs}.values()),
        "rss_peak_bytes": None}
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        result["peak_bytes"] = torch.cuda.max_memory_allocated() - before
    else:
        result["peak_bytes"] = measure_peak_bytes(step)["peak_bytes"]
        model.zero_grad(set_to_none=True)
        gc.collect()
        before = _rss_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        step()
        result["rss_peak_bytes"] = (_rss_kib("VmHWM") - before) * 1024
    return result


def _child(spec: dict) -> dict:
    import torch

    import fxremat
    from fxremat import _compat, models

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    model, batch = models.ZOO[spec["model"]](**spec["model_kwargs"])
    model = model.to(device=device, dtype=dtype)
    batch = tuple(b.to(device=device, dtype=dtype) if b.is_floating_point() else b.to(device) for b in batch)
    if spec["backend"] == "eager":
        step_model = model
    elif spec["backend"] == "fxremat":
        step_model = torch.compile(model, backend="fxremat", options=spec["options"])
    else:
        step_model = torch.compile(model, backend=spec["backend"], options=spec["options"] or None)

    def step():
        step_model(*batch).backward()

    with _compat.autograd_cache_disabled():  # a cache hit would skip planning: no prediction
        for _ in range(spec["warmup"]):
            model.zero_grad(set_to_none=True)
            step()
    result: dict[str, Any] = {"spec": spec, "torch": torch.__version__,
                              **measure_memory(model, batch, step, device)}
    result["device_name"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    if spec.get("time_steps"):
        import statistics

        release_malloc_pin()  # time as an unpinned process runs
        from fxremat.measure import time_steps

        def train_step():
            model.zero_grad(set_to_none=True)
            step()

        result["step_seconds"] = statistics.median(time_steps(train_step, warmup=1, steps=spec["time_steps"]))
    plans = fxremat.inspect.plans()
    if spec.get("record_dir") and device.type == "cuda":
        try:  # a diagnostic: its failure must not lose the row's figures
            result["record_dir"] = record_cuda_step(model, step, plans, spec["record_dir"])
        except Exception as err:  # noqa: BLE001
            result["record_error"] = f"{type(err).__name__}: {err}"
    result["solve_seconds"] = [p.solve_seconds for p in plans]
    if spec.get("grad_check"):
        result["grad_max_rel_error"] = _grad_error(spec)
    result["predicted_peak_bytes"] = [p.predicted_peak_bytes for p in plans]
    result["saved_activation_bytes"] = [p.saved_activation_bytes for p in plans]
    result["recomputed_ops"] = [len(p.recomputed) for p in plans]
    result["budget_bytes"] = [p.budget_bytes for p in plans]
    result["solver"] = [p.solver for p in plans]
    return result


def record_cuda_step(model, step, plans, record_dir: str, collect: bool = True) -> str:
    """What explains a gap between predicted and measured peak on CUDA, written to
    ``record_dir``: ``snapshot.pickle``, the caching allocator's history over ``step()``
    with Python stacks (``torch.cuda.memory._snapshot()``, read by pytorch.org/memory_viz; the
    frames of an allocation name the line of Inductor's generated code that made it);
    ``predicted.json``, each plan's predicted timeline (``Plan.timeline_records``) and peak;
    and ``code/``, the generated code files those frames name. ``collect``: run Python's
    collector before the step (set it False to record a step as a training loop runs it)."""
    import pickle
    import shutil

    from .measure import cuda_step_history

    os.makedirs(record_dir, exist_ok=True)
    model.zero_grad(set_to_none=True)
    if collect:
        gc.collect()
    snapshot, _ = cuda_step_history(step)
    with open(os.path.join(record_dir, "snapshot.pickle"), "wb") as f:
        pickle.dump(snapshot, f)
    with open(os.path.join(record_dir, "predicted.json"), "w") as f:
        json.dump([{"graph": p.graph_id, "solver": p.solver, "predicted_peak_bytes": p.predicted_peak_bytes,
                    "budget_bytes": p.budget_bytes, "timeline": p.timeline_records()} for p in plans], f)
    code = {frame["filename"] for trace in snapshot["device_traces"] for event in trace
            for frame in event.get("frames", []) if "torchinductor" in frame.get("filename", "")}
    os.makedirs(os.path.join(record_dir, "code"), exist_ok=True)
    for path in code:
        if os.path.isfile(path):
            shutil.copy(path, os.path.join(record_dir, "code", os.path.basename(path)))
    return record_dir


def _grad_error(spec: dict) -> float:
    import copy

    import torch

    from fxremat import _compat, models
    from fxremat.options import parse_budget

    torch.manual_seed(0)
    device = torch.device(spec["device"])
    model, batch = models.ZOO[spec["model"]](**spec["model_kwargs"])
    model = model.to(device=device, dtype=torch.float64)
    batch = tuple(b.to(device=device, dtype=torch.float64) if b.is_floating_point() else b.to(device) for b in batch)
    reference = copy.deepcopy(model)
    torch.manual_seed(1)
    reference(*batch).backward()
    options = dict(spec["options"])
    budget = parse_budget(options.get("memory_budget"))
    if budget is not None and budget.bytes is not None:  # an absolute budget: float64 takes more bytes
        options["memory_budget"] = budget.bytes * 8 // getattr(torch, spec["dtype"]).itemsize
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=spec["backend"], options=options or None)
    with _compat.autograd_cache_disabled():
        torch.manual_seed(1)
        compiled(*batch).backward()
    return grad_rel_error([p.grad for p in model.parameters()], [r.grad for r in reference.parameters()])


def grad_rel_error(grads, reference) -> float:
    """The largest ``|g - g_ref|`` over all parameters, relative to each parameter's largest
    reference gradient, floored at 1e-3 of the largest of all: a convolution bias before a
    batch norm has a gradient of rounding noise only. Parameters without a reference
    gradient are skipped."""
    pairs = [(g, r) for g, r in zip(grads, reference) if r is not None]
    floor = 1e-3 * max(r.abs().max().item() for _, r in pairs)
    return max((g - r).abs().max().item() / max(r.abs().max().item(), floor) for g, r in pairs)


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
