"""See a plan: ``explain(plan)`` gathers what a report shows, ``write_report`` writes it.

From Python, ``fxremat.explain(plan)`` takes a ``Plan`` (``fxremat.inspect.plans()``) or a
``plan.json`` a ``debug_dir`` holds and returns plain data:

* ``summary``: solver, budget, predicted peak, estimated step time (``Context.estimate``,
  the step time ``auto`` compares solvers by), floor, saved bytes against PyTorch's default;
* ``timeline``: the predicted live bytes of each step, by kind (``timeline.KINDS``), its
  phase and module, the peak and the budget;
* ``layers``: the plan by layer (module path up to its first index, "blocks.3"): bytes
  saved, ops recomputed and how many times, their estimated time;
* ``tradeoff``: other budgets' plans (``fxremat.tradeoff``, made when ``debug_dir`` is set);
* ``measured``: a measured step (``fxremat.measure.record_step``), when one was recorded.

``fxremat explain DEBUG_DIR`` writes ``report.html`` (self-contained: pictures inlined)
beside each graph's ``plan.json`` and an index ``DEBUG_DIR/report.html``. Each graph's
folder also has its predicted timeline in PyTorch's memory-snapshot format
(``memory_snapshot.pickle``, ``memory_snapshot``), which https://pytorch.org/memory_viz
and ``torch.cuda._memory_viz`` read.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from typing import Any

from .options import format_bytes

PLAN_FILE = "plan.json"
MEASURED_FILE = "measured.json"
REPORT_FILE = "report.html"
SNAPSHOT_FILE = "memory_snapshot.pickle"
# Colours of the timeline's kinds (timeline.KINDS), matplotlib's tab10 palette.
_COLOURS = {"saved activations": "tab:blue", "temporaries": "tab:orange", "library workspace": "tab:brown",
            "incoming gradients": "tab:purple", "gradients": "tab:green", "outputs": "tab:gray",
            "later graphs": "tab:pink"}
_REQUIRED = ("graph_id", "solver", "saved", "recomputed", "budget_bytes", "predicted_peak_bytes", "timeline", "notes")


class ExplainError(ValueError):
    """A debug directory or plan file that cannot be explained (missing, corrupt, no plans)."""


def explain(plan: Any, measured: dict | None = None) -> dict[str, Any]:
    """What a report shows of one plan, as plain data.

    Parameters
    ----------
    plan : fxremat.Plan or dict
        A plan (``fxremat.inspect.plans()``), or the dict of a ``plan.json``.
    measured : dict, optional
        A measured step (``fxremat.measure.record_step``): ``peak_bytes`` and ``live_bytes``.

    Returns
    -------
    dict
        ``summary``, ``timeline``, ``layers``, ``tradeoff`` (None without a sweep) and
        ``measured`` (None without one); see the module's docstring.

    Raises
    ------
    ExplainError
        When ``plan`` lacks what a plan has (a corrupt ``plan.json``).
    """
    data = plan.to_json() if hasattr(plan, "to_json") else plan
    if not isinstance(data, dict) or any(k not in data for k in _REQUIRED):
        missing = [k for k in _REQUIRED if not isinstance(data, dict) or k not in data]
        raise ExplainError(f"fxremat explain: not a plan (missing {', '.join(missing)})")
    timeline = _timeline(data)
    notes = data["notes"]
    sweep = notes.get("tradeoff")
    default = (sweep or {}).get("pytorch_default")
    summary = {
        "graph_id": data["graph_id"], "solver": data["solver"], "budget_bytes": data["budget_bytes"],
        "predicted_peak_bytes": data["predicted_peak_bytes"], "peak_step": timeline["peak_step"],
        "estimated_step_s": notes.get("estimated_step_s"), "floor_bytes": notes.get("floor_bytes"),
        "saved_activation_bytes": data.get("saved_activation_bytes"),
        "pytorch_default_saved_bytes": default["saved_activation_bytes"] if default else None,
        "recomputed_ops": len(data["recomputed"]), "why": notes.get("why", ""),
        "solve_seconds": data.get("solve_seconds"), "stages": data.get("stages"),
        # dynamic shapes (fxremat.dynamic): the sizes planned at, the peak at any size, where it holds
        "size_symbols": notes.get("size_symbols"), "peak_expression": notes.get("peak_expression"),
        "valid_while": notes.get("valid_while"), "assumed_sizes": notes.get("assumed_sizes"),
    }
    return {"summary": summary, "timeline": timeline, "layers": layers(data), "tradeoff": sweep,
            "measured": _measured(measured)}


def _timeline(data: dict) -> dict[str, Any]:
    records = data["timeline"]
    live = [int(r["live_bytes"]) for r in records]
    peak_index = live.index(max(live)) if live else None
    if live and max(live) != data["predicted_peak_bytes"]:
        raise ExplainError(f"fxremat explain: plan {data['graph_id']}'s timeline peaks at {max(live)} bytes, "
                           f"its predicted peak is {data['predicted_peak_bytes']}: a corrupt plan file")
    kinds = sorted({k for r in records for k in r.get("by_kind", {})}, key=lambda k: list(_COLOURS).index(k)
                   if k in _COLOURS else len(_COLOURS))
    return {
        "step": [r["step"] for r in records], "phase": [r.get("phase", "") for r in records],
        "module": [r.get("module", "") for r in records], "live_bytes": live,
        "by_kind": {k: [r.get("by_kind", {}).get(k, 0) for r in records] for k in kinds},
        "peak_index": peak_index, "peak_step": records[peak_index]["step"] if records else None,
        "peak_bytes": max(live) if live else 0, "budget_bytes": data["budget_bytes"],
    }


def layer_of(module: str) -> str:
    """The layer a module path belongs to: the path up to its first index ("blocks.3" of
    "blocks.3.attn.proj"), else its first name ("tok"); "(no module)" for ""."""
    if not module:
        return "(no module)"
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return parts[0]


def layers(data: dict) -> list[dict[str, Any]]:
    """The plan by layer (``layer_of``), in the order the forward meets them: saved
    activation bytes and values, saved input bytes (parameters, the batch: saving them
    allocates nothing), recomputed ops (distinct forward ops), recomputations (copies: an
    op recomputed twice counts twice), the most times one op is recomputed, their
    estimated seconds, and a status: "kept" (recomputes nothing), "input only" (saves no
    activation of its own: recomputed from what enters it), "partly recomputed", or "nothing
    saved"."""
    order: dict[str, None] = {}
    for record in data["timeline"]:
        if record.get("phase") == "forward":
            order.setdefault(layer_of(record.get("module", "")), None)
    rows: dict[str, dict[str, Any]] = {}

    def row(layer: str) -> dict[str, Any]:
        order.setdefault(layer, None)
        return rows.setdefault(layer, {"layer": layer, "saved_bytes": 0, "saved_values": 0, "saved_input_bytes": 0,
                                       "recomputed_ops": 0, "recomputations": 0, "most_times": 0,
                                       "recompute_estimated_s": 0.0, "_sources": {}})

    for entry in data["saved"]:
        r = row(layer_of(entry.get("module", "")))
        if entry.get("input"):
            r["saved_input_bytes"] += entry["bytes"]
        else:
            r["saved_bytes"] += entry["bytes"]
            r["saved_values"] += 1
    for entry in data["recomputed"]:
        r = row(layer_of(entry.get("module", "")))
        source = entry.get("source", entry["name"])
        r["_sources"][source] = r["_sources"].get(source, 0) + 1
        r["recomputations"] += 1
        r["recompute_estimated_s"] += entry.get("estimated_s", 0.0)
    result = []
    for layer in order:
        if layer not in rows:
            continue
        r = rows[layer]
        sources = r.pop("_sources")
        r["recomputed_ops"], r["most_times"] = len(sources), max(sources.values(), default=0)
        r["status"] = ("kept" if not sources else "input only" if r["saved_bytes"] == 0 else "partly recomputed")
        if not sources and r["saved_bytes"] == 0:
            r["status"] = "nothing saved"
        result.append(r)
    return result


