"""``fxremat demo``: train a small GPT three ways and compare them.

The strategies are eager PyTorch, ``torch.compile`` with Inductor's own
partitioner, and ``torch.compile(backend="fxremat")``. Each starts from the
same initial weights and trains with SGD on one fixed batch; the demo reports
step time, the bytes of activations saved for backward and the peak memory of
a training step (measured by ``fxremat.measure``, independently of fxremat's
predictor), and checks that the three agree on the losses.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import torch
import torch._dynamo

from . import _compat, inspect
from .measure import measure_peak_bytes, saved_activation_bytes, time_steps
from .models import make_gpt
from .options import format_bytes
from .plans import fxremat_error

LOSS_RTOL = 1e-4  # fp32; Inductor reorders reductions, so losses agree closely, not bitwise
LOSS_ATOL = 1e-6
LEGEND = """\
saved activations: storages saved for backward, less parameters and the batch (saved_tensors_hooks).
peak (measured): bytes allocated by one warm forward + backward (gradients included) above what
  was live before it (profiler allocation events), as the budget counts them. peak (predicted):
  fxremat's timeline of the compiled forward and backward."""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    steps: int = 10  # timed (warm) steps per strategy
    layers: int = 2
    batch: int = 8
    seq: int = 64
    dim: int = 128
    heads: int = 4
    vocab: int = 256
    budget: int | float | str | None = None  # fxremat's memory_budget option
    threads: int | None = None  # torch.set_num_threads; None keeps torch's default
    lr: float = 0.1
    seed: int = 0


# --quick: a tiny model for a smoke run. Cold, its Inductor C++ builds still take
# most of a minute: the kernel count, not the model size, drives compile time.
QUICK = dict(steps=3, layers=1, batch=2, seq=16, dim=32, heads=2, vocab=64)


@dataclasses.dataclass
class Result:
    strategy: str
    first_step_s: float  # includes compilation for the compiled strategies
    step_times: list[float]
    saved_bytes: int
    peak_bytes: int
    losses: list[float]
    predicted_peak_bytes: int | None = None
    plans: int = 0  # fxremat plans made (one per compiled graph)


