"""Paired A/B in one process: fxremat at a peer strategy's measured peak, against the peer.

    python bench/ab.py --model transformer --sizes '{"layers": 12, "dim": 512, "heads": 8, "seq": 512, "batch": 8}'
    python bench/ab.py --model gpt2 --peer pt_budget_0.5 --rounds 12 --out bench/results/cpu/ab_gpt2.json
    python bench/ab.py --device cuda --scale gpu --model transformer
    python bench/ab.py --model resnet50 --rounds 150 --variant-options '{"cost_model": "measured"}'
    python bench/ab.py --model gpt2 --peer inductor --budget-fraction 0.5 --variant-options '{"solver": "knapsack"}'

Why a second benchmark beside ``frontier.py``: there, every strategy has a process of its own,
and on a shared 2-core CPU two processes' rounds of one strategy differ by up to 18%, more than
the gaps between the plans compared at equal memory. Here one process builds both (seed 0, the
same model and batch as ``frontier.py``'s), measures the peer's peak (the PyTorch profiler's
allocation events on CPU, ``torch.cuda.max_memory_allocated`` on CUDA; above the inputs), compiles
fxremat (solver "auto") at that many bytes, measures fxremat's peak the same way, then times one
step of each per round for ``--rounds`` rounds, alternating which goes first (A B, B A, ...).
Each round gives a paired ratio (fxremat's step ÷ the peer's, taken minutes apart at most),
which machine-load drifts hit alike. Reported: the medians of both, the median paired ratio with
its smallest and largest, how many rounds fxremat was faster, and per step the minor page faults
and system CPU seconds (CPU: a buffer of 32 MiB or more is a fresh ``mmap`` whose pages fault in
every step, a cost of the allocator that the plans' time model does not see).

A variant (``--variant-options``, ``--variant-inductor-config``, ``--variant-costmodel``) adds a third
contender: fxremat at the same budget with other options, Inductor settings or cost-model
constants, so that two fxremat plans are paired with each other directly (the rounds then go
through the six orders of the three). A cost rule that moves plans has to show its gain so:
against the peer alone, two runs of one plan on this machine differ by up to 0.03 (2026-11-29,
ResNet-50: 1.020 and 1.035). Each fxremat contender compiles its own code object, or Dynamo would
run the first one's compiled frame for the second (its guards pass: same code, same backend).

Both strategies share the process's allocator, so a memory figure is measured with only its
strategy's gradients alive, and the timing rounds drop gradients before each step. Peers:
``inductor``, ``ckpt_blocks``, ``sac_mm``, ``pt_budget_B``, ``ckpt_seq_S`` (as in ``frontier.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import results_io  # noqa: E402
from frontier_strategies import FX_OPTIONS_DEFAULT, build_strategy, sweep_strategy, sync  # noqa: E402
from plan_records import plan_record  # noqa: E402


def peer_strategy(name: str) -> dict:
    """``frontier.py``'s strategy dict for a peer's name."""
    if name in ("inductor", "ckpt_blocks", "sac_mm"):
        return {"name": name, "kind": name}
    point = sweep_strategy(name)
    if point is not None:
        return point
    raise SystemExit(f"--peer {name!r}: expected inductor, ckpt_blocks, sac_mm, pt_budget_<B> or ckpt_seq_<S>")


class Contender:
    """One strategy, compiled and warmed in this process."""

    def __init__(self, spec: dict, strategy: dict, warmup: int, compiling=contextlib.nullcontext):
        from fxremat import _compat

        self.name = strategy["name"]
        self.model, self.fn, self.batch, self.ctx, self.device = build_strategy(spec, strategy)
        if strategy["kind"] == "fxremat":
            self.fn = _own_frame(self.fn)
        self.times: list[float] = []
        self.faults: list[int] = []
        self.system_s: list[float] = []
        started = time.perf_counter()
        with self.ctx(), _compat.autograd_cache_disabled(), compiling():  # (the first step compiles)
            for _ in range(warmup):
                self.step()
        self.warmup_s = time.perf_counter() - started

    def step(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.fn(*self.batch).backward()
        sync(self.device)

    def measure(self) -> int:
        from fxremat.harness import measure_memory

        peak = measure_memory(self.model, self.batch, self.step, self.device)["peak_bytes"]
        self.model.zero_grad(set_to_none=True)
        return peak

    def timed(self) -> None:
        self.model.zero_grad(set_to_none=True)
        sync(self.device)
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        self.step()  # its gradients are None already: nothing to free
        self.times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_SELF)
        self.faults.append(after.ru_minflt - before.ru_minflt)
        self.system_s.append(after.ru_stime - before.ru_stime)
        self.model.zero_grad(set_to_none=True)


_FRAMES = itertools.count(1)


def _own_frame(compiled):
    """``compiled`` (``torch.compile``'s wrapper of a module) compiling a code object of its
    own: a step function made for it alone, which calls the module. Dynamo keeps compiled
    frames per code object, so a second fxremat contender of the same model would otherwise
    run the first one's plan."""
    namespace = {"module": compiled._orig_mod}
    exec(compile("def step(*args):\n    return module(*args)\n", f"<bench/ab.py contender {next(_FRAMES)}>",
                 "exec"), namespace)
    return compiled.dynamo_ctx(namespace["step"])  # the same backend and options


def _variant_context(inductor_config: dict, costmodel_constants: dict):
    """While the variant compiles: Inductor's config patched, and fxremat's cost-model
    constants (``fxremat.costmodel``'s module attributes) set, then put back."""
    @contextlib.contextmanager
    def compiling():
        from torch._inductor import config as inductor_config_module

        from fxremat import costmodel

        before = {name: getattr(costmodel, name) for name in costmodel_constants}
        try:
            for name, value in costmodel_constants.items():
                setattr(costmodel, name, value)
            with inductor_config_module.patch(inductor_config):
                yield
        finally:
            for name, value in before.items():
                setattr(costmodel, name, value)
    return compiling


def _ratios(a: "Contender", b: "Contender") -> dict:
    """``a``'s steps over ``b``'s, round by round: median, quartiles, smallest, largest, and in
    how many rounds ``a`` was faster."""
    ratios = [x / y for x, y in zip(a.times, b.times)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"median": statistics.median(ratios), "q1": quartiles[0], "q3": quartiles[2], "min": min(ratios),
            "max": max(ratios), "faster_rounds": sum(x < 1 for x in ratios)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer", help="a model of bench/frontier_models.py")
    parser.add_argument("--scale", choices=["tiny", "small", "gpu"], default=None,
                        help="default: small on CPU, gpu on CUDA")
    parser.add_argument("--sizes", default="{}", type=json.loads, metavar="JSON", help="the model's size overrides")
    parser.add_argument("--peer", default="ckpt_blocks")
    budget_given = parser.add_mutually_exclusive_group()  # bytes or a fraction, not both
    budget_given.add_argument("--budget-bytes", type=int, default=None,
                        help="fxremat's budget (default: the peer's measured peak)")
    budget_given.add_argument("--budget-fraction", type=float, default=None,
                        help="fxremat's budget as a fraction (the option memory_budget=F) instead of bytes")
    parser.add_argument("--fx-options", default="{}", type=json.loads, metavar="JSON",
                        help="fxremat options over frontier.py's default hold_outputs false (a step drops its loss)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--variant-options", default=None, type=json.loads, metavar="JSON",
                        help="a second fxremat contender at the same budget, with these options over --fx-options")
    parser.add_argument("--variant-inductor-config", default=None, type=json.loads, metavar="JSON",
                        help="a second fxremat contender compiled with these torch._inductor.config settings")
    parser.add_argument("--variant-costmodel", default=None, type=json.loads, metavar="JSON",
                        help="a second fxremat contender planned with these fxremat.costmodel constants")
    parser.add_argument("--out", default=None, help="JSON file for the result")
    args = parser.parse_args(argv)
    variant = any(v is not None for v in (args.variant_options, args.variant_inductor_config,
                                          args.variant_costmodel))
    if args.variant_costmodel:
        from fxremat import costmodel

        unknown = [name for name in args.variant_costmodel if not hasattr(costmodel, name)]
        if unknown:
            parser.error(f"--variant-costmodel: fxremat.costmodel has no {', '.join(unknown)}")
    if args.variant_inductor_config:
        from torch._inductor import config as inductor_config

        unknown = [name for name in args.variant_inductor_config if not hasattr(inductor_config, name)]
        if unknown:
            parser.error(f"--variant-inductor-config: torch._inductor.config has no {', '.join(unknown)}")

    import torch

    from fxremat import inspect as fx_inspect
    from fxremat.harness import release_malloc_pin

    args.fx_options = {**FX_OPTIONS_DEFAULT, **args.fx_options}
    torch.set_num_threads(args.threads)
    scale = args.scale or ("gpu" if args.device == "cuda" else "small")
    spec = {"model": args.model, "scale": scale, "overrides": args.sizes, "device": args.device,
            "dtype": args.dtype, "fx_options": args.fx_options}
    peer = Contender(spec, peer_strategy(args.peer), args.warmup)
    peer_peak = peer.measure()
    budget = args.budget_bytes or peer_peak
    at = {"budget_bytes": budget} if args.budget_fraction is None else {"budget": args.budget_fraction}
    fx = Contender(spec, {"name": f"fxremat_at_{args.peer}", "kind": "fxremat", **at}, args.warmup)
    fx_peak = fx.measure()
    plans = fx_inspect.plans()
    contenders = [peer, fx]
    if variant:
        planned = len(fx_inspect.plans())
        variant_spec = {**spec, "fx_options": {**args.fx_options, **(args.variant_options or {})}}
        other = Contender(variant_spec, {"name": "fxremat_variant", "kind": "fxremat", **at},
                          args.warmup, _variant_context(args.variant_inductor_config or {},
                                                        args.variant_costmodel or {}))
        other_peak = other.measure()
        other_plans = fx_inspect.plans()[planned:]
        plans = plans[:planned]
        contenders.append(other)
    release_malloc_pin()  # the thresholds glibc settles at in an unpinned process (frontier.py's timing)
    for contender in contenders:
        contender.timed()  # one untimed step each after the profiler
        contender.times.clear(), contender.faults.clear(), contender.system_s.clear()
    # Two contenders alternate which goes first; three go through the six orders of three.
    orders = list(itertools.permutations(contenders)) if variant else [(peer, fx), (fx, peer)]
    for r in range(args.rounds):
        for contender in orders[r % len(orders)]:
            contender.timed()
        ratios = [f / p for f, p in zip(fx.times, peer.times)]
        line = (f"round {r + 1}: {peer.name} {peer.times[-1]:.3f} s, {fx.name} {fx.times[-1]:.3f} s, "
                f"paired ratio {ratios[-1]:.3f} (median so far {statistics.median(ratios):.3f})")
        if variant:
            line += f", variant {other.times[-1]:.3f} s"
        print(line, flush=True)

    def summary(c: Contender, peak: int) -> dict:
        return {"name": c.name, "peak_bytes": peak, "warmup_s": c.warmup_s, "step_s": c.times,
                "step_s_median": statistics.median(c.times), "minor_faults_median": statistics.median(c.faults),
                "system_s_median": statistics.median(c.system_s)}

    paired = _ratios(fx, peer)
    result = {
        **results_io.metadata(argv),  # date, torch, cpus, git, ...
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "threads": args.threads, "load_avg": os.getloadavg(), "fx_options": args.fx_options, "model": args.model,
        "scale": scale, "sizes": args.sizes, "rounds": args.rounds,
        "peer": summary(peer, peer_peak), "fxremat": summary(fx, fx_peak), "budget_bytes": budget,
        "budget_fraction": args.budget_fraction,
        "fx_plans": [plan_record(p) for p in plans],
        "paired_ratio_median": paired["median"], "paired_ratio_min": paired["min"],
        "paired_ratio_max": paired["max"], "rounds_fxremat_faster": paired["faster_rounds"],
    }
    if variant:
        result["variant"] = {
            "options": args.variant_options, "inductor_config": args.variant_inductor_config,
            "costmodel": args.variant_costmodel, **summary(other, other_peak),
            "fx_plans": [plan_record(p) for p in other_plans],
            "same_plans": [p.sequence for p in other_plans] == [p.sequence for p in plans]
            and [p.saved for p in other_plans] == [p.saved for p in plans],
            "paired_vs_fxremat": _ratios(other, fx), "paired_vs_peer": _ratios(other, peer)}
    mib = 2**20
    print(f"\n| strategy | measured peak (MiB) | predicted (MiB) | step (s, median of {args.rounds}) | "
          "minor faults / step | system s / step |")
    print("|---|---:|---:|---:|---:|---:|")
    predicted = max(p.predicted_peak_bytes for p in plans)  # each graph's own; the step's largest
    rows = [("peer", "—"), ("fxremat", f"{predicted / mib:.2f}")]
    if variant:
        rows.append(("variant", f"{max(p.predicted_peak_bytes for p in other_plans) / mib:.2f}"))
    for key, pred in rows:
        s = result[key]
        print(f"| {s['name']} | {s['peak_bytes'] / mib:.2f} | {pred} | {s['step_s_median']:.4g} | "
              f"{s['minor_faults_median']:.0f} | {s['system_s_median']:.2f} |")
    print(f"\npaired ratio fxremat ÷ {peer.name}: median {result['paired_ratio_median']:.3f} "
          f"(range {result['paired_ratio_min']:.3f}–{result['paired_ratio_max']:.3f}); fxremat faster in "
          f"{result['rounds_fxremat_faster']} of {args.rounds} rounds")
    if variant:
        v = result["variant"]
        print(f"variant ({'same plans' if v['same_plans'] else 'other plans'}) "
              f"paired ÷ fxremat: median {v['paired_vs_fxremat']['median']:.3f} (quartiles "
              f"{v['paired_vs_fxremat']['q1']:.3f}–{v['paired_vs_fxremat']['q3']:.3f}), ÷ {peer.name}: median "
              f"{v['paired_vs_peer']['median']:.3f}")
    if args.out:
        results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
