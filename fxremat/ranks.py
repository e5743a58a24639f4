"""The same plan on every rank of a distributed job.

    fwd, bwd, plan = ranks.same_plan(ctx, plan_with)   # plan_with(ctx) -> (fwd, bwd, plan)

A plan depends on the graph, the options and the cost model's figures. The figures can be
local to a rank: ``cost_model="measured"`` times kernels on each rank's device and load, a
CPU profile is calibrated on each machine, and ``compiler="eager"`` measures library calls'
scratch memory on each rank. Ranks whose plans differ compile different
graphs: they save and recompute different values, and a budget feasible on one rank can
raise a ``BudgetError`` on another, which leaves the others waiting in their next
collective. So when ``torch.distributed`` runs more than one rank, each graph's outcome is
compared across ranks (one ``all_gather_object``, a short key per rank). When the outcomes
differ, every rank plans again with rank 0's figures: its device profile, the kernel times
its timer used and the library calls' scratch bytes it measured (``workspace.py``). The
search is deterministic, so those figures give rank 0's outcome. If ranks still differ, all
of them raise together rather than diverge.

Every rank plans each graph it compiles, in the same order, so the collectives here match up,
as PyTorch's own partitioner's decision sync does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Callable

from . import workspace
from ._compat import real_tensors
from .plans import BudgetError


def world_size() -> int:
    """Ranks in the default process group (1 without ``torch.distributed`` or before it starts)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def plan_key(plan) -> str:
    """What must be equal on every rank: the solver, what is saved and recomputed, in which
    order, and the predicted peak and budget."""
    text = json.dumps([plan.solver, [d["name"] for d in plan.saved], [d["name"] for d in plan.recomputed],
                       plan.sequence, plan.predicted_peak_bytes, plan.budget_bytes], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _outcome(ctx, plan_with: Callable) -> tuple[tuple | BaseException, str]:
    """``plan_with(ctx)``'s result or its BudgetError, and that outcome's key."""
    try:
        result = plan_with(ctx)
    except BudgetError as error:
        # Not the message: it names the graph, whose fingerprint differs on ranks whose code
        # indexes by rank (``x.chunk(world)[rank]``) though their plans agree.
        return error, f"BudgetError: least {error.least_bytes}, floor {error.floor_bytes}"
    return result, plan_key(result[2])


def _gather(key: str) -> list[str]:
    import torch.distributed as dist

    keys: list = [None] * dist.get_world_size()
    with real_tensors():  # the partitioner runs under the compiler's fake mode; collectives need real tensors
        dist.all_gather_object(keys, key)
    return keys


def same_plan(ctx, plan_with: Callable) -> tuple:
    """``plan_with(ctx)`` (the forward, backward and plan of ``ctx``'s graph), the same on
    every rank; with one rank, just that. Raises what ``plan_with`` raises (a ``BudgetError``
    on every rank alike), or ``RuntimeError`` when rank 0's figures still leave the ranks
    apart."""
    import torch.distributed as dist

    if world_size() == 1:
        return plan_with(ctx)
    outcome, key = _outcome(ctx, plan_with)
    keys = _gather(key)
    if len(set(keys)) > 1:
        shared = [ctx.figures() if dist.get_rank() == 0 else None]
        with real_tensors():
            dist.broadcast_object_list(shared, src=0)
        profile, timings, scratch = shared[0]
        if key != keys[0]:
            workspace.adopt(scratch)
            # A fresh memo too: what the first planning worked out was priced with this rank's figures.
            ctx = dataclasses.replace(ctx, profile=profile, timer=ctx.frozen_timer(timings), _costs=None, memo={})
            outcome, key = _outcome(ctx, plan_with)
            if not isinstance(outcome, BaseException):
                outcome[2].notes["ranks"] = f"planned again with rank 0's cost figures: rank {dist.get_rank()}'s differed"
        keys = _gather(key)
        if len(set(keys)) > 1:
            raise RuntimeError(f"fxremat: graph {ctx.graph_id} gets different plans on different ranks even with rank "
                               f"0's cost figures (plan keys by rank: {keys}); please report this. Ranks whose "
                               "compiled graphs differ can wait on each other's collectives.")
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


__all__ = ["plan_key", "same_plan", "world_size"]
