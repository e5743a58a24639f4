"""Writing benchmark results (the one place the bench scripts write their JSON and text files),
and running a bench script's measured child in a fresh process.

    import results_io
    results_io.write_json("bench/results/cpu/x.json", {"rows": rows})   # + the run's metadata
    results_io.write_text("bench/results/cpu/x.md", markdown)
    row = results_io.run_child(__file__, spec)      # the script again, with --child, in a fresh process

Every results file carries the same metadata (:func:`metadata`): the command, the date, torch,
Python, the machine and CPU, the CPU count and the git state of the measured code.
:func:`write_json` fills in the keys the data lacks (in ``data["meta"]`` when the data has
one, else at the top level); a key the script set keeps its value. Files are written with
``indent=1``, their folder made first. Only the standard library is imported here, so that a
script can import this before ``fxremat`` (``bench/frontier.py`` chooses where that comes from).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MEASURED_CODE = ("fxremat", "passes", "bench/*.py")  # whose uncommitted changes a result records


def command(argv: list[str] | None = None, script: str | None = None) -> str:
    """``python bench/<script>.py <arguments>`` as the user ran it (arguments unquoted)."""
    script = os.path.basename(script or sys.argv[0])
    return " ".join([f"python bench/{script}", *(sys.argv[1:] if argv is None else argv)])


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            return names[0]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")  # imported already: the version in use; else what is installed
    if torch is not None:
        return torch.__version__
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001
        return None


def machine() -> dict:
    """The machine in detail: CPU, CPU count, platform, Python, torch, transformers, memory, GPU."""
    import torch

    meta = {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
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


def git_state() -> dict:
    """This checkout's commit, and the measured code's files that differ from it."""
    def git(*cmd):
        try:  # no strip(): the first status line may start with a space
            done = subprocess.run(["git", "-C", ROOT, *cmd], capture_output=True, text=True, timeout=30)
            return done.stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""
    dirty = git("status", "--porcelain", "--", *MEASURED_CODE)
    # A copy without .git (the GPU machine gets the working tree only): the commit its sender named.
    commit = git("rev-parse", "HEAD") or os.environ.get("FXREMAT_SOURCE_COMMIT", "")
    return {"commit": commit, "fxremat_dirty_files": dirty.splitlines()}


def metadata(argv: list[str] | None = None) -> dict:
    """The metadata of every results file (``argv``: the script's arguments, default ``sys.argv[1:]``)."""
    return {"command": command(argv), "date": datetime.date.today().isoformat(), "torch": _torch_version(),
            "python": platform.python_version(), "machine": platform.machine(), "cpu": cpu_name(),
            "cpus": os.cpu_count(), "git": git_state()}


def _make_folder(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def write_json(path: str, data: dict, add_metadata: bool = True) -> None:
    """``data`` as JSON (``indent=1``; what JSON cannot hold as its ``str``) into ``path``. With
    ``add_metadata``, the keys of :func:`metadata` that the data lacks come first: in
    ``data["meta"]`` when it is a dict, else at the top level. ``data`` itself is not changed."""
    if add_metadata:
        extra = metadata()
        if isinstance(data.get("meta"), dict):
            data = {**data, "meta": {**{k: v for k, v in extra.items() if k not in data["meta"]}, **data["meta"]}}
        else:
            data = {**{k: v for k, v in extra.items() if k not in data}, **data}
    _make_folder(path)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


def write_text(path: str, text: str) -> None:
    """``text`` into ``path`` (Markdown, a table), its folder made first."""
    _make_folder(path)
    with open(path, "w") as f:
        f.write(text)


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """``--out`` (the results folder, default ``bench/results/cpu``), ``--name`` (the files'
    stem, default ``name``) and the hidden ``--child`` (a spec as JSON: ``run_child``'s)."""
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cpu"))
    parser.add_argument("--name", default=name)
    parser.add_argument("--child", help=argparse.SUPPRESS)


def unqualified(line: str) -> str:
    """An exception line without its module ("fxremat.plans.BudgetError: ..." reads
    "BudgetError: ...", as when Dynamo's wrapper printed fxremat's errors)."""
    return re.sub(r"^[\w.]*\.(\w*(?:Error|Exception|NotApplicable)\b)", r"\1", line)


def run_child(script: str, spec: dict) -> dict:
    """``python <script> --child <spec as JSON>`` in a fresh process: the row its last line
    of output holds, or ``spec`` with its error as ``error``: the last line of its errors that
    names an exception (Dynamo prints advice after the exception it wraps), else the last."""
    done = subprocess.run([sys.executable, os.path.abspath(script), "--child", json.dumps(spec)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        named = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
        return {**spec, "error": unqualified((named or lines or ["failed"])[-1])}
    return json.loads(done.stdout.strip().splitlines()[-1])
