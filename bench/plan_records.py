"""What the bench scripts record of fxremat's plans and budget errors.

- :func:`plan_record`: one ``fxremat.Plan`` (``fxremat.inspect.plans()``) as a results file
  keeps it (``fx_plans`` of ``bench/frontier.py`` and ``bench/ab.py``);
- :func:`least_budget`: the least feasible budget a ``BudgetError`` names
  (``Allowed: a budget of at least N bytes[, or a fraction of at least F]``), which the
  budget sweeps run next (``bench/frontier.py``'s ``fxremat_min``, ``bench/rotor_budgets.py
  --to-minimum``, ``bench/grad_check_models.py``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_LEAST = re.compile(r"Allowed: a budget of at least (\d+) bytes(?:, or a fraction of at least ([0-9.]+))?")


class LeastBudget(NamedTuple):
    bytes: int
    fraction: str | None  # as the message writes it; only when the budget was asked as a fraction


def least_budget(text: str | None) -> LeastBudget | None:
    """The least feasible budget that fxremat's error message in ``text`` names (its last
    mention: a traceback may repeat it); None when there is none."""
    found = _LEAST.findall(text or "")
    if not found:
        return None
    least, fraction = found[-1]
    return LeastBudget(int(least), fraction or None)


def plan_record(plan) -> dict:
    """One plan's figures: solver, budget and predicted peak (bytes), saved activations, how
    many ops it recomputes, its stages and its staged solver's sequence (None for the others),
    planning time and, where fxremat gave one, why it kept a plan over the budget."""
    return {"solver": plan.solver, "budget_bytes": plan.budget_bytes, "sequence": plan.sequence,
            "predicted_peak_bytes": plan.predicted_peak_bytes,
            "saved_activation_bytes": plan.saved_activation_bytes,
            "recomputed_ops": len(plan.recomputed), "stages": plan.stages,
            "solve_seconds": getattr(plan, "solve_seconds", None), "why": plan.notes.get("why"),
            "floor_bytes": plan.notes.get("floor_bytes")}
