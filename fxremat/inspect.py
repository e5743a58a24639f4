"""What fxremat did: the plans of this process's compiled graphs, and debug files.

``fxremat.inspect.plans()`` lists the plans made so far (newest last);
with the ``debug_dir`` option each compiled graph also writes
``<debug_dir>/<n>-<graph_id>/{forward.py,backward.py,plan.json}``.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import pickle

from . import report
from .plans import Plan

_PLANS: collections.deque[Plan] = collections.deque(maxlen=256)
_COUNTER = itertools.count()
_RECORDED = 0  # plans recorded in this process
_COMPILED = 0  # graphs handed to the fxremat backend in this process


class Plans(list):
    """``plans()``'s list: an index past its end says why no plan is there, when that is
    because torch reused a compiled artifact or compiled no training graph."""

    def __getitem__(self, index):
        try:
            return super().__getitem__(index)
        except IndexError:
            if len(self) == 0 and _COMPILED:
                raise IndexError(_why_none()) from None
            raise


def _why_none() -> str:
    return (f"fxremat.inspect.plans() is empty, yet {_COMPILED} graph(s) were compiled with backend='fxremat' in "
            "this process: torch took them from its AOTAutograd cache (compiled in an earlier process), which "
            "skips planning, or they ran without gradients (an inference graph is not partitioned). To see "
            "plans: fxremat.plan(model, example_inputs, options), options={'debug_dir': ...} (never cached), "
            "or torch._functorch.config.enable_autograd_cache = False.")


def plans() -> list[Plan]:
    """Plans made in this process, oldest first (the last 256). A graph compiled from
    torch's AOTAutograd cache has none (it was planned by an earlier process): indexing an
    empty list says so."""
    return Plans(_PLANS)


def clear() -> None:
    _PLANS.clear()


def plan_count() -> int:
    """How many plans this process has recorded (``plans_since`` reads those after)."""
    return _RECORDED


def plans_since(count: int) -> list[Plan]:
    """The plans recorded after ``plan_count()`` returned ``count`` (the last 256 at most)."""
    newer = _RECORDED - count
    return Plans(list(_PLANS)[-newer:] if newer > 0 else [])


def compiled() -> None:
    """The fxremat backend was handed a graph (for ``plans()``'s message)."""
    global _COMPILED
    _COMPILED += 1


def record(plan: Plan, debug_dir: str | None) -> str | None:
    """Keep ``plan``; with ``debug_dir``, write its files there and return their folder."""
    global _RECORDED
    _PLANS.append(plan)
    _RECORDED += 1
    if debug_dir is None:
        return None
    folder = os.path.join(debug_dir, f"{next(_COUNTER):03d}-{plan.graph_id}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "forward.py"), "w") as f:
        f.write(_module_source("forward", plan.forward_code))
    with open(os.path.join(folder, "backward.py"), "w") as f:
        f.write(_module_source("backward", plan.backward_code))
    with open(os.path.join(folder, report.PLAN_FILE), "w") as f:
        json.dump(plan.to_json(), f, indent=1)
    if plan.timeline.steps:
        with open(os.path.join(folder, report.SNAPSHOT_FILE), "wb") as f:
            pickle.dump(report.memory_snapshot(plan), f)
    return folder


def _module_source(kind: str, code: str) -> str:
    return (
        f'"""fxremat {kind} graph (readable form of the FX graph handed to the compiler)."""\n'
        "import torch\nfrom torch import device\n"
        "aten = torch.ops.aten\nprims = torch.ops.prims\n\n"
        f"{code.strip()}\n"
    )
