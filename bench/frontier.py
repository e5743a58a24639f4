"""The benchmark frontier: step time against measured peak memory, per model and strategy.

    python bench/frontier.py                      # every model, every strategy, CPU, small sizes
    python bench/frontier.py --quick              # CI smoke: 2 tiny models, few strategies
    python bench/frontier.py --device cuda --scale gpu
    python bench/frontier.py --summarize bench/results/cpu/frontier/frontier.json   # tables/plots again
    python bench/frontier.py --models gpt2 --fx-match ckpt_blocks,pt_budget_0.1   # fxremat at peers' peaks

For each model (``bench/frontier_models.py``) and strategy, ONE fresh subprocess builds the
model (seed 0), applies the strategy, runs two warm-up steps (each timed: compile time), then
measures one training step (forward + backward, gradients set to ``None`` before it) exactly
as ``fxremat/harness.py`` does: on CPU the peak of bytes allocated above what was live when the
step began, from the PyTorch profiler's allocation events (``fxremat.measure``), and the rise
of the peak RSS over a second such step with glibc's ``MALLOC_MMAP_THRESHOLD_`` pinned; on
CUDA ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` less what was
allocated before the step. Then it sets glibc's thresholds to where they settle in an
unpinned process (``fxremat.harness.release_malloc_pin``: under the pinned 64 KiB threshold
every tensor is freshly mapped and faulted in each step, +20-40% step time) and times
``--steps`` warm steps (median). Inputs
(parameters, buffers, the batch) are not part of the peak: the budget definition of the README.

The measuring processes then stay alive (idle), and once all of a model's strategies are
measured they are timed in ``--rounds`` interleaved rounds (shuffled order each round, one
process at a time, ``--steps`` steps per visit), so that a change of machine load hits all
strategies alike; that median (``step_ms_interleaved``) is the step time of the tables and
plots when present, else the single-process median (``step_ms_isolated``).

Strategies (all compiled ones with TorchInductor):

- ``eager``; ``inductor``: ``torch.compile`` default (PyTorch's min-cut partitioner);
- ``pt_budget_B``: PyTorch's ``activation_memory_budget = B`` (its knapsack partitioner);
- ``ckpt_blocks``: ``torch.utils.checkpoint`` (``use_reentrant=False``) around every block;
- ``ckpt_seq_S``: ``torch.utils.checkpoint.checkpoint_sequential`` with S segments (for an
  ``nn.Sequential`` chain of blocks: torch's function itself; for the Hugging Face models,
  whose blocks take extra arguments, the same segmentation — the first S-1 segments of
  ``n // S`` blocks checkpointed, the rest not — by wrapping block groups); not applicable to
  a U-Net (not a chain);
- ``sac_mm``: selective activation checkpointing per block
  (``create_selective_checkpoint_contexts``): MUST_SAVE the outputs of ``mm``, ``addmm``,
  ``bmm`` and ``convolution``, PREFER_RECOMPUTE everything else;
- ``fxremat_B``: ``backend="fxremat", options={"memory_budget": B}`` (solver "auto"), B a
  fraction of fxremat's unconstrained plan; ``fxremat_<solver>_B`` for other solvers that
  ``fxremat.Options`` accepts (``--solvers``; one it rejects is recorded as skipped with
  its message). A fraction applies to each compiled graph on its own: a graph with nothing
  to trade (Hugging Face GPT-2 computes its loss in a second, small graph) keeps its plan
  with a ``BudgetWarning``, and a graph that can trade but not down to the fraction fails
  the whole model with ``BudgetError``;
- ``fxremat_at_P`` (``--fx-match P,...``, default ``ckpt_blocks``): fxremat (solver "auto") at
  a byte budget equal to peer P's measured peak for the same model (``peak_bytes``: above the
  inputs, what fxremat's budget bounds; per graph, which a small loss graph meets easily), i.e.
  at the memory of P. It runs once P is measured; if P did not run or failed it is recorded as
  skipped with the reason. A P of the form ``pt_budget_B`` / ``ckpt_seq_S`` missing from its
  sweep is added to it, and ``--strategies`` keeps the peer of every matched strategy it keeps;
- ``fxremat_min`` (``--fx-min``, default on): fxremat (solver "auto") at its least feasible byte
  budget: a first process runs at 1 byte and fails with a ``BudgetError`` naming the least
  feasible budget (``Allowed: a budget of at least N bytes``) of the graph it could not plan; a
  fresh process runs at N (and again at a larger N while a later graph asks for more). The
  failed tries are in the row's ``budget_probes``;
- ``rockmate`` (``--rockmate``): not run, see ROCKMATE_NOT_RUN; on CPU it errors.

Compile time = wall time of the two warm-up steps minus two warm steps' median. Solve time =
the partitioner's own time, as Dynamo times it (``dynamo_timed``: PyTorch's
``min_cut_rematerialization_partition``, or ``FxrematPartitioner`` — all of fxremat's
``partition``: classification, min-cut / Rotor, graph extraction and the predicted timeline;
``fxremat.Plan`` itself records no timing), summed over the compiled graphs.

Byte-budget rows record the budget used (``budget_bytes``; the matched peer in ``match``); a
fraction's bytes per graph are in ``fx_plans``.

Writes ``frontier.csv``, ``frontier.json`` (metadata: machine, torch, date, threads, load
average; every row with its error when it failed), ``summary.md`` and ``<model>.png`` (needs
matplotlib; without it the plots are skipped with a note) into ``--out``
(default ``bench/results/<device>/frontier/``). The summary (``summary.md``; the same numbers in
the JSON's ``summary``, each entry tagged with its ``table``): fxremat against its peers at 50%
and 25% of ``torch.compile`` default's measured peak, and at budget 1.0 (``targets``); per model
at the memory of per-block checkpointing (``at_ckpt_blocks``): ``ckpt_blocks``' measured peak
and step time, ``fxremat_at_ckpt_blocks``' and their ratios, the fastest ``pt_budget`` run
within ``ckpt_blocks``' peak, and ``fxremat_min``'s peak against ``ckpt_blocks``'; and every
``fxremat_at_P`` beside P (``matched``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import datetime
import functools
import json
import os
import platform
import queue
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = 2**20
MMAP_THRESHOLD = 64 * 1024  # as fxremat.harness
PARTITIONER_KEYS = ("min_cut_rematerialization_partition", "FxrematPartitioner")

ROCKMATE_NOT_RUN = (
    "Rockmate (Zhao et al., ICML 2023) is not run. (1) The PyPI release it depends on, rkgb 2.0.0, "
    "is an sdist without its core/, lowlevel/ and utils/ packages, so `import rkgb` fails; "
    "(2) rockmate hard-codes torch.device('cuda'), so it cannot run on a CPU; (3) its ILP is solved "
    "with PuLP/CBC, another dependency. The --rockmate hook errors with this text on CPU; on a GPU it "
    "tries `import rockmate` and records whatever fails."
)

QUICK = dict(models=["mlp", "gpt2"], scale="tiny", pt_budgets=[0.5], fx_budgets=[1.0, 0.5], solver_budgets=[],
             segments=[2], fx_match=["ckpt_blocks"], fx_min=True, steps=3, rounds=2)
# The default run is sized for a shared 2-core CPU, where compiling dominates (0.5-2 min per
# strategy and model): one point per peer sweep, fxremat's solvers other than "auto" at one
# budget, and resnet101 (ResNet-101-like) left to --models (it compiles about twice as long
# as resnet50). Widen with --pt-budgets, --segments, --fx-budgets, --solver-budgets.
FULL = dict(models=["gpt2", "bert", "llama", "resnet50", "unet", "vit", "mlp"], scale="small",
            pt_budgets=[0.5], fx_budgets=[1.0, 0.5, 0.25], solver_budgets=[0.5], segments=[2], fx_match=["ckpt_blocks"],
            fx_min=True, steps=3, rounds=10)


# =========================================================================================
# Strategies
# =========================================================================================


def strategy_list(args) -> list[dict]:
    pt_budgets, segments = list(args.pt_budgets), list(args.segments)
    peers = []
    for peer in args.fx_match:  # a peer named by --fx-match that its sweep lacks is added to it
        if peer.startswith("pt_budget_") and _number(peer[len("pt_budget_"):], float) is not None:
            b = float(peer[len("pt_budget_"):])
            pt_budgets += [b] if b not in pt_budgets else []
            peer = f"pt_budget_{b}"
        elif peer.startswith("ckpt_seq_") and _number(peer[len("ckpt_seq_"):], int) is not None:
            s = int(peer[len("ckpt_seq_"):])
            segments += [s] if s not in segments else []
            peer = f"ckpt_seq_{s}"
        peers += [peer] if peer not in peers else []
    out = [{"name": "eager", "kind": "eager"}, {"name": "inductor", "kind": "inductor"}]
    out += [{"name": f"pt_budget_{b}", "kind": "pt_budget", "budget": b} for b in pt_budgets]
    out.append({"name": "ckpt_blocks", "kind": "ckpt_blocks"})
    out += [{"name": f"ckpt_seq_{s}", "kind": "ckpt_seq", "segments": s} for s in segments]
    out.append({"name": "sac_mm", "kind": "sac_mm"})
    for solver in args.solvers:
        prefix = "fxremat" if solver == "auto" else f"fxremat_{solver}"
        budgets = args.fx_budgets if solver == "auto" else args.solver_budgets
        out += [{"name": f"{prefix}_{b}", "kind": "fxremat", "budget": b, "solver": solver}
                for b in sorted(budgets, reverse=True)]
    names = [s["name"] for s in out]
    for peer in peers:
        if peer not in names or peer.startswith("fxremat"):
            raise ValueError(f"--fx-match {peer}: not a peer strategy of this run (one of "
                             f"{', '.join(n for n in names if not n.startswith('fxremat'))})")
        out.append({"name": f"fxremat_at_{peer}", "kind": "fxremat", "budget": None, "solver": "auto", "match": peer})
    if args.fx_min:
        out.append({"name": "fxremat_min", "kind": "fxremat", "budget": None, "solver": "auto", "least": True})
    if args.rockmate:
        out.append({"name": "rockmate", "kind": "rockmate"})
    if args.strategies:
        wanted = set(args.strategies)
        kept = [s for s in out if s["name"] in wanted or s["kind"] in wanted or _family(s) in wanted]
        wanted |= {s["match"] for s in kept if s.get("match")}  # a matched strategy brings its peer
        out = [s for s in out if s in kept or s["name"] in wanted]
    return out


def _number(text: str, kind):
    try:
        return kind(text)
    except ValueError:
        return None


def _family(row: dict) -> str:
    if row["kind"] == "fxremat" and (row.get("solver") or "auto") != "auto":
        return f"fxremat_{row['solver']}"
    return row["kind"]


# =========================================================================================
# Child: one strategy, one fresh process
# =========================================================================================


def _ckpt_wrappers():
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    class Delegating(nn.Module):
        """A wrapper that still answers the wrapped block's attributes."""

        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(super().__getattr__("inner"), name)

    class CheckpointBlock(Delegating):
        def __init__(self, inner, context_fn=None):
            super().__init__()
            self.inner = inner
            self.context_fn = context_fn

        def forward(self, *args, **kwargs):
            if self.context_fn is None:
                return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
            return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self.context_fn, **kwargs)

    class CheckpointGroup(Delegating):
        """The first block of a segment: runs the whole segment under one checkpoint."""

        def __init__(self, inner, rest):
            super().__init__()
            self.inner = inner
            self.rest = nn.ModuleList(rest)

        def _run(self, h, *args, **kwargs):
            h = self.inner(h, *args, **kwargs)
            for block in self.rest:
                h = block(h, *args, **kwargs)
            return h

        def forward(self, h, *args, **kwargs):
            return checkpoint(self._run, h, *args, use_reentrant=False, **kwargs)

    class Passthrough(Delegating):
        """A block already run by its segment's CheckpointGroup."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, h, *args, **kwargs):
            return h

    class CheckpointSequential(nn.Module):
        def __init__(self, seq, segments):
            super().__init__()
            self.seq = seq
            self.segments = segments

        def forward(self, x):
            return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)

    return CheckpointBlock, CheckpointGroup, Passthrough, CheckpointSequential


def sac_policy_context():
    """Selective activation checkpointing: save matmul and convolution outputs, recompute the rest."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


