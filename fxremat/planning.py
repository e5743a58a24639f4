"""Ask before training: ``fxremat.plan(model, example_inputs, options)`` plans a model's
compiled graphs without a training step, and raises fxremat's own errors unwrapped."""

from __future__ import annotations

from typing import Any

import torch

from . import _compat, inspect
from .options import Options
from .plans import Plan, fxremat_error


def plan_model(model: torch.nn.Module, example_inputs: Any, options: dict | None = None) -> list[Plan]:
    """The plans fxremat makes for ``model`` called on ``example_inputs`` under ``options``
    (those of ``torch.compile(model, backend="fxremat", options=...)``), one per compiled
    graph (a graph break makes two).

    The model's forward runs once, compiled as training would compile it (Inductor, or
    op by op with ``compiler="eager"``): planning happens when the forward is compiled. No
    backward runs and no parameter changes; the compile caches are bypassed, so every
    graph is planned. With ``debug_dir`` the plans' files are written as in training
    (``fxremat explain DEBUG_DIR`` reports them). In a job of several ranks
    (``torch.distributed``), call it on every rank: each graph's plan is compared across
    ranks (``fxremat.ranks``), so a call on one rank alone waits for the others.

    Parameters
    ----------
    model : torch.nn.Module (or a callable)
    example_inputs : a tensor, or a tuple or list of the positional arguments
    options : dict, optional

    Returns
    -------
    list of fxremat.Plan
        In the order the graphs were compiled.

    Raises
    ------
    fxremat.BudgetError
        No plan fits the budget (itself, not wrapped in Dynamo's ``BackendCompilerFailed``).
    fxremat.OptionError
        Bad options, before anything is compiled.
    RuntimeError
        torch.compile compiled no graph (Dynamo skipped the model's frame).
    """
    Options.from_user(options)  # bad options fail here, not inside Dynamo
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    first = inspect.plan_count()
    compiled = torch.compile(_fresh_caller(model), backend="fxremat", options=dict(options or {}))
    with _compat.autograd_cache_disabled(), torch.enable_grad():
        try:
            compiled(*args)
        except Exception as error:  # noqa: BLE001 - unwrapped when it is fxremat's
            inner = fxremat_error(error)
            if inner is None:
                raise
            raise inner.with_traceback(inner.__traceback__) from None
    plans = inspect.plans_since(first)
    if not plans:
        raise RuntimeError("fxremat.plan: torch.compile ran the model without compiling a graph to plan "
                           "(Dynamo's warnings above say why: a skipped frame, or no tensor operation)")
    return plans


def _fresh_caller(model):
    """``model`` behind a function whose code object is new at every call. Dynamo keeps its
    compiled entries on a code object and stops compiling one after ``recompile_limit`` (8)
    entries: every ``fxremat.plan`` of one model with other options adds one, so the ninth ran
    the model uncompiled and planned nothing."""
    def call(*args, **kwargs):
        return model(*args, **kwargs)

    call.__code__ = call.__code__.replace()  # a copy: its own (empty) cache
    return call
