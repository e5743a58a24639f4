"""Running one model of the benchmark frontier: its strategies' measuring processes, the byte
budgets that depend on other rows, and the interleaved timing rounds.

:func:`run_model` gives every strategy a fresh process (``frontier_child.Child``): eager and
``torch.compile`` default first and alone (they fill the Inductor cache the others share), then
the rest ``--jobs`` at a time, one fxremat solver's fractions in turn from the highest (a lower
one is skipped once one is infeasible); ``fxremat_at_P`` waits for P's measured peak
(:func:`run_model`'s ``measure_matched``) and ``fxremat_min`` probes for its least feasible
budget (``measure_least``). :func:`interleave` then times the live processes in shuffled
rounds. Each strategy gives one row (a dict): what the tables, plots and JSON of
``frontier_report`` are made of.
"""

from __future__ import annotations

import concurrent.futures
import random
import shutil
import statistics
import tempfile
import threading
import time

from frontier_child import Child, least_budget_bytes
from frontier_report import MIB, first_line, fmt
from frontier_strategies import skip_reason

LEAST_PROBE_BYTES = 1  # fxremat_min's first budget: below any plan; its BudgetError names the floor, the next one the least plan
LEAST_MAX_PROBES = 5


def run_model(model_name: str, strategies: list[dict], args, shared_cache: str) -> list[dict]:
    import frontier_models

    rows = []
    base = {"model": model_name, "scale": args.scale, "device": args.device, "dtype": args.dtype,
            "autocast": getattr(args, "autocast", None)}
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
        reason = skip_reason(strategy, args.device)
        if reason:
            row.update(status="skipped", error=reason)
            done[row["name"]].set()
            print(f"{model_name:10s} {strategy['name']:22s} skipped: {reason[:100]}", flush=True)
            continue
        spec = {"model": model_name, "scale": args.scale, "device": args.device, "dtype": args.dtype,
                "autocast": getattr(args, "autocast", None),
                "overrides": args.sizes.get(model_name),
                "threads": args.threads, "warmup": args.warmup, "steps": args.steps, "strategy": strategy,
                "fx_options": args.fx_options}
        pending.append((row, spec))
    by_name = {r["name"]: r for r in rows}

    children: dict[str, tuple[Child, str]] = {}  # live processes, for the interleaved timing rounds
    lock = threading.Lock()

    def measure(row: dict, spec: dict, probe: bool = False) -> None:
        cache = shared_cache if args.cache == "shared" else tempfile.mkdtemp(prefix="frontier-inductor-cache-")
        child = Child(spec, args.threads, cache)
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
                  f"compile {row['compile_s']:6.1f} s  solve {fmt(row['solve_s'], '.3f')} s  ({wall:.0f} s)", flush=True)
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
                                                   f"{first_line(peer.get('error'))[:300]})")
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
                           "error": first_line(row["error"])[:500]})
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
                                                       f"failed with BudgetError: {first_line(infeasible['error'])}")
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