class NotApplicable(Exception):
    pass


def apply_strategy(fm, strategy: dict):
    """Wrap ``fm.model``'s blocks for a checkpointing strategy (in place)."""
    CheckpointBlock, CheckpointGroup, Passthrough, CheckpointSequential = _ckpt_wrappers()
    kind = strategy["kind"]
    if kind in ("ckpt_blocks", "sac_mm"):
        context_fn = sac_policy_context() if kind == "sac_mm" else None
        for container in fm.block_lists:
            for i in range(len(container)):
                container[i] = CheckpointBlock(container[i], context_fn)
    elif kind == "ckpt_seq":
        segments = strategy["segments"]
        if fm.chain is None:
            raise NotApplicable("checkpoint_sequential needs a chain of blocks; this model's blocks are not one "
                                "(long skip connections)")
        owner, attr = fm.chain
        container = getattr(owner, attr)
        n = len(container)
        if segments > n:
            raise NotApplicable(f"{segments} segments > {n} blocks")
        if fm.sequential:
            setattr(owner, attr, CheckpointSequential(container, segments))
        else:  # torch's checkpoint_sequential segmentation, on blocks that take extra arguments
            size = n // segments
            for start in range(0, size * (segments - 1), size):
                blocks = [container[i] for i in range(start, start + size)]
                container[start] = CheckpointGroup(blocks[0], blocks[1:])
                for i in range(start + 1, start + size):
                    container[i] = Passthrough(blocks[i - start])


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _build(spec: dict, strategy: dict):
    """(model, compiled callable, batch, compile context) for one strategy."""
    import torch

    import frontier_models

    torch.manual_seed(spec.get("seed", 0))
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    fm = frontier_models.build(spec["model"], spec["scale"], spec.get("overrides"))
    apply_strategy(fm, strategy)
    model = fm.model.to(device=device, dtype=dtype).train()
    batch = tuple(b.to(device=device, dtype=dtype) if b.is_floating_point() else b.to(device) for b in fm.batch)
    kind = strategy["kind"]
    ctx: Any = contextlib.nullcontext
    if kind == "eager":
        fn = model
    elif kind == "fxremat":
        # bytes (a peer's measured peak, or the least feasible budget) or a fraction
        budget = (int(strategy["budget_bytes"]) if strategy.get("budget_bytes") is not None
                  else float(strategy["budget"]))
        options = {**spec.get("fx_options", {}), "memory_budget": budget, "solver": strategy.get("solver", "auto")}
        fn = torch.compile(model, backend="fxremat", options=options)
    elif kind == "rockmate":
        raise RuntimeError(rockmate_error(spec["device"]))
    else:
        fn = torch.compile(model)  # inductor, PyTorch's partitioner
        if kind == "pt_budget":
            from fxremat._compat import activation_memory_budget

            ctx = functools.partial(activation_memory_budget, float(strategy["budget"]))
    return model, fn, batch, ctx, device