def _measured(measured: dict | None) -> dict | None:
    if measured is None:
        return None
    live = [int(b) for b in measured.get("live_bytes", [])]
    peak = int(measured["peak_bytes"])
    if live and max(live) != peak:
        raise ExplainError(f"fxremat explain: the measured curve peaks at {max(live)} bytes, the measurement "
                           f"says {peak}: a corrupt {MEASURED_FILE}")
    return {**measured, "live_bytes": live, "peak_bytes": peak,
            "peak_index": live.index(peak) if live else None}


# --- files -----------------------------------------------------------------------------------------


def load_plan(path: str) -> dict:
    """A ``plan.json`` (a file, or the folder holding one), read (``explain`` checks it).
    Raises ``ExplainError`` for a missing or corrupt file."""
    file = os.path.join(path, PLAN_FILE) if os.path.isdir(path) else path
    try:
        with open(file) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ExplainError(f"fxremat explain: no {PLAN_FILE} in {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ExplainError(f"fxremat explain: {file} is not a plan file (corrupt JSON: {error})") from None
    return data


def plan_folders(debug_dir: str) -> list[str]:
    """The folders of ``debug_dir`` holding a ``plan.json``, oldest first. Raises
    ``ExplainError`` for a missing directory or one with no plans."""
    if not os.path.isdir(debug_dir):
        raise ExplainError(f"fxremat explain: {debug_dir} is not a directory")
    found = sorted(os.path.join(debug_dir, d) for d in os.listdir(debug_dir)
                   if os.path.isfile(os.path.join(debug_dir, d, PLAN_FILE)))
    if not found:
        raise ExplainError(f"fxremat explain: no plans in {debug_dir}: it has no <n>-<graph id>/{PLAN_FILE}. "
                           "Compile with options={'debug_dir': ...} and run a step first")
    return found


def load_measured(folder: str) -> dict | None:
    """The measured step in ``folder/measured.json`` (``fxremat.measure.record_step``), or None."""
    file = os.path.join(folder, MEASURED_FILE)
    if not os.path.isfile(file):
        return None
    try:
        with open(file) as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ExplainError(f"fxremat explain: {file} is corrupt ({error})") from None


def write_reports(debug_dir: str) -> list[str]:
    """``report.html`` for each plan in ``debug_dir``, and the
    index ``debug_dir/report.html``; the paths of the reports, the index first. A step
    measured into ``debug_dir`` (``record_step``) shows beside the prediction of a lone
    graph, and in the index. Raises ``ExplainError``."""
    folders = plan_folders(debug_dir)
    measured = load_measured(debug_dir)
    reports = []
    summaries = []
    for folder in folders:
        path, report = _write_report(folder, measured if len(folders) == 1 else None)
        reports.append(path)
        summaries.append((os.path.basename(folder), report["summary"]))
    index = os.path.join(debug_dir, REPORT_FILE)
    with open(index, "w") as f:
        f.write(_index_html(summaries, _measured(measured)))
    return [index] + reports


def write_report(folder: str, measured: dict | None = None) -> str:
    """``report.html`` for the plan in ``folder`` (with ``folder/measured.json``'s curve, or
    ``measured``); its path. Raises ``ExplainError``."""
    return _write_report(folder, measured)[0]


def _write_report(folder: str, measured: dict | None) -> tuple[str, dict]:
    report = explain(load_plan(folder), load_measured(folder) or measured)
    path = os.path.join(folder, REPORT_FILE)
    with open(path, "w") as f:
        f.write(render_html(report))
    return path, report


# --- the memory-snapshot export --------------------------------------------------------------------


def memory_snapshot(plan) -> dict:
    """The predicted timeline of a ``Plan`` as a PyTorch memory snapshot
    (``torch.cuda.memory._snapshot()``'s format: no ``segments``, one device's
    ``device_traces`` of ``alloc`` and ``free_completed`` events), so that PyTorch's viewer
    (https://pytorch.org/memory_viz, ``torch.cuda._memory_viz.trace_plot``) draws it: each
    storage is one block at a made-up address, allocated and freed where the prediction
    does (``timeline.storage_events``); its frame names the storage, its kind and the step;
    ``time_us`` is the step's index."""
    from .timeline import storage_events, storage_kind

    timeline = plan.timeline
    kind = storage_kind(timeline)
    events, address, next_address = [], {}, 0
    for index, storage, nbytes in storage_events(timeline):
        step = timeline.steps[index]
        frame = {"filename": f"{storage} ({kind(storage)})", "line": index, "name": f"{step.phase} {step.name}"}
        if nbytes > 0:
            address[storage] = next_address
            next_address += nbytes
            events.append({"action": "alloc", "addr": address[storage], "size": nbytes, "stream": 0,
                           "time_us": index, "frames": [frame]})
        else:
            events.append({"action": "free_completed", "addr": address.pop(storage), "size": -nbytes, "stream": 0,
                           "time_us": index, "frames": [frame]})
    return {"segments": [], "device_traces": [events]}


# --- HTML ------------------------------------------------------------------------------------------


def render_html(report: dict) -> str:
    """A self-contained HTML page of ``explain``'s data: pictures as inline PNGs (matplotlib)."""
    s, t = report["summary"], report["timeline"]
    parts = [_HEAD.format(title=html.escape(f"fxremat plan {s['graph_id']}")),
             f"<h1>fxremat plan for graph {html.escape(s['graph_id'])}</h1>", _summary_table(s)]
    parts.append("<h2>Memory timeline (predicted)</h2>")
    parts.append(f'<img id="timeline" alt="predicted memory timeline" src="data:image/png;base64,'
                 f'{_png(_timeline_figure(t, report["measured"]))}">')
    parts.append(f"<p>Live bytes after each operation of the step, stacked by kind; peak {format_bytes(t['peak_bytes'])} "
                 f"at <code>{html.escape(str(t['peak_step']))}</code>. The budget counts what the compiled graphs "
                 "allocate above the step's inputs (parameters, the batch).</p>")
    m = report["measured"]
    if m is not None:
        parts.append(f"<p>Measured ({html.escape(str(m.get('method', '')))}, {html.escape(str(m.get('device', '')))}): "
                     f"peak {format_bytes(m['peak_bytes'])} against {format_bytes(t['peak_bytes'])} predicted "
                     f"({m['peak_bytes'] / max(t['peak_bytes'], 1):.3f}x); the lower panel, over allocator events.</p>")
    if report["tradeoff"]:
        parts.append("<h2>Trade-off: other budgets</h2>")
        parts.append(f'<img id="tradeoff" alt="trade-off curve" src="data:image/png;base64,'
                     f'{_png(_tradeoff_figure(report["tradeoff"], s))}">')
        parts.append(_tradeoff_table(report["tradeoff"]))
    else:
        parts.append("<p>No trade-off curve: it is swept when the graph is planned with <code>debug_dir</code> set.</p>")
    parts.append("<h2>Plan by layer</h2>")
    parts.append(_layers_table(report["layers"]))
    parts.append("</body></html>\n")
    return "\n".join(parts)


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; white-space: nowrap; }}
td:first-child, th:first-child {{ text-align: left; }}
td.text {{ text-align: left; max-width: 700px; white-space: normal; }}
img {{ max-width: 100%; }}
</style></head><body>"""


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _bytes(n: int | None) -> str:
    return "" if n is None else format_bytes(n)


def _summary_table(s: dict) -> str:
    default = s["pytorch_default_saved_bytes"]
    saved = s["saved_activation_bytes"]
    against = (f"{_bytes(saved)} ({saved / default:.2f}x PyTorch's default partition, {_bytes(default)})"
               if default else _bytes(saved))
    rows = [("solver", s["solver"]), ("budget", _bytes(s["budget_bytes"]) or "none"),
            ("predicted peak", f"{_bytes(s['predicted_peak_bytes'])} at {s['peak_step']}"),
            ("estimated step time", _ms(s["estimated_step_s"]) + " (fxremat's cost model, estimate_step)"
             if s["estimated_step_s"] is not None else "not estimated (planned without debug_dir)"),
            ("floor (no plan goes under)", _bytes(s["floor_bytes"])), ("saved activations", against),
            ("recomputed ops", str(s["recomputed_ops"])), ("stages", "" if s["stages"] is None else str(s["stages"])),
            ("planned in", "" if s["solve_seconds"] is None else f"{s['solve_seconds']:.2f} s"),
            ("why", s["why"])]
    if s.get("size_symbols"):
        rows[3:3] = [("planned at sizes", ", ".join(f"{' = '.join(v['source'][:1])} = {v['value']} ({k})"
                                                   for k, v in s["size_symbols"].items())),
                     ("peak at any size (bytes)", s["peak_expression"] or ""),
                     ("this plan runs while", " and ".join(s["valid_while"] or []))]
    if s.get("assumed_sizes"):
        rows.append(("data-dependent sizes assumed", ", ".join(f"{k} = {v['value']} ({v['from']})"
                                                                for k, v in s["assumed_sizes"].items())))
    return "<table id=\"summary\">" + "".join(
        f"<tr><th>{html.escape(k)}</th><td class=\"text\">{html.escape(str(v))}</td></tr>" for k, v in rows) + "</table>"


def _layers_table(rows: list[dict]) -> str:
    head = ("<tr><th>layer</th><th>status</th><th>saved activations</th><th>values</th><th>saved inputs</th>"
            "<th>ops recomputed</th><th>recomputations</th><th>most times</th><th>recompute time (est.)</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['layer'])}</td><td>{r['status']}</td><td>{_bytes(r['saved_bytes'])}</td>"
        f"<td>{r['saved_values']}</td><td>{_bytes(r['saved_input_bytes'])}</td><td>{r['recomputed_ops']}</td>"
        f"<td>{r['recomputations']}</td><td>{r['most_times'] or ''}</td><td>{_ms(r['recompute_estimated_s'])}</td></tr>"
        for r in rows)
    return f'<table id="layers">{head}{body}</table>'


def _tradeoff_table(sweep: dict) -> str:
    points = list(sweep["points"]) + ([sweep["pytorch_default"]] if sweep.get("pytorch_default") else [])
    head = "<tr><th>plan</th><th>solver</th><th>budget</th><th>predicted peak</th><th>estimated step</th><th>saved</th></tr>"
    body = "".join(
        f"<tr><td>{html.escape(p['label'])}</td><td>{p['solver']}</td><td>{_bytes(p['budget_bytes'])}</td>"
        f"<td>{_bytes(p['predicted_peak_bytes'])}</td><td>{_ms(p['estimated_step_s'])}</td>"
        f"<td>{_bytes(p['saved_activation_bytes'])}</td></tr>" for p in sorted(points, key=lambda p: -p["predicted_peak_bytes"]))
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in sweep.get("notes", []))
    return (f'<table id="tradeoff-points">{head}{body}</table><p>Swept with solver {html.escape(sweep["solver"])}; '
            "per-block checkpointing is not estimated here (it needs the model's blocks, not the graph).</p>" + notes)


def _index_html(summaries: list[tuple[str, dict]], measured: dict | None) -> str:
    rows = "".join(
        f"<tr><td><a href=\"{html.escape(folder)}/{REPORT_FILE}\">{html.escape(folder)}</a></td><td>{s['solver']}</td>"
        f"<td>{_bytes(s['budget_bytes']) or 'none'}</td><td>{_bytes(s['predicted_peak_bytes'])}</td>"
        f"<td>{_ms(s['estimated_step_s'])}</td><td>{_bytes(s['saved_activation_bytes'])}</td></tr>"
        for folder, s in summaries)
    step = "" if measured is None else (f"<p>Measured step ({html.escape(str(measured.get('method', '')))}): peak "
                                        f"{format_bytes(measured['peak_bytes'])}.</p>")
    return (_HEAD.format(title="fxremat plans") + "<h1>fxremat plans</h1><table id=\"graphs\"><tr><th>graph</th>"
            "<th>solver</th><th>budget</th><th>predicted peak</th><th>estimated step</th><th>saved activations</th></tr>"
            + rows + "</table>" + step + "</body></html>\n")


def _png(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ExplainError("fxremat explain draws with matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_MIB = 2 ** 20


def _timeline_figure(t: dict, measured: dict | None):
    plt = _pyplot()
    rows = 2 if measured is not None and measured["live_bytes"] else 1
    figure, axes = plt.subplots(rows, 1, figsize=(11, 4.2 * rows), squeeze=False)
    ax = axes[0][0]
    x = range(len(t["live_bytes"]))
    if t["by_kind"]:
        ax.stackplot(x, *[[b / _MIB for b in v] for v in t["by_kind"].values()], labels=list(t["by_kind"]),
                     colors=[_COLOURS.get(k, "tab:olive") for k in t["by_kind"]], alpha=0.85, linewidth=0)
    ax.plot(x, [b / _MIB for b in t["live_bytes"]], color="black", linewidth=0.8, label="predicted total")
    if t["budget_bytes"] is not None:
        ax.axhline(t["budget_bytes"] / _MIB, color="red", linestyle="--", linewidth=1, label="budget")
    if t["peak_index"] is not None:
        ax.plot([t["peak_index"]], [t["peak_bytes"] / _MIB], marker="v", color="red", markersize=9,
                label=f"peak {format_bytes(t['peak_bytes'])}")
    backward = next((i for i, p in enumerate(t["phase"]) if p == "backward"), None)
    if backward is not None:
        ax.axvspan(backward, len(t["phase"]), color="grey", alpha=0.08)
        ax.text(backward, 0, " backward", va="bottom", fontsize=9, color="dimgrey")
    _layer_ticks(ax, t["module"])
    ax.set_ylabel("MiB")
    ax.set_xlabel("operation (forward, then backward); ticks: where a layer starts")
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.set_title("predicted live memory")
    if rows == 2:
        mx = axes[1][0]
        live = measured["live_bytes"]
        mx.plot(range(len(live)), [b / _MIB for b in live], color="tab:blue", linewidth=0.8, label="measured")
        mx.plot([measured["peak_index"]], [measured["peak_bytes"] / _MIB], marker="v", color="red", markersize=9,
                label=f"measured peak {format_bytes(measured['peak_bytes'])}")
        mx.axhline(t["peak_bytes"] / _MIB, color="black", linestyle=":", linewidth=1,
                   label=f"predicted peak {format_bytes(t['peak_bytes'])}")
        if t["budget_bytes"] is not None:
            mx.axhline(t["budget_bytes"] / _MIB, color="red", linestyle="--", linewidth=1, label="budget")
        mx.set_ylabel("MiB")
        mx.set_xlabel("allocator event")
        mx.legend(loc="upper left", fontsize=8)
        mx.set_title(f"measured live memory ({measured.get('method', '')})")
    figure.tight_layout()
    return figure


def _layer_ticks(ax, modules: list[str], most: int = 40) -> None:
    """x ticks where the step's layer changes (each layer once in the forward, once in the
    backward), at most about ``most`` of them (a 32-layer model's are thinned)."""
    starts, seen = [], None
    for i, module in enumerate(modules):
        layer = layer_of(module) if module else None
        if layer and layer != seen:
            starts.append((i, layer))
        seen = layer or seen
    # Ticks closer than 1/most of the axis apart would overlap: the later one is dropped.
    gap = max(1, len(modules) // most)
    kept: list[tuple[int, str]] = []
    for i, layer in starts:
        if not kept or i - kept[-1][0] >= gap:
            kept.append((i, layer))
    starts = kept
    ax.set_xticks([i for i, _ in starts])
    ax.set_xticklabels([name for _, name in starts], rotation=90, fontsize=7)


def _tradeoff_figure(sweep: dict, s: dict):
    from .tradeoff import curve

    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(8, 4.5))
    points = sweep["points"]
    frontier = curve(points)
    ax.plot([p["predicted_peak_bytes"] / _MIB for p in frontier], [p["estimated_step_s"] * 1e3 for p in frontier],
            color="tab:blue", marker="o", label=f"fxremat ({sweep['solver']}) across budgets")
    others = [p for p in points if p not in frontier]
    if others:
        ax.scatter([p["predicted_peak_bytes"] / _MIB for p in others], [p["estimated_step_s"] * 1e3 for p in others],
                   color="tab:blue", alpha=0.4, label="dominated plans")
    ax.plot([s["predicted_peak_bytes"] / _MIB], [s["estimated_step_s"] * 1e3], marker="*", color="red", markersize=16,
            linestyle="none", label="this plan")
    if sweep.get("pytorch_default"):
        d = sweep["pytorch_default"]
        ax.plot([d["predicted_peak_bytes"] / _MIB], [d["estimated_step_s"] * 1e3], marker="s", color="tab:orange",
                markersize=9, linestyle="none", label="PyTorch default partition")
    if s["budget_bytes"] is not None:
        ax.axvline(s["budget_bytes"] / _MIB, color="red", linestyle="--", linewidth=1, label="budget")
    if s["floor_bytes"]:
        ax.axvline(s["floor_bytes"] / _MIB, color="grey", linestyle=":", linewidth=1, label="floor")
    ax.set_xlabel("predicted peak (MiB)")
    ax.set_ylabel("estimated step time (ms, fxremat's cost model)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure
