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

from .plan import Plan

_PLANS: collections.deque[Plan] = collections.deque(maxlen=256)
_COUNTER = itertools.count()


def plans() -> list[Plan]:
    """Plans made in this process, oldest first (the last 256)."""
    return list(_PLANS)


def clear() -> None:
    _PLANS.clear()


def record(plan: Plan, debug_dir: str | None) -> str | None:
    _PLANS.append(plan)
    if debug_dir is None:
        return None
    folder = os.path.join(debug_dir, f"{next(_COUNTER):03d}-{plan.graph_id}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "forward.py"), "w") as f:
        f.write(_module_source("forward", plan.forward_code))
    with open(os.path.join(folder, "backward.py"), "w") as f:
        f.write(_module_source("backward", plan.backward_code))
    with open(os.path.join(folder, "plan.json"), "w") as f:
        json.dump(plan.to_json(), f, indent=1)
    return folder


def _module_source(kind: str, code: str) -> str:
    return (
        f'"""fxremat {kind} graph (readable form of the FX graph handed to the compiler)."""\n'
        "import torch\nfrom torch import device\n"
        "aten = torch.ops.aten\nprims = torch.ops.prims\n\n"
        f"{code.strip()}\n"
    )
