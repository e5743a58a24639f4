"""One strategy of the benchmark frontier measured in a fresh process, and the parent's handle on it.

    python bench/frontier_child.py SPEC_JSON    # run by bench/frontier.py (Child), not by hand

The child (:func:`child`) builds the model with its strategy (``frontier_strategies``), runs the
warm-up steps, measures one training step's peak memory (``fxremat.harness.measure_memory``)
and ``--steps`` timed steps, reports them on stdout (lines that start with ``MARK``, one JSON
object each), then serves timing requests on stdin (``time N``, ``exit``) for the interleaved
rounds. :class:`Child` starts one, reads its reports and turns a failed child's stderr into the
row's error (:func:`error_text`; :func:`least_budget_bytes` reads the least feasible budget a
``BudgetError`` names). The protocol, the environment the child runs in (glibc's mmap threshold
pinned for the memory step, one thread, a shared Inductor cache) and its measurement are
described in ``bench/frontier.py``'s docstring.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from plan_records import least_budget, plan_record

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MMAP_THRESHOLD = 64 * 1024  # as fxremat.harness
PARTITIONER_KEYS = ("min_cut_rematerialization_partition", "FxrematPartitioner")
MARK = "@@frontier@@ "  # prefix of the protocol lines a child writes to stdout


def import_from_this_tree() -> None:
    """Import fxremat from the checkout this file belongs to, so that results are traceable
    to its commit even when ``pip install -e`` points at another checkout (the editable
    finder would otherwise map ``fxremat.passes`` to that one)."""
    sys.path[:0] = [HERE, ROOT]
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not getattr(f, "__module__", "").startswith("__editable___fxremat")]


# =========================================================================================
# The child: one strategy, one fresh process
# =========================================================================================


def _emit(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def child(spec: dict) -> None:
    """Measure one strategy in this fresh process, report, then serve timing requests on stdin
    (``time N``: one untimed step and N timed ones; ``exit``), so that the parent can
    interleave timing rounds across the live processes of a model's strategies."""
    import torch

    from frontier_strategies import NotApplicable

    torch.set_num_threads(spec["threads"])
    try:
        state = _measure(spec)
    except NotApplicable as err:
        _emit({"not_applicable": str(err)})
        return
    result = state.pop("result")
    state["release"]()
    _emit({"result": result})
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "exit":
            return
        if command[0] == "time":
            state["timed_step"]()  # the process sat idle: warm its caches first
            times = [state["timed_step"]() for _ in range(int(command[1]))]
            state["release"]()
            _emit({"times": times})


def _measure(spec: dict) -> dict:
    import gc

    import torch

    import fxremat
    from frontier_strategies import build_strategy, sync
    from fxremat import _compat
    from fxremat.harness import measure_memory, release_malloc_pin

    strategy = spec["strategy"]
    model, fn, batch, ctx, device = build_strategy(spec, strategy)

    def step():
        fn(*batch).backward()

    def timed_step() -> float:
        model.zero_grad(set_to_none=True)
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        return time.perf_counter() - start

    warmup_s = []
    with ctx(), _compat.autograd_cache_disabled():  # a cache hit would skip the partitioner (no plan, no solve time)
        for i in range(spec["warmup"]):
            model.zero_grad(set_to_none=True)
            sync(device)
            start = time.perf_counter()
            loss = fn(*batch)
            loss.backward()
            sync(device)
            warmup_s.append(time.perf_counter() - start)
            if i == 0:
                first_loss = float(loss.detach())
    result: dict[str, Any] = {"loss": first_loss, "warmup_s": warmup_s,
                              **measure_memory(model, batch, step, device)}
    # The pinned mmap threshold was for the RSS figure: time with glibc as it settles unpinned.
    result["malloc_unpinned"] = release_malloc_pin()

    timed_step()  # one untimed step after the profiler
    times = [timed_step() for _ in range(spec["steps"])]
    result["step_s"] = times
    result["step_ms_isolated"] = statistics.median(times) * 1e3
    result["compile_s"] = sum(warmup_s) - len(warmup_s) * statistics.median(times)

    phases = _compat.compile_phase_seconds()
    solve = [t for key in PARTITIONER_KEYS for t in phases.get(key, [])]
    result["solve_s"] = sum(solve) if solve else None
    result["partitions"] = len(solve)
    plans = fxremat.inspect.plans()
    if plans:
        result["fx_plans"] = [plan_record(p) for p in plans]
        seconds = [p["solve_seconds"] for p in result["fx_plans"]]
        result["fx_solve_s"] = sum(seconds) if None not in seconds else None
    result["device_name"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    def release() -> None:
        """Idle between timing visits: drop the gradients and, on CUDA, the allocator's cached
        blocks, so that the other strategies' live processes have the device's memory."""
        model.zero_grad(set_to_none=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    return {"result": result, "timed_step": timed_step, "release": release}


# =========================================================================================
# The parent's handle on a child
# =========================================================================================


def child_env(threads: int, cache_dir: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), PYTHONWARNINGS="ignore",
               OMP_NUM_THREADS=str(threads), TORCHINDUCTOR_CACHE_DIR=cache_dir,
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env["PYTHONPATH"] = os.pathsep.join([HERE, ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


class Child:
    """One strategy's fresh process: measure on start, then timing visits on request."""

    def __init__(self, spec: dict, threads: int, cache_dir: str):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=child_env(threads, cache_dir), cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self.lines.put(json.loads(line[len(MARK):]))
        self.lines.put(None)  # end of output: the process exited

    def receive(self, timeout: float) -> tuple[dict | None, str | None]:
        try:
            message = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            return None, f"timeout: no answer within {timeout:.0f} s"
        if message is None:
            returncode = self.proc.wait()
            self.stderr.seek(0)
            return None, error_text(returncode, self.stderr.read())
        return message, None

    def send(self, command: str) -> bool:
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def close(self):
        self.send("exit")
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
        self.stderr.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def error_text(returncode: int, stderr: str) -> str:
    """A failed child's error: its exception (from the last line that starts ``SomeError: ...``
    to the end of stderr), or the tail of stderr, and the exit status."""
    if returncode < 0:
        sig = -returncode
        reason = " (killed: out of memory?)" if sig == 9 else ""
        return f"child killed by signal {sig}{reason}; stderr tail: {stderr[-800:]}"
    lines = stderr.rstrip().splitlines()
    # The exception: from the last line that starts "SomeError: ..." (or "NotApplicable: ...") to the end.
    for i in range(len(lines) - 1, -1, -1):
        head = lines[i].split(":", 1)[0]
        if not lines[i].startswith(" ") and ":" in lines[i] and ("Error" in head or "Exception" in head
                                                                  or head == "NotApplicable"):
            body = [ln for ln in lines[i:] if not ln.startswith(("Set TORCHDYNAMO_VERBOSE", "Set TORCH_LOGS"))]
            from results_io import unqualified  # bench/ is on the path: this file's folder

            body[0] = unqualified(body[0])
            return "\n".join(body).strip()[:3000] + f" [exit {returncode}]"
    return ("\n".join(lines[-20:]).strip() or f"exit status {returncode}")[:3000] + f" [exit {returncode}]"


def least_budget_bytes(error: str | None) -> int | None:
    """The least feasible budget a row's BudgetError names (``Allowed: a budget of at least N bytes``);
    None when the error is another one."""
    least = least_budget(error) if (error or "").startswith("BudgetError") else None
    return least.bytes if least else None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python bench/frontier_child.py SPEC_JSON (started by bench/frontier.py)")
    import_from_this_tree()
    child(json.loads(sys.argv[1]))
