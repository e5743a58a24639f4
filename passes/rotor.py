"""Optimal rematerialization of a heterogeneous chain (Rotor).

Problem
-------
A chain of stages ``1..L``: stage ``s`` computes ``a^s`` from ``a^(s-1)`` (forward
``F^s``) and ``delta^(s-1)`` from ``delta^s`` (backward ``B^s``); ``a^0`` is the chain
input. ``B^s`` needs ``a^(s-1)`` and ``abar^s``, everything the forward of stage ``s``
records for its backward (``abar^s`` contains ``a^s``). A forward runs in one of three
modes: ``F_all`` (record ``abar^s``, keep the input), ``F_ck`` (keep the input, output
``a^s`` only) or ``F_none`` (written ``F_∅``: output ``a^s`` and free the input). Given
a memory budget ``M``, find a sequence of these operations computing ``delta^0`` from
``a^0`` and ``delta^L`` whose peak memory is at most ``M`` and whose makespan (sum of
the operation times) is smallest. :class:`Chain` states the memory model exactly;
:func:`simulate` is its executable definition.

Method
------
Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal re-materialization
strategies for heterogeneous chains: how to train deep neural networks with limited
memory", ACM TOMS 2024 (hal-02352969). The problem is weakly NP-hard (their Thm 3.6);
memory is discretised into ``S`` bins (sizes rounded up, budget rounded down, so a plan
always fits) and two dynamic programs are offered:

* ``persistent=True`` (default): the best *memory-persistent* sequence, a value
  materialized in memory stays until its backward (their Algorithm 3/4, section 4.4;
  :mod:`passes.rotor_persistent`). ``O(L^3 S)`` time, ``O(L^2 S)`` memory.
* ``persistent=False``: the best *weakly persistent* sequence (their section 4.3,
  Algorithms 1/2; :mod:`passes.rotor_weak`), optimal among all sequences (their
  Lemma 4.4; our tests check it against exhaustive search). The floating checkpoint
  moves one stage per ``F_∅`` (theirs several at once), at ``O(L^4 S)`` time,
  ``O(L^3 S)`` memory, instead of ``O(L^6 S)``.

Corrections to the printed paper (see the fxremat papers' ERRATA): the size kept by
``F_all^s`` is ``omega_abar^s``, not ``omega_a^s`` (their eq. (5), ``C_all`` and the
``m_all`` bounds); the memory of a forward run is checked exactly for each split point
rather than with the paper's ``m_∅`` bound (which, in the non-persistent recurrence,
misses the moved checkpoint). The paper does not say what a forward does when its
output is already in memory: here that is invalid (see :class:`Chain`). The loss is an
extra stage of zero cost and size (:meth:`Chain.with_loss`), so that the backward
starts from an empty gradient.

This module is the entry point (:func:`solve`, :func:`min_budget`) and re-exports the
rest, one part a module:

* :mod:`passes.rotor_chain`: the chain, the operations, their text form, the answer;
* :mod:`passes.rotor_simulate`: the model run on a sequence (:func:`simulate`);
* :mod:`passes.rotor_persistent`: the memory-persistent DP (Algorithms 3/4);
* :mod:`passes.rotor_weak`: the weakly persistent (exact) DP (Algorithms 1/2);
* :mod:`passes.rotor_brute_force`: exhaustive search, the tests' reference.

Complexity: persistent ``O(L^3 S)`` (a 340-stage chain with ``S = 500`` takes a few
seconds), exact ``O(L^4 S)``.

Example
-------
Three stages of unit sizes and times: storing everything peaks at 6; within 5, the
best plan recomputes ``F^1`` and ``F^2`` once:

>>> chain = Chain(u_f=[1, 1, 1], u_b=[1, 1, 1], w_a=[1, 1, 1], w_abar=[1, 1, 1], w_a0=1)
>>> simulate(chain, store_all(chain))
(6.0, 6.0)
>>> sol = solve(chain, 5, bins=None)
>>> sol.makespan, sol.peak, format_sequence(sol.sequence)
(8.0, 5.0, 'F_ck^1 F_∅^2 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1')
"""

from __future__ import annotations

import math

import numpy as np

from .rotor_brute_force import brute_force
from .rotor_chain import (B, F_ALL, F_CK, F_NONE, KINDS, Chain, InfeasibleBudget, Op, Solution, _Arrays,
                          format_sequence, parse_sequence)
from .rotor_persistent import _persistent_min_memory, _persistent_sequence, _persistent_table
from .rotor_simulate import InvalidSequence, is_persistent, memory_profile, simulate, store_all
from .rotor_weak import _weak_min_memory, _weak_sequence, _weak_table

__all__ = [
    "B", "F_ALL", "F_CK", "F_NONE", "KINDS", "Chain", "InfeasibleBudget", "InvalidSequence", "Op", "Solution",
    "brute_force", "format_sequence", "is_persistent", "memory_profile", "min_budget", "parse_sequence",
    "simulate", "solve", "store_all",
]


