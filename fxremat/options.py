"""User options of the fxremat backend: parsing, validation, and the cache key.

Options arrive through ``torch.compile(model, backend="fxremat", options={...})``.
Every key is checked; an unknown key or a bad value raises ``OptionError`` naming
the option and what is allowed. Nothing is forwarded to Inductor implicitly:
Inductor settings go, explicitly, under the ``"inductor"`` key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import re
from collections.abc import Mapping
from typing import Any

from .strategies import SOLVERS as _REGISTRY

SOLVERS = tuple(_REGISTRY)  # one registry: fxremat/strategies/__init__.py
COMPILERS = ("inductor", "eager")
# How Rotor, Checkmate and TWRemat cost the stages (fxremat/costmodel.py): "roofline" from
# FLOPs and bytes; "measured" times the library kernels (matmuls, convolutions, attention)
# on the device, cached on disk, and keeps the roofline for fused kernels.
COST_MODELS = ("roofline", "measured")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}


class OptionError(ValueError):
    """A user option is unknown or has a value fxremat does not accept."""


# What a float budget means: the one wording, the README's, for every message.
FRACTION = ("a fraction of the way from the least-memory plan's predicted peak (0.0) to the unconstrained "
            "(min-cut) plan's (1.0)")
BUDGET_FORMS = f"bytes (an int, or a string with a unit such as '6GiB'), or a float in [0, 1]: {FRACTION}"


def parse_bytes(text: str) -> int:
    """``"6GiB"`` -> 6442450944, ``"500MB"`` -> 500000000, ``"1024"`` -> 1024.

    A string is bytes. What reads as a fraction ("0.5", "50%") raises ``OptionError``
    with the float to write instead."""
    percent = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", text)
    if percent:
        raise OptionError(f"memory_budget={text!r}: a fraction is given as a float, memory_budget="
                          f"{float(percent.group(1)) / 100:g} ({FRACTION}); a string is bytes")
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise OptionError(
            f"memory_budget={text!r}: expected a number of bytes with an optional unit "
            f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '6GiB' or '500MB', or a float in [0, 1]: {FRACTION}"
        )
    number = float(match.group(1))
    if not unit and (number < 1 or text.strip() == "1.0"):
        raise OptionError(f"memory_budget={text!r}: a string is bytes; for {FRACTION}, give the float "
                          f"memory_budget={number:g}, not a string")
    if not unit and not number.is_integer():
        raise OptionError(f"memory_budget={text!r}: bytes without a unit are a whole number, e.g. "
                          f"'{int(number)}'; for a fraction give a float in [0, 1]")
    value = number * _UNITS[unit]
    if value < 1:
        raise OptionError(f"memory_budget={text!r}: a budget must be at least 1 byte")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Budget:
    """A memory budget: either absolute bytes or a fraction (``FRACTION``): 0.0 the
    least-memory plan's predicted peak, 1.0 the unconstrained plan's, in between the peak
    that far from one to the other. Every fraction can be met, and the budget grows with it."""

    bytes: int | None = None
    fraction: float | None = None
    # Bytes the step's later graphs need while this graph is held, between its forward and
    # its backward, and of those what they keep to the step's end (their parameter
    # gradients), alive through this graph's backward. Set by ``fxremat.step`` for a byte
    # budget, never by the user: the plan counts them there, beside its saved activations
    # and its outputs.
    later_graphs: int = 0
    later_graphs_kept: int = 0

    def between(self, least_bytes: int, unconstrained_bytes: int) -> int:
        """The fraction's budget in bytes, given the least-memory plan's predicted peak and
        the unconstrained plan's: never under the least, never over the unconstrained."""
        assert self.fraction is not None
        if self.fraction >= 1.0 or unconstrained_bytes <= least_bytes:
            return max(unconstrained_bytes, least_bytes)
        return least_bytes + math.floor(self.fraction * (unconstrained_bytes - least_bytes))

    def describe(self, budget_bytes: int | None = None) -> str:
        """The budget as the user gave it, with ``budget_bytes`` (what it resolved to) beside it."""
        if self.bytes is not None:
            later = (f", {format_bytes(self.later_graphs)} of it left to the step's later graphs between this "
                     f"graph's forward and backward" if self.later_graphs else "")
            return f"{self.bytes} bytes ({format_bytes(self.bytes)}{later})"
        if budget_bytes is None:
            return f"{self.fraction:g} (of the way from the least-memory plan to the unconstrained one)"
        return f"{self.fraction:g} ({format_bytes(budget_bytes)} for this graph)"