class Progress:
    """A one-line progress bar on stderr.

    A compile is one long call that reports nothing, so a background thread
    redraws the bar (total seconds, the current stage and its seconds) while
    the main thread is busy. When stderr is not a terminal, each stage is printed
    once on its own line instead.
    """

    WIDTH = 24

    def __init__(self, total: int, stream: TextIO | None = None, interval: float = 0.1):
        self.total = total
        self.done = 0
        self.stage = ""
        self.stream = stream or sys.stderr
        self.interval = interval
        self.animated = self.stream.isatty()
        self._start = self._stage_start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._animate, daemon=True)

    def __enter__(self) -> Progress:
        if self.animated:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.animated:
            self._thread.join()
            with self._lock:
                self.stream.write("\r\x1b[K")
                self.stream.flush()

    def set_stage(self, stage: str) -> None:
        with self._lock:
            self.stage = stage
            self._stage_start = time.monotonic()
            if not self.animated:
                self.stream.write(f"[{self._stage_start - self._start:6.1f}s] {stage}\n")
                self.stream.flush()

    def advance(self) -> None:
        with self._lock:
            self.done += 1

    def _animate(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                now = time.monotonic()
                filled = self.WIDTH * self.done // self.total
                line = (f"[{'#' * filled}{'-' * (self.WIDTH - filled)}] {self.done}/{self.total} "
                        f"{now - self._start:4.0f}s  {self.stage} {now - self._stage_start:.1f}s")
                # A line wider than the terminal would wrap, and "\r" would not return over it.
                width = shutil.get_terminal_size().columns - 1
                self.stream.write(f"\r{line[:width]}\x1b[K")
                self.stream.flush()


def strategies(config: DemoConfig) -> list[tuple[str, Callable[[torch.nn.Module], Callable]]]:
    options = {} if config.budget is None else {"memory_budget": config.budget}
    return [
        ("eager", lambda model: model),
        ("inductor", lambda model: torch.compile(model)),
        ("fxremat", lambda model: torch.compile(model, backend="fxremat", options=options)),
    ]


@dataclasses.dataclass
class _Run:
    """One strategy set up and compiled: its model copy, compiled callable and step."""

    name: str
    model: torch.nn.Module
    fn: Callable
    step: Callable[[], None]
    losses: list[float]
    first_step_s: float
    step_times: list[float] = dataclasses.field(default_factory=list)


def prepare_strategy(name: str, wrap: Callable, base_model: torch.nn.Module, batch: tuple,
                     config: DemoConfig, progress: Progress) -> _Run:
    """Copy the model, wrap it and run its first step (compiling it)."""
    model = copy.deepcopy(base_model)
    fn = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    losses: list[float] = []

    def step() -> None:
        loss = fn(*batch)
        loss.backward()
        opt.step()
        # Gradients are dropped at the end of the step that made them, so a profiled
        # step frees nothing allocated before it (measure_peak_bytes ignores such frees).
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        progress.advance()

    progress.set_stage(f"{name}: {'first step' if name == 'eager' else 'compiling + first step'}")
    start = time.perf_counter()
    if name == "fxremat":
        # On an AOTAutograd cache hit the partitioner does not run, and no plan
        # (with the predicted peak) would be recorded; Inductor's kernel caches stay on.
        with _compat.autograd_cache_disabled():
            step()
    else:
        step()
    return _Run(name, model, fn, step, losses, time.perf_counter() - start)


def time_interleaved(runs: list[_Run], steps: int, progress: Progress) -> None:
    """``steps`` timed steps of each run, one of each in turn, so that a machine that
    slows down or speeds up meanwhile affects every strategy alike (timed one strategy
    after the other, the same fxremat and Inductor steps measured 1.4x apart on a busy
    2-core machine, and equal interleaved)."""
    progress.set_stage(f"{steps} timed steps per strategy, interleaved")
    for _ in range(steps):
        for run in runs:
            run.step_times += time_steps(run.step, warmup=0, steps=1)


def finish_strategy(run: _Run, batch: tuple, progress: Progress) -> Result:
    """Saved-activation bytes and the measured peak of one more step."""
    progress.set_stage(f"{run.name}: saved activations")
    exclude = [*run.model.parameters(), *run.model.buffers(), *batch]
    saved = saved_activation_bytes(lambda: run.fn(*batch), exclude=exclude)
    progress.advance()

    progress.set_stage(f"{run.name}: profiling a step")
    # The budget definition's step: forward and backward, gradients allocated by it.
    run.model.zero_grad(set_to_none=True)
    peak = measure_peak_bytes(lambda: run.fn(*batch).backward())["peak_bytes"]
    run.model.zero_grad(set_to_none=True)
    progress.advance()

    plans = inspect.plans()
    predicted = plans[-1].predicted_peak_bytes if run.name == "fxremat" and plans else None
    return Result(run.name, run.first_step_s, run.step_times, saved, peak, run.losses, predicted,
                  len(plans) if run.name == "fxremat" else 0)


def run_demo(config: DemoConfig, out: TextIO | None = None) -> int:
    """Run the demo and print its report; the exit status is 1 if the losses disagree,
    2 if fxremat rejects the budget. Clears ``fxremat.inspect``'s plans."""
    out = out or sys.stdout
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    base_model, batch = make_gpt(batch=config.batch, seq=config.seq, vocab=config.vocab,
                                 dim=config.dim, heads=config.heads, layers=config.layers)
    print(
        f"fxremat demo: GPT with {config.layers} layers, dim {config.dim}, {config.heads} heads, "
        f"vocab {config.vocab}, {sum(p.numel() for p in base_model.parameters()):,} parameters; "
        f"batch {config.batch} x seq {config.seq}; SGD, 1 + {config.steps} steps per strategy, then one profiled step; "
        f"torch {torch.__version__}, {_plural(torch.get_num_threads(), 'thread')}",
        file=out, flush=True,
    )
    chosen = strategies(config)
    results: list[Result] = []
    error = None
    # Each strategy's first step (compiling it), then the timed steps in interleaved rounds,
    # then per strategy the saved-activations forward and the profiled step.
    torch._dynamo.reset()
    inspect.clear()  # so that plans() below are fxremat's
    runs: list[_Run] = []
    with Progress(total=len(chosen) * (config.steps + 3)) as progress:
        for name, wrap in chosen:
            try:
                runs.append(prepare_strategy(name, wrap, base_model, batch, config, progress))
            except Exception as exc:
                cause = fxremat_error(exc)  # a budget or option the user gave: reported, not raised
                if cause is None:
                    raise
                error = str(cause)  # fxremat's messages name fxremat and the option
                break
        # After a rejected budget the strategies set up before it are still reported.
        time_interleaved(runs, config.steps, progress)
        results = [finish_strategy(run, batch, progress) for run in runs]
    torch._dynamo.reset()
    print(format_table(results), file=out)
    for r in results:
        if r.strategy == "fxremat" and r.plans != 1:
            # A graph break splits the step into graphs whose peaks do not simply add up.
            print(f"note: fxremat made {r.plans} plans (one per graph); the predicted peak is the last one's", file=out)
    status = 2 if error is not None else report_losses(results, out)
    print(LEGEND, file=out)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
    return status


def format_table(results: list[Result]) -> str:
    header = ["strategy", "first step s", "step ms (median)", "saved activations",
              "peak (measured)", "peak (predicted)", "final loss"]
    rows = [header]
    for r in results:
        rows.append([
            r.strategy,
            f"{r.first_step_s:.2f}",
            f"{1000 * statistics.median(r.step_times):.2f}",
            format_bytes(r.saved_bytes),
            format_bytes(r.peak_bytes),
            "-" if r.predicted_peak_bytes is None else format_bytes(r.predicted_peak_bytes),
            f"{r.losses[-1]:.6f}",
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report_losses(results: list[Result], out: TextIO) -> int:
    reference = results[0]
    worst = 0.0
    for r in results[1:]:
        for a, b in zip(reference.losses, r.losses):
            if not math.isclose(a, b, rel_tol=LOSS_RTOL, abs_tol=LOSS_ATOL):
                print(f"losses DIFFER: {reference.strategy} {reference.losses} vs {r.strategy} {r.losses}", file=out)
                return 1
            worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    print(
        f"losses agree: all {len(reference.losses)} steps of every strategy match {reference.strategy} "
        f"within rtol {LOSS_RTOL:g} (largest relative difference {worst:.1e})",
        file=out,
    )
    return 0


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