def rockmate_error(device: str) -> str:
    if device != "cuda":
        return "rockmate on CPU: not supported (it hard-codes torch.device('cuda')). " + ROCKMATE_NOT_RUN
    try:
        import rockmate  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"import rockmate failed: {type(err).__name__}: {err}. " + ROCKMATE_NOT_RUN
    return "rockmate imports, but no runner is written for it yet. " + ROCKMATE_NOT_RUN


MARK = "@@frontier@@ "  # prefix of the protocol lines a child writes to stdout


def _emit(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def child(spec: dict) -> None:
    """Measure one strategy in this fresh process, report, then serve timing requests on stdin
    (``time N``: one untimed step and N timed ones; ``exit``), so that the parent can
    interleave timing rounds across the live processes of a model's strategies."""
    import torch

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
    from fxremat import _compat
    from fxremat.harness import measure_memory, release_malloc_pin

    strategy = spec["strategy"]
    model, fn, batch, ctx, device = _build(spec, strategy)

    def step():
        fn(*batch).backward()

    def timed_step() -> float:
        model.zero_grad(set_to_none=True)
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        return time.perf_counter() - start

    warmup_s = []
    with ctx(), _compat.autograd_cache_disabled():  # a cache hit would skip the partitioner (no plan, no solve time)
        for i in range(spec["warmup"]):
            model.zero_grad(set_to_none=True)
            _sync(device)
            start = time.perf_counter()
            loss = fn(*batch)
            loss.backward()
            _sync(device)
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
        result["fx_plans"] = [{"solver": p.solver, "budget_bytes": p.budget_bytes,
                               "predicted_peak_bytes": p.predicted_peak_bytes,
                               "saved_activation_bytes": p.saved_activation_bytes,
                               "recomputed_ops": len(p.recomputed), "stages": p.stages,
                               "solve_seconds": getattr(p, "solve_seconds", None)} for p in plans]
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
# Parent
# =========================================================================================


def _child_env(args, cache_dir: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), PYTHONWARNINGS="ignore",
               OMP_NUM_THREADS=str(args.threads), TORCHINDUCTOR_CACHE_DIR=cache_dir,
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env["PYTHONPATH"] = os.pathsep.join([HERE, ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


class Child:
    """One strategy's fresh process: measure on start, then timing visits on request."""

    def __init__(self, spec: dict, args, cache_dir: str):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=_child_env(args, cache_dir), cwd=ROOT)
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
            return None, _error_text(returncode, self.stderr.read())
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


def _error_text(returncode: int, stderr: str) -> str:
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
            return "\n".join(body).strip()[:3000] + f" [exit {returncode}]"
    return ("\n".join(lines[-20:]).strip() or f"exit status {returncode}")[:3000] + f" [exit {returncode}]"


def _machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    meta = {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__}
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        meta["transformers"] = None
    try:
        with open("/proc/meminfo") as f:
            meta["mem_total_kib"] = int(f.readline().split()[1])
    except OSError:
        pass
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
    return meta


def _git() -> dict:
    def git(*cmd):
        try:
            return subprocess.run(["git", "-C", ROOT, *cmd], capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    dirty = git("status", "--porcelain", "--", "fxremat", "passes", "bench/frontier.py", "bench/frontier_models.py")
    return {"commit": git("rev-parse", "HEAD"), "fxremat_dirty_files": dirty.splitlines()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI smoke run: tiny sizes, few models/strategies/steps")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--scale", choices=["tiny", "small", "gpu"], default=None,
                        help="model sizes (default: small; --quick: tiny; gpu: the published architectures)")
    parser.add_argument("--models", default=None, help="comma list (default: all; --quick: mlp,gpt2)")
    parser.add_argument("--strategies", default=None,
                        help="comma list of strategy names or kinds (eager, inductor, pt_budget, ckpt_blocks, "
                             "ckpt_seq, sac_mm, fxremat, rockmate; names such as fxremat_1.0, fxremat_at_ckpt_blocks, "
                             "fxremat_min); kind fxremat takes every fxremat strategy; a matched strategy brings "
                             "its peer; default all")
    parser.add_argument("--pt-budgets", default=None, help="PyTorch activation_memory_budget values")
    parser.add_argument("--fx-budgets", default=None, help="fxremat memory_budget fractions")
    parser.add_argument("--fx-match", default=None, metavar="PEERS",
                        help="comma list of peer strategies (ckpt_blocks, pt_budget_B, ...): for each, fxremat_at_PEER "
                             "runs fxremat (solver auto) at a byte budget equal to that peer's measured peak "
                             "(default: ckpt_blocks; 'none': no matched runs)")
    parser.add_argument("--fx-min", action=argparse.BooleanOptionalAction, default=None,
                        help="fxremat_min: fxremat (solver auto) at its least feasible byte budget (default: on; "
                             "--no-fx-min: off)")
    parser.add_argument("--fx-options", default="{}", type=json.loads, metavar="JSON",
                        help="fxremat options for every fxremat strategy, e.g. '{\"cost_model\": \"measured\"}' "
                             "(recorded in the JSON's meta), over the default hold_outputs false: every strategy's step "
                             "keeps only the loss (a Hugging Face model's logits die after its loss graph)")
    parser.add_argument("--sizes", default="{}", type=json.loads, metavar="JSON",
                        help="size overrides per model over the scale's, e.g. '{\"gpt2\": {\"layers\": 12}}' "
                             "(each row records its sizes)")
    parser.add_argument("--solvers", default="auto,checkmate,twremat",
                        help="fxremat solvers; those fxremat.Options rejects are recorded as skipped")
    parser.add_argument("--solver-budgets", default=None,
                        help="budgets for the solvers other than auto (default: 0.5; --quick: none)")
    parser.add_argument("--segments", default=None, help="checkpoint_sequential segment counts")
    parser.add_argument("--rockmate", action="store_true", help="add the rockmate strategy (errors on CPU)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every child (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per measurement / per visit")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds per model (0: none)")
    parser.add_argument("--cache", choices=["shared", "fresh"], default="shared",
                        help="Inductor cache: one fresh directory for the whole run (shared) or per measurement")
    parser.add_argument("--jobs", type=int, default=1,
                        help="measurement processes at a time (default 1; more shortens compiling on a many-core "
                             "machine, and the isolated step times then share the CPU; the interleaved rounds "
                             "always run one process at a time; on a GPU keep 1, the processes would share it)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per child process answer")
    parser.add_argument("--out", default=None, help="output folder (default bench/results/<device>/frontier)")
    parser.add_argument("--summarize", default=None, metavar="JSON",
                        help="only rebuild summary.md and the plots from a frontier.json")
    args = parser.parse_args(argv)
    args.fx_options = {"hold_outputs": False, **args.fx_options}

    if args.summarize:
        with open(args.summarize) as f:
            data = json.load(f)
        write_outputs(data, os.path.dirname(os.path.abspath(args.summarize)))
        return

    preset = QUICK if args.quick else FULL
    args.scale = args.scale or preset["scale"]
    args.models = args.models.split(",") if args.models else list(preset["models"])
    args.pt_budgets = [float(b) for b in args.pt_budgets.split(",")] if args.pt_budgets else preset["pt_budgets"]
    args.fx_budgets = [float(b) for b in args.fx_budgets.split(",")] if args.fx_budgets else preset["fx_budgets"]
    args.fx_match = (preset["fx_match"] if args.fx_match is None else
                     [] if args.fx_match.strip().lower() in ("", "none") else args.fx_match.split(","))
    args.fx_min = preset["fx_min"] if args.fx_min is None else args.fx_min
    args.segments = [int(s) for s in args.segments.split(",")] if args.segments else preset["segments"]
    args.solvers = args.solvers.split(",")
    args.solver_budgets = ([float(b) for b in args.solver_budgets.split(",")] if args.solver_budgets
                           else preset["solver_budgets"])
    args.strategies = args.strategies.split(",") if args.strategies else None
    args.steps = args.steps or preset["steps"]
    args.rounds = preset["rounds"] if args.rounds is None else args.rounds
    out_dir = args.out or os.path.join(ROOT, "bench", "results", args.device,
                                       "frontier-quick" if args.quick else "frontier")
    os.makedirs(out_dir, exist_ok=True)

    import torch

    import fxremat

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    started = time.time()
    meta = {
        "command": "python bench/frontier.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": args.device, "dtype": args.dtype, "scale": args.scale, "threads": args.threads,
        "fx_options": args.fx_options,
        "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "cache": args.cache, "jobs": args.jobs,
        "loadavg_start": list(os.getloadavg()), "machine": _machine(), "git": _git(),
        "rockmate": ROCKMATE_NOT_RUN,
        "method": {
            "peak": "CPU: profiler allocation events over one forward+backward step, grads set to None before it, "
                    "bytes above what was live at its start (fxremat.measure.measure_peak_bytes); CUDA: "
                    "max_memory_allocated after reset_peak_memory_stats less memory_allocated before. "
                    "Fresh process per measurement, MALLOC_MMAP_THRESHOLD_=65536 for the memory step, "
                    "glibc's settled thresholds (mmap 32 MiB, trim 64 MiB) for timing.",
            "rss": "rise of VmHWM (reset through /proc/self/clear_refs) over a second step, CPU only",
            "step_ms": "median of warm steps: step_ms_interleaved (the measuring processes of a model's strategies "
                       "kept alive and visited in shuffled rounds, one at a time) when present, else "
                       "step_ms_isolated (the measuring process, right after its memory measurement)",
            "compile_s": "wall time of the warm-up steps minus as many warm steps (median)",
            "solve_s": "the partitioner's time per Dynamo's dynamo_timed (min_cut_rematerialization_partition "
                       "or FxrematPartitioner), summed over compiled graphs; fxremat.Plan records no timing",
        },
    }
    try:
        strategies = strategy_list(args)
    except ValueError as err:
        parser.error(str(err))
    data = {"meta": meta, "rows": []}
    shared_cache = tempfile.mkdtemp(prefix="frontier-inductor-cache-")
    print(f"frontier: {len(args.models)} models x {len(strategies)} strategies, scale {args.scale}, "
          f"{args.device}, {args.threads} thread(s) -> {out_dir}", flush=True)
    try:
        for model_name in args.models:
            rows = run_model(model_name, strategies, args, shared_cache)
            data["rows"] += rows
            meta["loadavg_end"] = list(os.getloadavg())
            meta["wall_s"] = round(time.time() - started, 1)
            write_outputs(data, out_dir, plots=False)
    finally:
        shutil.rmtree(shared_cache, ignore_errors=True)
    meta["loadavg_end"] = list(os.getloadavg())
    meta["wall_s"] = round(time.time() - started, 1)
    write_outputs(data, out_dir)
    print(f"done in {meta['wall_s']:.0f} s -> {out_dir}", flush=True)
    del fxremat


LEAST_PROBE_BYTES = 1  # fxremat_min's first budget: below any plan, so the BudgetError names the least one
LEAST_MAX_PROBES = 5
_LEAST = re.compile(r"Allowed: a budget of at least (\d+) bytes")


def least_budget_bytes(error: str | None) -> int | None:
    """The least feasible budget a BudgetError names (``Allowed: a budget of at least N bytes``)."""
    found = _LEAST.findall(error or "") if (error or "").startswith("BudgetError") else []
    return int(found[-1]) if found else None


def _skip_reason(model_name: str, strategy: dict, args) -> str | None:
    if strategy["kind"] == "fxremat" and strategy.get("solver", "auto") != "auto":
        from fxremat import OptionError, Options

        try:
            Options.from_user({"solver": strategy["solver"]})
        except OptionError as err:
            return f"OptionError: {err}"
    if strategy["kind"] == "rockmate" and args.device != "cuda":
        return rockmate_error(args.device)
    return None


def run_model(model_name: str, strategies: list[dict], args, shared_cache: str) -> list[dict]:
    import frontier_models

    rows = []
    base = {"model": model_name, "scale": args.scale, "device": args.device, "dtype": args.dtype}
    try:  # the model's sizes, and whether it builds at all (transformers missing...)
        fm = frontier_models.build(model_name, args.scale, args.sizes.get(model_name))
        base["sizes"] = fm.sizes
        base["blocks"] = len(fm.blocks)
        del fm
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
        print(f"{model_name}: cannot build: {error}", flush=True)
        return [dict(base, name=s["name"], kind=s["kind"], budget=s.get("budget"), segments=s.get("segments"),
                     solver=s.get("solver"), status="failed", error=error,
                     **{k: s[k] for k in ("match", "least") if s.get(k)}) for s in strategies]
    pending, rows = [], []
    done: dict[str, threading.Event] = {}  # set once a row's status is final (matched strategies wait on their peer)
    for strategy in strategies:
        row = dict(base, name=strategy["name"], kind=strategy["kind"], budget=strategy.get("budget"),
                   segments=strategy.get("segments"), solver=strategy.get("solver"))
        if strategy.get("match"):
            row["match"] = strategy["match"]
        if strategy.get("least"):
            row["least"] = True
        rows.append(row)
        done[row["name"]] = threading.Event()
        reason = _skip_reason(model_name, strategy, args)
        if reason:
            row.update(status="skipped", error=reason)
            done[row["name"]].set()
            print(f"{model_name:10s} {strategy['name']:22s} skipped: {reason[:100]}", flush=True)
            continue
        spec = {"model": model_name, "scale": args.scale, "device": args.device, "dtype": args.dtype,
                "overrides": args.sizes.get(model_name),
                "threads": args.threads, "warmup": args.warmup, "steps": args.steps, "strategy": strategy,
                "fx_options": args.fx_options}
        pending.append((row, spec))
    by_name = {r["name"]: r for r in rows}

    children: dict[str, tuple[Child, str]] = {}  # live processes, for the interleaved timing rounds
    lock = threading.Lock()

    def measure(row: dict, spec: dict, probe: bool = False) -> None:
        cache = shared_cache if args.cache == "shared" else tempfile.mkdtemp(prefix="frontier-inductor-cache-")
        child = Child(spec, args, cache)
        message, error = child.receive(args.timeout)
        wall = time.perf_counter() - child.started
        row["wall_s"] = round(wall, 1)
        if message and "not_applicable" in message:
            row.update(status="n/a", error=f"not applicable: {message['not_applicable']}")
        elif error:
            row.update(status="failed", error=error)
        else:
            row.update(status="ok", **message["result"])
            row["step_ms"], row["step_ms_source"] = row["step_ms_isolated"], "isolated"
        if row["status"] == "ok" and args.rounds > 0:
            with lock:
                children[row["name"]] = (child, cache)
        else:
            child.close()
            if cache != shared_cache:
                shutil.rmtree(cache, ignore_errors=True)
        name = row["name"]
        if row["status"] == "ok":
            print(f"{model_name:10s} {name:22s} peak {row['peak_bytes'] / MIB:8.2f} MiB  step {row['step_ms']:8.2f} ms  "
                  f"compile {row['compile_s']:6.1f} s  solve {_fmt(row['solve_s'], '.3f')} s  ({wall:.0f} s)", flush=True)
        elif probe and least_budget_bytes(row["error"]) is not None:
            print(f"{model_name:10s} {name:22s} probe at {spec['strategy']['budget_bytes']} bytes: least feasible "
                  f"{least_budget_bytes(row['error'])} bytes ({wall:.0f} s)", flush=True)
        else:
            print(f"{model_name:10s} {name:22s} {row['status']}: {row['error'][:160]!r}", flush=True)

    def measure_matched(row: dict, spec: dict) -> None:
        """fxremat at a byte budget equal to the peer's measured peak (above inputs, as the budget)."""
        peer = by_name.get(row["match"])
        if peer is None:
            row.update(status="skipped", error=f"peer {row['match']} is not among this run's strategies")
        else:
            done[peer["name"]].wait()
            if peer["status"] != "ok":
                row.update(status="skipped", error=f"peer {peer['name']} has no measured peak ({peer['status']}: "
                                                   f"{_first_line(peer.get('error'))[:300]})")
        if row.get("status") == "skipped":
            print(f"{model_name:10s} {row['name']:22s} skipped: {row['error'][:100]}", flush=True)
            return
        row["budget_bytes"] = row["match_peak_bytes"] = int(peer["peak_bytes"])
        measure(row, dict(spec, strategy=dict(spec["strategy"], budget_bytes=row["budget_bytes"])))

    def measure_least(row: dict, spec: dict) -> None:
        """fxremat at its least feasible byte budget: a run at LEAST_PROBE_BYTES fails with a
        BudgetError naming the least feasible budget of the graph it could not plan; run again at
        that budget, and again while a later graph (a loss after a graph break) asks for more."""
        budget, probes = LEAST_PROBE_BYTES, []
        for _ in range(LEAST_MAX_PROBES):
            for key in ("status", "error"):
                row.pop(key, None)
            row["budget_bytes"] = budget
            measure(row, dict(spec, strategy=dict(spec["strategy"], budget_bytes=budget)), probe=True)
            least = least_budget_bytes(row.get("error")) if row["status"] == "failed" else None
            if least is None or least <= budget:
                break
            probes.append({"budget_bytes": budget, "least_bytes": least, "wall_s": row["wall_s"],
                           "error": _first_line(row["error"])[:500]})
            budget = least
        row["budget_probes"] = probes

    def run(row: dict, spec: dict) -> None:
        try:
            if row.get("match"):
                measure_matched(row, spec)
            elif row.get("least"):
                measure_least(row, spec)
            else:
                measure(row, spec)
        finally:
            done[row["name"]].set()

    try:
        # eager and torch.compile default first, alone: the default's kernels fill the Inductor
        # cache that the other strategies mostly share, so they are not compiled twice at once.
        first = [pair for pair in pending if pair[0]["kind"] in ("eager", "inductor")]
        for pair in first:
            run(*pair)
        # One fxremat solver's budgets run in turn, highest first: once one is below the least-memory
        # plan (BudgetError), the lower ones are recorded as skipped instead of compiled. Byte budgets
        # (matched to a peer, the least feasible one) are chains of their own.
        chains: dict[str, list] = {}
        for pair in pending:
            if pair not in first:
                row = pair[0]
                fraction = row["kind"] == "fxremat" and row.get("budget") is not None
                key = f"fxremat:{row['solver']}" if fraction else row["name"]
                chains.setdefault(key, []).append(pair)

        def run_chain(chain: list) -> None:
            infeasible = None
            for row, spec in chain:
                if infeasible is not None:
                    row.update(status="skipped", error=f"not compiled: budget {infeasible['budget']} already "
                                                       f"failed with BudgetError: {_first_line(infeasible['error'])}")
                    done[row["name"]].set()
                    print(f"{model_name:10s} {row['name']:22s} skipped (a higher budget was infeasible)", flush=True)
                    continue
                run(row, spec)
                if row["status"] == "failed" and row["error"].startswith("BudgetError"):
                    infeasible = row

        # Long chains start first; the matched strategies last, so that every peer has started
        # (the pool takes tasks in order) before one of them waits for its peer's peak.
        order = sorted(chains.values(), key=lambda c: (bool(c[0][0].get("match")), -len(c)))
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(run_chain, order))
        interleave(model_name, rows, children, args)
    finally:
        for child, cache in children.values():
            child.close()
            if cache != shared_cache:
                shutil.rmtree(cache, ignore_errors=True)

    eager = next((r for r in rows if r["name"] == "eager" and r["status"] == "ok"), None)
    for r in rows:
        if eager and r["status"] == "ok":
            r["loss_rel_diff_vs_eager"] = abs(r["loss"] - eager["loss"]) / max(abs(eager["loss"]), 1e-12)
    return rows


def interleave(model_name: str, rows: list[dict], children: dict, args) -> None:
    """Timing rounds across the live processes of a model's strategies: each round visits them in
    a shuffled order, ``--steps`` timed steps per visit; the median of all is ``step_ms_interleaved``."""
    if not children:
        return
    by_name = {r["name"]: r for r in rows}
    times: dict[str, list[float]] = {name: [] for name in children}
    rounds: dict[str, list[float]] = {name: [] for name in children}
    rng = random.Random(0)
    started = time.perf_counter()
    for _ in range(args.rounds):
        order = [name for name in children if name in times]
        rng.shuffle(order)
        for name in order:
            child = children[name][0]
            message, error = (child.receive(args.timeout) if child.send(f"time {args.steps}")
                              else (None, "the process is gone"))
            if error:
                by_name[name]["interleave_error"] = error
                del times[name]
                continue
            times[name] += message["times"]
            rounds[name].append(statistics.median(message["times"]) * 1e3)
    for name, values in times.items():
        row = by_name[name]
        row["step_ms_interleaved"] = statistics.median(values) * 1e3
        row["round_ms"] = rounds[name]
        row["step_ms"], row["step_ms_source"] = row["step_ms_interleaved"], "interleaved"
    print(f"{model_name:10s} interleaved timing: {len(times)} strategies x {args.rounds} rounds x {args.steps} steps "
          f"({time.perf_counter() - started:.0f} s)", flush=True)


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


# =========================================================================================
# Outputs: CSV, JSON, summary, plots
# =========================================================================================

CSV_FIELDS = ["model", "name", "kind", "budget", "budget_bytes", "match", "segments", "solver", "status", "peak_mib",
              "rss_peak_mib",
              "baseline_mib", "step_ms", "step_ms_source", "step_ms_isolated", "step_ms_interleaved", "compile_s",
              "solve_s", "fx_solve_s", "partitions", "fx_solvers", "fx_budget_mib", "fx_predicted_peak_mib", "fx_recomputed_ops",
              "loss", "loss_rel_diff_vs_eager", "wall_s", "error"]


def _csv_row(r: dict) -> dict:
    def mib(x):
        return None if x is None else round(x / MIB, 4)

    row = {k: r.get(k) for k in CSV_FIELDS}
    row["peak_mib"] = mib(r.get("peak_bytes"))
    row["rss_peak_mib"] = mib(r.get("rss_peak_bytes"))
    row["baseline_mib"] = mib(r.get("baseline_bytes"))
    plans = r.get("fx_plans") or []
    if plans:
        row["fx_solvers"] = "/".join(p["solver"] for p in plans)
        row["fx_budget_mib"] = "/".join(str(mib(p["budget_bytes"])) for p in plans)
        row["fx_predicted_peak_mib"] = "/".join(str(mib(p["predicted_peak_bytes"])) for p in plans)
        row["fx_recomputed_ops"] = "/".join(str(p["recomputed_ops"]) for p in plans)
    for k in ("step_ms", "step_ms_isolated", "step_ms_interleaved", "compile_s", "solve_s", "fx_solve_s",
              "loss_rel_diff_vs_eager"):
        if isinstance(row.get(k), float):
            row[k] = float(f"{row[k]:.6g}")
    if row.get("error"):
        row["error"] = row["error"].replace("\n", " ")[:500]
    return row


def write_outputs(data: dict, out_dir: str, plots: bool = True) -> None:
    os.makedirs(out_dir, exist_ok=True)
    data["summary"] = summarize(data["rows"])
    with open(os.path.join(out_dir, "frontier.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    with open(os.path.join(out_dir, "frontier.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in data["rows"]:
            writer.writerow(_csv_row(r))
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(data))
    if plots:
        write_plots(data, out_dir)


def _ok(rows, model):
    return [r for r in rows if r["model"] == model and r["status"] == "ok"]


def _best(rows, limit):
    fits = [r for r in rows if r["peak_bytes"] <= limit]
    return min(fits, key=lambda r: r["step_ms"]) if fits else None


def _point(r):
    return {"name": r["name"], "peak_bytes": r["peak_bytes"], "step_ms": r["step_ms"]}


def summarize(rows: list[dict]) -> list[dict]:
    """Per model: fxremat against its peers at 50% and 25% of torch.compile default's measured peak,
    and fxremat at budget 1.0 against torch.compile default (entries with ``table`` "targets");
    then ``summarize_at_ckpt_blocks`` per model and ``summarize_matched``. Every figure is a
    row's field.

    At a target T: fxremat's point = its fastest run with measured peak <= T (any solver);
    ``peer`` = the fastest peer (every other strategy) with measured peak <= T, ``ratio`` =
    fxremat's step time / the peer's; ``peer_more`` = the fastest peer whose measured peak is at
    least fxremat's point's (equal or higher memory), ``ratio_more`` likewise (below 1: no peer
    using as much memory or more is as fast)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        ok = _ok(rows, model)
        default = next((r for r in ok if r["name"] == "inductor"), None)
        fx = [r for r in ok if r["kind"] == "fxremat"]
        peers = [r for r in ok if r["kind"] != "fxremat"]
        if default is None:
            out.append({"model": model, "target": None, "note": "torch.compile default failed: no reference memory"})
            continue
        for fraction in (0.5, 0.25):
            limit = fraction * default["peak_bytes"]
            entry: dict[str, Any] = {"model": model, "target": fraction, "target_bytes": limit,
                                     "default_peak_bytes": default["peak_bytes"]}
            best_fx, best_peer = _best(fx, limit), _best(peers, limit)
            entry["fxremat"] = _point(best_fx) if best_fx else None
            entry["peer"] = _point(best_peer) if best_peer else None
            if best_fx and best_peer:
                entry["ratio"] = best_fx["step_ms"] / best_peer["step_ms"]
            if best_fx:
                more = [r for r in peers if r["peak_bytes"] >= best_fx["peak_bytes"]]
                fastest = min(more, key=lambda r: r["step_ms"]) if more else None
                entry["peer_more"] = _point(fastest) if fastest else None
                if fastest:
                    entry["ratio_more"] = best_fx["step_ms"] / fastest["step_ms"]
            notes = []
            if not best_fx:
                low = min(fx, key=lambda r: r["peak_bytes"]) if fx else None
                notes.append("no fxremat run within the target" +
                             (f" (lowest: {low['name']} at {low['peak_bytes'] / MIB:.2f} MiB)" if low else ""))
            if not best_peer:
                low = min(peers, key=lambda r: r["peak_bytes"]) if peers else None
                notes.append("no peer reaches the target" +
                             (f" (lowest: {low['name']} at {low['peak_bytes'] / MIB:.2f} MiB)" if low else ""))
            entry["note"] = "; ".join(notes) or None
            out.append(entry)
        full = next((r for r in fx if r.get("budget") == 1.0 and (r.get("solver") or "auto") == "auto"), None)
        entry = {"model": model, "target": 1.0, "default": _point(default), "fxremat": _point(full) if full else None}
        if full:
            entry["ratio"] = full["step_ms"] / default["step_ms"]
            entry["peak_ratio"] = full["peak_bytes"] / default["peak_bytes"]
        else:
            entry["note"] = "fxremat at budget 1.0 failed or was not run"
        out.append(entry)
    for e in out:
        e["table"] = "targets"
    for model in dict.fromkeys(r["model"] for r in rows):
        entry = summarize_at_ckpt_blocks([r for r in rows if r["model"] == model])
        if entry:
            out.append(entry)
    out += summarize_matched(rows)
    return out


def _fx_point(r):
    return dict(_point(r), budget_bytes=r.get("budget_bytes"))


def _why_not(r: dict | None) -> str:
    if r is None:
        return "not run"
    least = least_budget_bytes(r.get("error"))
    if least is not None:
        asked = f" at {r['budget_bytes'] / MIB:.2f} MiB" if r.get("budget_bytes") is not None else ""
        return f"{r['status']}: BudgetError{asked}: its least feasible budget is {least / MIB:.2f} MiB ({least} bytes)"
    return f"{r['status']}: {_first_line(r.get('error'))[:300]}"


def summarize_at_ckpt_blocks(rows: list[dict]) -> dict | None:
    """One model, at the memory of per-block checkpointing (``ckpt_blocks``): fxremat at a byte
    budget equal to its measured peak (``fxremat_at_ckpt_blocks``), the fastest PyTorch
    ``activation_memory_budget`` run whose measured peak is within it, and fxremat's lowest
    measured peak (``fxremat_min``, its least feasible budget); and the fastest fxremat run of any
    budget whose measured peak is within ``ckpt_blocks``' (``fxremat_within``: the budget bounds
    fxremat's *predicted* peak, which may be above or below what is measured). Ratios: fxremat's
    step time (or peak) ÷ the other's. None when the model has no ``ckpt_blocks``, ``fxremat_at_ckpt_blocks``
    or ``fxremat_min`` row."""
    by_name = {r["name"]: r for r in rows}
    ckpt, at, least = by_name.get("ckpt_blocks"), by_name.get("fxremat_at_ckpt_blocks"), by_name.get("fxremat_min")
    if ckpt is None or (at is None and least is None):
        return None
    entry: dict[str, Any] = {"table": "at_ckpt_blocks", "model": rows[0]["model"]}
    notes = []
    if ckpt["status"] != "ok":
        entry["ckpt_blocks"] = None
        notes.append(f"ckpt_blocks {_why_not(ckpt)}")
    else:
        entry["ckpt_blocks"] = _point(ckpt)
    ok_ckpt = entry["ckpt_blocks"] is not None
    if at is not None and at["status"] == "ok":
        entry["fxremat_at"] = _fx_point(at)
        if ok_ckpt:
            entry["ratio"] = at["step_ms"] / ckpt["step_ms"]
            entry["peak_ratio"] = at["peak_bytes"] / ckpt["peak_bytes"]
    else:
        entry["fxremat_at"] = None
        notes.append(f"fxremat_at_ckpt_blocks {_why_not(at)}")
    pt = [r for r in rows if r["kind"] == "pt_budget" and r["status"] == "ok"]
    if ok_ckpt:  # matching by budget relies on the predicted peak; this is what was measured
        best_fx = _best([r for r in rows if r["kind"] == "fxremat" and r["status"] == "ok"], ckpt["peak_bytes"])
        entry["fxremat_within"] = _fx_point(best_fx) if best_fx else None
        if best_fx:
            entry["within_ratio"] = best_fx["step_ms"] / ckpt["step_ms"]
        best_pt = _best(pt, ckpt["peak_bytes"])
        entry["pt_budget"] = _point(best_pt) if best_pt else None
        if best_pt and entry["fxremat_at"]:
            entry["pt_ratio"] = at["step_ms"] / best_pt["step_ms"]
        if not best_pt:
            low = min(pt, key=lambda r: r["peak_bytes"]) if pt else None
            notes.append("no pt_budget run within ckpt_blocks' peak" +
                         (f" (lowest: {low['name']} at {low['peak_bytes'] / MIB:.2f} MiB)" if low else " (none ran)"))
    if least is not None and least["status"] == "ok":
        entry["fxremat_min"] = _fx_point(least)
        if ok_ckpt:
            entry["min_peak_ratio"] = least["peak_bytes"] / ckpt["peak_bytes"]
            entry["min_ratio"] = least["step_ms"] / ckpt["step_ms"]
    else:
        entry["fxremat_min"] = None
        notes.append(f"fxremat_min {_why_not(least)}")
    entry["note"] = "; ".join(notes) or None
    return entry


def summarize_matched(rows: list[dict]) -> list[dict]:
    """Every ``fxremat_at_<peer>`` row beside its peer: equal budget, measured peaks and step times."""
    out = []
    by_key = {(r["model"], r["name"]): r for r in rows}
    for r in rows:
        if not r.get("match"):
            continue
        peer = by_key.get((r["model"], r["match"]))
        entry: dict[str, Any] = {"table": "matched", "model": r["model"], "name": r["name"], "peer_name": r["match"],
                                 "peer": _point(peer) if peer and peer["status"] == "ok" else None,
                                 "fxremat": _fx_point(r) if r["status"] == "ok" else None}
        if entry["peer"] and entry["fxremat"]:
            entry["ratio"] = r["step_ms"] / peer["step_ms"]
            entry["peak_ratio"] = r["peak_bytes"] / peer["peak_bytes"]
        entry["note"] = None if entry["fxremat"] else _why_not(r)
        out.append(entry)
    return out


def _cell(point: dict | None) -> str:
    if not point:
        return "none"
    return f"{point['name']}: {point['peak_bytes'] / MIB:.2f} MiB, {point['step_ms']:.1f} ms"


def summary_markdown(data: dict) -> str:
    meta = data["meta"]
    m = meta["machine"]
    lines = [
        f"# Benchmark frontier: summary ({meta['device']}, scale {meta['scale']})", "",
        f"`{meta['command']}` — {meta['date']}, {m['cpu']} ({m['cpu_count']} CPUs), torch {m['torch']}, "
        f"{meta['threads']} thread(s), {meta['rounds']} interleaved timing rounds of {meta['steps']} steps, "
        f"load average {', '.join(f'{x:.2f}' for x in meta['loadavg_start'])} at start, "
        f"{', '.join(f'{x:.2f}' for x in meta.get('loadavg_end', meta['loadavg_start']))} at end"
        + (f", {meta['wall_s'] / 60:.0f} min" if meta.get("wall_s") else "") + ".", "",
        "Memory: measured peak of the training step above its inputs. Target: a fraction of `torch.compile` "
        "default's measured peak (its activation memory). fxremat's point: its fastest run (any solver) whose "
        "measured peak is within the target. *Best peer ≤ target*: the fastest other strategy within the target; "
        "*best peer ≥ fxremat's memory*: the fastest other strategy whose measured peak is at least fxremat's. "
        "Ratios are fxremat's step time ÷ the peer's (below 1: fxremat faster). Budget 1.0: `fxremat_1.0` ÷ "
        "`torch.compile` default. Every figure is a row of `frontier.json` (its `summary` holds the same numbers).",
        "",
        "| model | target (MiB) | fxremat | best peer ≤ target | ÷ | best peer ≥ fxremat's memory | ÷ |",
        "|---|---|---|---|---:|---|---:|",
    ]
    targets = [e for e in data["summary"] if e.get("table", "targets") == "targets"]
    for e in targets:
        if e.get("target") is None:
            lines.append(f"| {e['model']} | - | - | - | - | - | {e['note']} |")
            continue
        if e["target"] == 1.0:
            d = e["default"]
            ratio = f"**{e['ratio']:.2f}**" if e.get("ratio") else "-"
            lines.append(f"| {e['model']} | budget 1.0 | {_cell(e.get('fxremat')) if e.get('fxremat') else 'failed'} "
                         f"| {_cell(d)} (default) | {ratio} | | |")
            continue
        ratio = f"**{e['ratio']:.2f}**" if e.get("ratio") else "-"
        ratio_more = f"{e['ratio_more']:.2f}" if e.get("ratio_more") else "-"
        peer = _cell(e.get("peer")) if e.get("peer") else "none reaches it"
        fx_cell = _cell(e.get("fxremat")) if e.get("fxremat") else "none within it"
        more = _cell(e.get("peer_more")) if e.get("fxremat") else "-"
        lines.append(f"| {e['model']} | {e['target']:.0%}: {e['target_bytes'] / MIB:.2f} | {fx_cell} | {peer} | "
                     f"{ratio} | {more} | {ratio_more} |")
    notes = [e for e in targets if e.get("note") and e.get("target") not in (None, 1.0)]
    if notes:
        lines += ["", "Lowest measured peaks where a side does not reach a target:", ""]
        lines += [f"- {e['model']} {e['target']:.0%}: {e['note']}" for e in notes]
    lines += _at_ckpt_blocks_markdown([e for e in data["summary"] if e.get("table") == "at_ckpt_blocks"])
    lines += _matched_markdown([e for e in data["summary"] if e.get("table") == "matched"])
    failed = [r for r in data["rows"] if r["status"] != "ok"]
    if failed:
        lines += ["", "Not measured (status, reason):", ""]
        for r in failed:
            lines.append(f"- {r['model']} / {r['name']}: {r['status']} — {_first_line(r.get('error'))[:300]}")
    lines += ["", f"Rockmate: {meta['rockmate']}", ""]
    return "\n".join(lines)


def _ratio(x, bold: bool = False, digits: int = 2) -> str:
    if x is None:
        return "-"
    return f"**{x:.{digits}f}**" if bold else f"{x:.{digits}f}"


def _budget_cell(point: dict | None) -> str:
    if not point:
        return "none"
    budget = point.get("budget_bytes")
    return _cell(point) + (f" (budget {budget / MIB:.2f} MiB)" if budget is not None else "")


def _at_ckpt_blocks_markdown(entries: list[dict]) -> list[str]:
    if not entries:
        return []
    lines = [
        "", "## At the memory of per-block checkpointing", "",
        "`ckpt_blocks`: `torch.utils.checkpoint` around every block. `fxremat_at_ckpt_blocks`: fxremat (solver "
        "auto) at a byte budget equal to `ckpt_blocks`' measured peak (above inputs, the quantity fxremat's budget "
        "bounds; applied per compiled graph). *PyTorch budget*: the fastest `pt_budget_B` run whose measured peak "
        "is at most `ckpt_blocks`'. `fxremat_min`: fxremat at its least feasible byte budget. ÷: fxremat's step "
        "time (or measured peak) ÷ the other's: a time ratio below 1 is fxremat faster, a peak ratio above 1 is "
        "fxremat over the memory it was matched to. The ÷ after the PyTorch budget: `fxremat_at_ckpt_blocks`' "
        "step time ÷ that run's. fxremat's budget bounds its *predicted* peak, which may be above or below the "
        "measured one, so the last columns give the fastest fxremat run of any budget whose *measured* peak is "
        "at most `ckpt_blocks`'.", "",
        "| model | ckpt_blocks | fxremat_at_ckpt_blocks | ÷ time | ÷ peak | PyTorch budget ≤ ckpt_blocks' peak | "
        "÷ time | fxremat_min | ÷ peak | ÷ time | fastest fxremat ≤ ckpt_blocks' peak | ÷ time |",
        "|---|---|---|---:|---:|---|---:|---|---:|---:|---|---:|",
    ]
    for e in entries:
        pt = _cell(e.get("pt_budget")) if e.get("pt_budget") else ("none within it" if e.get("ckpt_blocks") else "-")
        within = (_cell(e.get("fxremat_within")) if e.get("fxremat_within")
                  else "none within it" if e.get("ckpt_blocks") else "-")
        lines.append(
            f"| {e['model']} | {_cell(e.get('ckpt_blocks')) if e.get('ckpt_blocks') else 'failed'} "
            f"| {_budget_cell(e.get('fxremat_at')) if e.get('fxremat_at') else 'failed'} "
            f"| {_ratio(e.get('ratio'), bold=True)} | {_ratio(e.get('peak_ratio'), digits=3)} | {pt} | {_ratio(e.get('pt_ratio'))} "
            f"| {_budget_cell(e.get('fxremat_min')) if e.get('fxremat_min') else 'failed'} "
            f"| {_ratio(e.get('min_peak_ratio'), bold=True, digits=3)} | {_ratio(e.get('min_ratio'))} "
            f"| {within} | {_ratio(e.get('within_ratio'), bold=True)} |")
    notes = [e for e in entries if e.get("note")]
    if notes:
        lines += ["", "Not in the table:", ""] + [f"- {e['model']}: {e['note']}" for e in notes]
    return lines


def _matched_markdown(entries: list[dict]) -> list[str]:
    if not entries:
        return []
    lines = ["", "## fxremat at a peer's measured peak", "",
             "`fxremat_at_<peer>`: fxremat (solver auto) with `memory_budget` = the peer's measured peak in bytes. "
             "÷: fxremat's step time (measured peak) ÷ the peer's.", "",
             "| model | peer | fxremat at its peak | ÷ time | ÷ peak |", "|---|---|---|---:|---:|"]
    for e in entries:
        fx = (_budget_cell(e["fxremat"]) if e.get("fxremat")
              else f"{e['name']}: {(e.get('note') or '')[:300]}".replace("|", "\\|"))
        peer = _cell(e["peer"]) if e.get("peer") else f"{e['peer_name']}: not measured"
        lines.append(f"| {e['model']} | {peer} | {fx} | {_ratio(e.get('ratio'), bold=True)} | {_ratio(e.get('peak_ratio'), digits=3)} |")
    return lines


STYLE = {  # family -> (marker, colour, label)
    "eager": ("o", "black", "eager"),
    "inductor": ("s", "tab:blue", "torch.compile default"),
    "pt_budget": ("^", "tab:orange", "PyTorch activation_memory_budget"),
    "ckpt_blocks": ("D", "tab:green", "checkpoint every block"),
    "ckpt_seq": ("v", "tab:olive", "checkpoint_sequential"),
    "sac_mm": ("P", "tab:purple", "selective AC (save matmuls)"),
    "fxremat": ("*", "tab:red", "fxremat (solver auto)"),
    "fxremat_checkmate": ("X", "darkred", "fxremat (checkmate)"),
    "fxremat_twremat": ("h", "tab:pink", "fxremat (twremat)"),
}


def write_plots(data: dict, out_dir: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no plots (pip install matplotlib)", flush=True)
        return
    rows, meta = data["rows"], data["meta"]
    for model in dict.fromkeys(r["model"] for r in rows):
        ok = _ok(rows, model)
        if not ok:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        families: dict[str, list[dict]] = {}
        for r in ok:
            families.setdefault(_family(r), []).append(r)
        for family, members in families.items():
            marker, colour, label = STYLE.get(family, ("x", "gray", family))
            members = sorted(members, key=lambda r: r["peak_bytes"])
            xs = [r["peak_bytes"] / MIB for r in members]
            ys = [r["step_ms"] for r in members]
            ax.plot(xs, ys, marker=marker, color=colour, label=label, linestyle="-" if len(members) > 1 else "none",
                    markersize=9 if marker == "*" else 6)
            for r, x, y in zip(members, xs, ys):
                tag = (f"{r['budget']:g}" if r.get("budget") is not None
                       else f"s={r['segments']}" if r.get("segments")
                       else f"@{r['match']}" if r.get("match") else "min" if r.get("least") else None)
                if tag:
                    ax.annotate(tag, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)
        default = next((r for r in ok if r["name"] == "inductor"), None)
        if default:
            for fraction in (0.5, 0.25):
                ax.axvline(fraction * default["peak_bytes"] / MIB, color="gray", linestyle=":", linewidth=0.8)
        sizes = next((r.get("sizes") for r in ok if r.get("sizes")), {})
        ax.set_title(f"{model} ({meta['scale']}: {', '.join(f'{k}={v}' for k, v in sizes.items())})", fontsize=8)
        ax.set_xlabel("measured peak memory of the step (MiB, above inputs)")
        ax.set_ylabel("step time (ms, median)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best", framealpha=0.7)
        fig.text(0.01, 0.01, f"{meta['device']}, torch {meta['machine']['torch']}, {meta['threads']} thread(s), "
                             f"{meta['date'][:10]}; dotted: 50% / 25% of torch.compile default's peak", fontsize=6)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(os.path.join(out_dir, f"{model}.png"), dpi=110)
        plt.close(fig)


def _import_from_this_tree() -> None:
    """Import fxremat from the checkout this file belongs to, so that results are traceable
    to its commit even when ``pip install -e`` points at another checkout (the editable
    finder would otherwise map ``fxremat.passes`` to that one)."""
    sys.path[:0] = [HERE, ROOT]
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not getattr(f, "__module__", "").startswith("__editable___fxremat")]


if __name__ == "__main__":
    _import_from_this_tree()
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        main()
