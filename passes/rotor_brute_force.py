"""Rotor by exhaustive search: the reference the dynamic programs are tested against.

Problem
-------
The fastest sequence of a :class:`~passes.rotor_chain.Chain` whose peak memory is at
most a budget, among all valid sequences or among the memory-persistent ones only:
the problem of :mod:`passes.rotor`, without its dynamic programs' reasoning, so that
tests can check :func:`passes.rotor.solve` (both DPs) against it.

Method
------
Dijkstra's shortest path over the model's states (what is in memory, the current
gradient, and for ``persistent`` the pending checkpoints), stepping with the same
code as :func:`passes.rotor_simulate.simulate`, so the two cannot disagree on the
model. Operations whose running memory exceeds the budget are not taken; forwards of
stages past the current gradient are skipped (their outputs can never be used).

References
----------
Beaumont et al., ACM TOMS 2024 (hal-02352969): the problem REMAT(L, M),
Definition 3.5; memory persistence, Definition 4.1.

Complexity: exponential in ``L`` (up to ``L 3^L`` memory states, times ``2^L``
pending sets when ``persistent``): tests only, chains of a few stages.

Example
-------
The paper's Fig. 4 counter-example with ``n = 6`` (``L = 8`` and the loss) at
``M = 15``: the best sequence costs 14, the best memory-persistent one 16.

>>> from fxremat.passes.rotor_chain import Chain
>>> w = [1, 3, 3, 3, 3, 3, 3, 4]
>>> chain = Chain(u_f=[4, 2, 0, 0, 0, 0, 0, 0], u_b=[0] * 8, w_a=w, w_abar=w, w_a0=0).with_loss()
>>> brute_force(chain, 15).makespan, brute_force(chain, 15, persistent=True).makespan
(14.0, 16.0)
"""

from __future__ import annotations

import heapq
import math

from .rotor_chain import B, F_ALL, F_CK, F_NONE, Chain, InfeasibleBudget, Op, Solution, _Arrays
from .rotor_simulate import _A, _NO, InvalidSequence, _apply, _time, simulate


def brute_force(chain: Chain, budget: float, persistent: bool = False) -> Solution:
    """The fastest sequence whose peak is at most ``budget``, by exhaustive search (tests only).

    Dijkstra over the model's states (what is in memory, the current gradient, and for
    ``persistent`` the pending checkpoints), stepping with the same code as
    :func:`passes.rotor_simulate.simulate`; operations whose running memory exceeds
    ``budget`` are not taken. Forwards of stages past the current gradient are skipped
    (their outputs can never be used).

    Parameters
    ----------
    chain : Chain
    budget : float
        Memory, in the units of the chain's sizes (no rounding).
    persistent : bool, optional
        Search the memory-persistent sequences only.

    Returns
    -------
    Solution
        A fastest sequence; its ``makespan`` and ``peak`` as simulated.

    Raises
    ------
    InfeasibleBudget
        If no sequence (of the kind) fits; ``min_budget`` is NaN (not searched).

    Complexity
    ----------
    Exponential in ``L``: up to ``L 3^L`` memory states (times ``2^L`` pending sets when
    ``persistent``), ``O(L)`` moves each.
    """
    c = _Arrays(chain)
    n = c.n
    act0 = [_NO] * (n + 1)
    act0[0] = _A
    start = (n, tuple(act0), frozenset())
    mem0 = float(c.wa[0] + c.wd[n])
    if mem0 > budget:
        raise InfeasibleBudget("the input and the first gradient alone exceed the budget", budget, math.nan)
    best = {start: 0.0}
    parent: dict = {start: None}
    heap = [(0.0, 0, start, mem0)]
    counter = 0
    while heap:
        cost, _, state, mem = heapq.heappop(heap)
        if cost > best[state]:
            continue
        k, act, pending = state
        if k == 0:
            seq = []
            while parent[state] is not None:
                state, op = parent[state]
                seq.append(op)
            seq.reverse()
            makespan, peak = simulate(chain, seq)
            return Solution(makespan=makespan, peak=peak, sequence=seq, persistent=persistent)
        ops = [Op(kind, s) for s in range(1, k + 1) for kind in (F_ALL, F_CK, F_NONE)]
        ops.append(Op(B, k))
        for op in ops:
            if persistent and (any(i > op.stage for i in pending)
                               or (op.kind == F_NONE and op.stage in pending)):
                continue
            new_act = list(act)
            try:
                new_k, new_mem, during = _apply(c, new_act, k, mem, op)
            except InvalidSequence:
                continue
            if during > budget:
                continue
            new_pending = pending
            if persistent:
                if op.kind in (F_ALL, F_CK):
                    new_pending = pending | {op.stage}
                elif op.kind == B:
                    new_pending = pending - {op.stage}
            new_state = (new_k, tuple(new_act), new_pending)
            new_cost = cost + _time(c, op, k)
            if new_cost < best.get(new_state, math.inf):
                best[new_state] = new_cost
                parent[new_state] = (state, op)
                counter += 1
                heapq.heappush(heap, (new_cost, counter, new_state, new_mem))
    raise InfeasibleBudget(f"no {'persistent ' if persistent else ''}sequence fits budget {budget:g}",
                           budget, math.nan)
