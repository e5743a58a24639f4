"""The benchmark frontier's outputs: ``frontier.csv``, ``frontier.json``, ``summary.md`` and one
plot per model, from the rows of ``frontier_run`` (and the run's ``meta``).

- :func:`write_outputs`: all of them into a folder (``python bench/frontier.py --summarize
  frontier.json`` rebuilds them from a JSON);
- :func:`summarize`: the summary's numbers (the JSON's ``summary``, each entry tagged with its
  ``table``: ``targets``, ``at_ckpt_blocks``, ``matched``), :func:`summary_markdown` its text;
- :func:`write_plots`: step time against measured peak, per model (needs matplotlib).

What the tables hold is described in ``bench/frontier.py``'s docstring and in ``summary.md``.
"""

from __future__ import annotations

import csv
import os
from typing import Any

import results_io
from frontier_child import least_budget_bytes
from frontier_strategies import strategy_family

MIB = 2**20


def first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


# =========================================================================================
# Writing the files: CSV, JSON, summary.md, plots
# =========================================================================================

CSV_FIELDS = ["model", "name", "kind", "budget", "budget_bytes", "match", "segments", "solver", "status", "peak_mib",
              "rss_peak_mib",
              "baseline_mib", "step_ms", "step_ms_source", "step_ms_isolated", "step_ms_interleaved", "compile_s",
              "solve_s", "fx_solve_s", "partitions", "fx_solvers", "fx_budget_mib", "fx_predicted_peak_mib", "fx_floor_mib",
              "fx_recomputed_ops",
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
        row["fx_floor_mib"] = "/".join(str(mib(p.get("floor_bytes"))) for p in plans)
        row["fx_recomputed_ops"] = "/".join(str(p["recomputed_ops"]) for p in plans)
    for k in ("step_ms", "step_ms_isolated", "step_ms_interleaved", "compile_s", "solve_s", "fx_solve_s",
              "loss_rel_diff_vs_eager"):
        if isinstance(row.get(k), float):
            row[k] = float(f"{row[k]:.6g}")
    if row.get("error"):
        row["error"] = row["error"].replace("\n", " ")[:500]
    return row


def write_outputs(data: dict, out_dir: str, plots: bool = True) -> None:
    """``frontier.json`` (``data`` with its ``summary`` made again), ``frontier.csv``, ``summary.md``
    and, with ``plots``, ``<model>.png``. The JSON's ``meta`` is the run's own (made by
    ``bench/frontier.py`` with ``results_io.metadata``), also when re-summarizing an older file."""
    os.makedirs(out_dir, exist_ok=True)
    data["summary"] = summarize(data["rows"])
    results_io.write_json(os.path.join(out_dir, "frontier.json"), data, add_metadata=False)
    with open(os.path.join(out_dir, "frontier.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in data["rows"]:
            writer.writerow(_csv_row(r))
    results_io.write_text(os.path.join(out_dir, "summary.md"), summary_markdown(data))
    if plots:
        write_plots(data, out_dir)


# =========================================================================================
# The summary's numbers
# =========================================================================================


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
    return f"{r['status']}: {first_line(r.get('error'))[:300]}"


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
        # The step's floor: the largest of its graphs' (what no plan of any graph goes under).
        plans = least.get("fx_plans") or []
        floors = [p["floor_bytes"] for p in plans if p.get("floor_bytes") is not None]
        entry["floor_bytes"] = max(floors) if floors else None
        entry["min_predicted_bytes"] = max((p["predicted_peak_bytes"] for p in plans), default=None)
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


# =========================================================================================
# summary.md
# =========================================================================================


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
            lines.append(f"- {r['model']} / {r['name']}: {r['status']} — {first_line(r.get('error'))[:300]}")
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


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.2f}"


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
        "at most `ckpt_blocks`'. *Floor*: what no plan goes under (`plan.notes[\"floor_bytes\"]`, the largest "
        "of the step's graphs'); *predicted*: `fxremat_min`'s predicted peak.", "",
        "| model | ckpt_blocks | fxremat_at_ckpt_blocks | ÷ time | ÷ peak | PyTorch budget ≤ ckpt_blocks' peak | "
        "÷ time | fxremat_min | predicted (MiB) | floor (MiB) | ÷ peak | ÷ time | fastest fxremat ≤ ckpt_blocks' peak "
        "| ÷ time |",
        "|---|---|---|---:|---:|---|---:|---|---:|---:|---:|---:|---|---:|",
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
            f"| {_mib(e.get('min_predicted_bytes'))} | {_mib(e.get('floor_bytes'))} "
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


# =========================================================================================
# Plots
# =========================================================================================


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
            families.setdefault(strategy_family(r), []).append(r)
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