def _discretise(chain: Chain, budget: float, bins: int | None) -> tuple[_Arrays, int]:
    """Sizes in whole bins (rounded up) and the budget in bins (rounded down)."""
    if bins is None:
        values = (chain.w_a0, chain.w_delta0, budget) + chain.w_a + chain.w_abar + chain.w_abar_last \
            + chain.w_delta + chain.o_f + chain.o_b + chain.w_g
        if not all(float(v).is_integer() for v in values):
            raise ValueError("bins=None (exact) needs integer sizes, overheads and budget; "
                             "scale them to a whole unit or pass a number of bins")
        return _Arrays(chain, scale=lambda x: x.astype(np.int64)), int(budget)
    if not (isinstance(bins, int) and bins >= 1):
        raise ValueError(f"bins must be a positive integer or None, got {bins!r}")
    # ceil(x * bins / budget) up to float noise: the 1e-9 bin slack is far below one byte
    # for any real budget, and keeps sizes that are exact multiples of the bin from
    # being bumped to the next bin.
    scale = lambda x: np.maximum(np.ceil(x * bins / budget - 1e-9), 0).astype(np.int64)  # noqa: E731
    return _Arrays(chain, scale=scale), bins


def min_budget(chain: Chain, persistent: bool = True) -> float:
    """The smallest budget at which a (persistent, or weakly persistent) sequence exists.

    With the exact sizes (no rounding): :func:`solve` with this budget and ``bins=None``
    succeeds for integer sizes; with bins, rounding may need a little more.

    Parameters
    ----------
    chain : Chain
    persistent : bool, optional
        The memory-persistent minimum (default), or the weakly persistent one (the
        minimum over all sequences).

    Returns
    -------
    float

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(L^3)`` persistent, ``O(L^4)`` weakly persistent (the DPs' recurrences in
    ``(min, max)``, without the memory dimension).

    References
    ----------
    Beaumont et al., ACM TOMS 2024, Theorems 4.7 and 4.8.
    """
    c = _Arrays(chain)
    return _persistent_min_memory(c) if persistent else _weak_min_memory(c)


def solve(chain: Chain, budget: float, *, bins: int | None = 500, persistent: bool = True) -> Solution:
    """The fastest sequence whose peak memory is at most ``budget``.

    Parameters
    ----------
    chain : Chain
    budget : float
        Memory, in the units of the chain's sizes.
    bins : int or None, optional
        Memory is counted in ``bins`` bins of ``budget / bins`` (sizes rounded up, so the
        plan always fits; it is optimal for the rounded sizes). ``None``: exact, with
        integer sizes and budget in a unit of 1 (the table then has ``budget + 1``
        columns).
    persistent : bool, optional
        The memory-persistent DP (default, :mod:`passes.rotor_persistent`); ``False``: the
        exact weakly persistent DP (:mod:`passes.rotor_weak`).

    Returns
    -------
    Solution
        The sequence, with its makespan and peak simulated under the exact sizes
        (:func:`simulate`).

    Raises
    ------
    InfeasibleBudget
        When no sequence fits, with the exact ``min_budget`` (:func:`min_budget`); the
        message says when the budget is feasible but not once sizes are rounded to bins.
    ValueError
        If ``budget`` is not positive and finite, ``bins`` is not a positive integer or
        None, ``bins=None`` with sizes or a budget that are not integers, or the DP's
        table would be too large (more than ``2^30`` entries persistent, ``2^28``
        weakly persistent).

    Complexity
    ----------
    Persistent ``O(L^3 S)`` time and ``O(L^2 S)`` memory, weakly persistent ``O(L^4 S)``
    time and ``O(L^3 S)`` memory, for ``S`` bins (``budget + 1`` with ``bins=None``).

    References
    ----------
    Beaumont et al., ACM TOMS 2024: Algorithms 3/4 (persistent), 1/2 (weakly
    persistent), with the corrections of the module docstring.
    """
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be positive and finite, got {budget!r}")
    c, S = _discretise(chain, budget, bins)
    m0 = S - int(c.wa[0])
    if persistent:
        table = _persistent_table(c, S) if m0 >= 0 else None
        feasible = m0 >= 0 and table[c.n][1, m0] < np.inf
    else:
        table = _weak_table(c, S) if m0 >= 0 else None
        feasible = m0 >= 0 and table[1, 1, c.n, m0] < np.inf
    if not feasible:
        least = min_budget(chain, persistent)
        kind = "memory-persistent" if persistent else "weakly persistent"
        if least > budget:
            raise InfeasibleBudget(f"budget {budget:g} is infeasible: the minimum feasible budget of a "
                                   f"{kind} sequence for this chain is {least:g}", budget, least)
        raise InfeasibleBudget(f"budget {budget:g} is above the minimum feasible budget {least:g} of a {kind} "
                               f"sequence, but not once sizes are rounded up to {S} bins of "
                               f"{budget / S:g}: use more bins or a larger budget", budget, least)
    seq = _persistent_sequence(c, table, m0) if persistent else _weak_sequence(c, table, m0)
    makespan, peak = simulate(chain, seq)
    return Solution(makespan=makespan, peak=peak, sequence=seq, persistent=persistent)