def format_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def parse_budget(value: Any) -> Budget | None:
    """The ``memory_budget`` option: bytes (an int, NumPy's too, or a string with a unit) or
    a float in [0, 1] (``FRACTION``); None for none. Raises ``OptionError``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise OptionError(f"memory_budget={value!r}: expected {BUDGET_FORMS}")
    if isinstance(value, numbers.Integral):
        if value <= 0:
            hint = "; for the least-memory plan give the float 0.0" if value == 0 else ""
            raise OptionError(f"memory_budget={value}: a byte budget must be a positive integer{hint}")
        return Budget(bytes=int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if not 0.0 <= value <= 1.0:  # nan and inf too
            hint = (f"; for bytes give an int, memory_budget={int(value)}" if math.isfinite(value) and value > 1
                    and value.is_integer() else "; bytes are an int or a string such as '6GiB'")
            raise OptionError(f"memory_budget={value!r}: a float is {FRACTION} and must lie in [0, 1]{hint}")
        return Budget(fraction=value)
    if isinstance(value, str):
        return Budget(bytes=parse_bytes(value))
    raise OptionError(f"memory_budget={value!r} ({type(value).__name__}): expected {BUDGET_FORMS}")


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated fxremat options. See the README's options table."""

    memory_budget: Budget | None = None
    solver: str = "auto"
    debug_dir: str | None = None
    compiler: str = "inductor"
    mode: str = "default"
    inductor: tuple[tuple[str, Any], ...] = ()
    cost_model: str = "roofline"
    # Does the caller hold the compiled forward's outputs until its backward has run? True
    # (``out = model(x); out.loss.backward()`` keeps ``out.logits``): the plan counts them
    # through the backward. False (the step keeps only the loss): they count until the
    # forward returns, and the budget can buy that much more activation memory.
    hold_outputs: bool = True

    @classmethod
    def from_user(cls, options: Mapping[str, Any] | None = None, mode: str | None = None) -> "Options":
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            hint = {str: ", not a string: options={'memory_budget': 0.5}",
                    list: ", not a list of pairs: options=dict(pairs)",
                    tuple: ", not a tuple of pairs: options=dict(pairs)"}.get(type(options), "")
            raise OptionError(f"options={options!r} ({type(options).__name__}): expected a dict of fxremat "
                              f"options{hint}")
        options = dict(options)
        known = {f.name for f in dataclasses.fields(cls)}
        not_names = [k for k in options if not isinstance(k, str)]
        if not_names:
            raise OptionError(f"fxremat option names are strings, got {not_names!r}; allowed: {sorted(known)}")
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionError(
                f"unknown fxremat option(s) {unknown}; allowed: {sorted(known)}. "
                "Inductor settings go under the 'inductor' key, e.g. options={'inductor': {'max_autotune': True}}"
            )
        solver = options.get("solver", "auto")
        if solver not in SOLVERS:
            raise OptionError(f"solver={solver!r}: allowed values are {list(SOLVERS)}")
        debug_dir = options.get("debug_dir")
        if debug_dir is not None and not isinstance(debug_dir, (str, os.PathLike)):
            raise OptionError(f"debug_dir={debug_dir!r}: expected a path (str or os.PathLike)")
        compiler = options.get("compiler", "inductor")
        if compiler not in COMPILERS:
            raise OptionError(f"compiler={compiler!r}: allowed values are {list(COMPILERS)}")
        mode = options.get("mode", mode) or "default"
        if mode not in MODES:
            raise OptionError(f"mode={mode!r}: allowed values are {list(MODES)}")
        cost_model = options.get("cost_model", "roofline")
        if cost_model not in COST_MODELS:
            raise OptionError(f"cost_model={cost_model!r}: allowed values are {list(COST_MODELS)}")
        hold_outputs = options.get("hold_outputs", True)
        if not isinstance(hold_outputs, bool):
            raise OptionError(f"hold_outputs={hold_outputs!r}: expected True or False")
        inductor = options.get("inductor", {}) or {}
        if not isinstance(inductor, dict):
            raise OptionError(f"inductor={inductor!r}: expected a dict of torch._inductor.config settings")
        if inductor:
            from ._compat import inductor_config_keys

            bad = sorted(set(inductor) - inductor_config_keys())
            if bad:
                raise OptionError(f"inductor={{...}}: {bad} are not torch._inductor.config settings")
            if "custom_partitioner_fn" in inductor:
                raise OptionError("inductor={'custom_partitioner_fn': ...}: fxremat is the partitioner; remove this key")
        return cls(
            memory_budget=parse_budget(options.get("memory_budget")),
            solver=solver,
            debug_dir=os.fspath(debug_dir) if debug_dir is not None else None,
            compiler=compiler,
            mode=mode,
            inductor=tuple(sorted(inductor.items())),
            cost_model=cost_model,
            hold_outputs=hold_outputs,
        )

    @property
    def later_graphs_bytes(self) -> tuple[int, int]:
        """What the step's later graphs need between this graph's forward and backward, and
        what they keep from then to the step's end (``Budget.later_graphs``, ``later_graphs_kept``)."""
        budget = self.memory_budget
        return (budget.later_graphs, budget.later_graphs_kept) if budget is not None else (0, 0)

    def cache_key(self) -> str:
        """Every field, canonically: any option that can change a plan or its output files."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=repr)
