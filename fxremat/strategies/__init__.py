"""The strategies that turn a joint graph into a plan, one module each, and the registry
of the solvers users name (``options={"solver": ...}``).

Every strategy starts from the min-cut plan (``strategies.mincut``) and is asked for a
plan when that one is over the budget (staged solvers also when they were asked for by
name). A solver is one entry in ``SOLVERS`` and one module here:

* a strategy of its own (``mincut``, ``knapsack``, ``auto``) has
  ``plan(ctx, mincut, budget, over, solver) -> Candidate``;
* a solver over the linearization's stages (``rotor``, ``checkmate``, ``twremat``) has
  ``search(problem: staged.StagedProblem) -> Candidate`` and gives ``max_stages``; the
  saved sets, the linearization and the plans are ``staged``'s.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..candidate import Candidate, Context


@dataclasses.dataclass(frozen=True)
class Solver:
    """One entry of the registry: what ``options={"solver": name}`` runs."""

    name: str
    module: str  # fxremat.strategies.<module>
    max_stages: int | None = None  # staged solvers: the linearization merges down to this many stages
    # Plans over a chain: stages merged by time plus memory (``chain.linearize``'s weigh_memory),
    # and over budget, planned around the lean saved set too.
    chain: bool = False

    @property
    def staged(self) -> bool:
        """Does it plan over the linearization's stages (and run even when the min-cut plan fits)?"""
        return self.max_stages is not None

    def strategy(self) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self.module}")

    def plan(self, ctx: "Context", mincut: "Candidate", budget: int, over: bool) -> "Candidate":
        """This solver's plan within ``budget`` bytes; ``mincut``: the min-cut plan, ``over``:
        whether its predicted peak is over the budget. Raises ``BudgetError``."""
        if self.staged:
            from . import staged

            return staged.plan(ctx, mincut, budget, over, self)
        return self.strategy().plan(ctx, mincut, budget, over, self)


# The Checkmate ILP has O(n^2) binaries for n = 3 x stages nodes; beyond its limit (or a
# linearization that did not get down to it) it falls back to two-phase LP rounding.
SOLVERS: dict[str, Solver] = {s.name: s for s in (
    Solver("auto", "auto"),
    Solver("mincut", "mincut"),
    Solver("knapsack", "knapsack"),
    Solver("rotor", "rotor", max_stages=64, chain=True),
    # The weakly persistent DP (Algorithm 1), exact over all sequences that keep a stage's
    # input until its backward ran, O(L^4 S): fewer stages.
    Solver("rotor_exact", "rotor", max_stages=24, chain=True),
    Solver("checkmate", "checkmate", max_stages=16),
    Solver("twremat", "twremat", max_stages=32),
)}
