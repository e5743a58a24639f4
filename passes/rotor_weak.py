"""Rotor's exact dynamic program: the best weakly persistent sequence (Algorithms 1 and 2).

Problem
-------
The fastest sequence of a :class:`~passes.rotor_chain.Chain` within a budget of ``S``
memory bins (sizes already in whole bins, see :func:`passes.rotor.solve`), among the
*weakly persistent* sequences (the paper's Definition 4.3: an activation materialized
by ``F_ck^k`` or ``F_all^k`` sees no recomputation of an earlier stage until ``B^k``
or ``F_∅^k`` discards it), which hold an optimal sequence (their Lemma 4.4): so this
is the optimum over all sequences (the tests check it against
:mod:`passes.rotor_brute_force`).

Method
------
Beaumont et al., ACM TOMS 2024, section 4.3 (Theorem 4.7, Algorithms 1 and 2). Their
recurrence moves the "floating" checkpoint several stages at once; here it moves one
stage per ``F_∅`` and the budget grows by the freed size, which covers their cases
plus moving and then ``F_all`` (their recurrence has no term for it)::

    C(s, t, l, m): from (a^(s-1), delta^l), reach delta^(t-1) having discarded every
      activation of index >= s-1, peak <= m not counting a^(s-1); s <= t <= l.
      F_all^s  [t = s]:  u_f + u_b + C(s+1, s+1, l, m - wab^s)  ([s = l]: u_f_last + u_b)
                         if m >= max(wd^l + wab^s + of^s, wd^s + wdb^s + wab^s + ob^s)
                         (wab^s: w_abar_last^s where s = l, delta^s being current)
      F_∅^s    [t > s]:  u_f^s + C(s+1, t, l, m + wa^(s-1) - wa^s)   if m >= wd^l + wa^s + of^s
      F_ck^s   [t < l]:  u_f^s + min over t' in (t, l] of
                         C(s+1, t', l, m - wa^s) + C(s, t, t'-1, m)    if m >= wd^l + wa^s + of^s

Complexity: ``O(L^4 S)`` time and ``O(L^3 S)`` memory, instead of the paper's
``O(L^6 S)``; the smallest peak ``O(L^4)``.

Example
-------
The paper's Fig. 4 chain (``n = 6``) at ``M = 15``: 14 (``2n + 2``), where the best
memory-persistent sequence costs 16 (:mod:`passes.rotor_persistent`).

>>> from fxremat.passes.rotor import Chain, is_persistent, min_budget, solve
>>> w = [1, 3, 3, 3, 3, 3, 3, 4]
>>> chain = Chain(u_f=[4, 2, 0, 0, 0, 0, 0, 0], u_b=[0] * 8, w_a=w, w_abar=w, w_a0=0).with_loss()
>>> sol = solve(chain, 15, bins=None, persistent=False)
>>> sol.makespan, is_persistent(sol.sequence), min_budget(chain, persistent=False)
(14.0, False, 14.0)
"""

from __future__ import annotations

import math

import numpy as np

from .rotor_chain import B, F_ALL, F_CK, F_NONE, Op, _Arrays
from .rotor_persistent import _shift


def _weak_table(c: _Arrays, S: int) -> np.ndarray:
    """Algorithm 1: the table of ``C`` (module docstring), vectorised over the bins.

    Parameters
    ----------
    c : _Arrays
        The chain, sizes in whole bins.
    S : int
        The budget in bins.

    Returns
    -------
    numpy.ndarray
        ``C[s, t, l, m]``, shape ``(L + 2, L + 2, L + 2, S + 1)``, float64, infinite where
        infeasible.

    Raises
    ------
    ValueError
        If the table would have more than ``2^28`` entries.

    Complexity
    ----------
    ``O(L^4 S)`` time, ``O(L^3 S)`` memory.
    """
    n = c.n
    wa, wab, wabl, wd, wdb, of, ob = (getattr(c, x).tolist() for x in ("wa", "wab", "wabl", "wd", "wdb", "of", "ob"))
    width = S + 1
    cells = (n + 2) ** 3 * width
    if cells > 2 ** 28:
        raise ValueError(f"the exact DP would need a {cells:,}-entry table: use persistent=True "
                         f"or fewer bins")
    C = np.full((n + 2, n + 2, n + 2, width), np.inf)
    mm = np.arange(width)
    for d in range(0, n):
        for s in range(1, n + 1 - d):
            l = s + d
            held = wabl[s] if s == l else wab[s]  # F_all^l with delta^l current: w_abar_last
            thr_all = max(wd[l] + held + of[s], wd[s] + wdb[s] + held + ob[s])
            thr_f = wd[l] + wa[s] + of[s]
            cell = C[s, :, l]  # (t, m) view
            # F_all^s, t = s
            v = (np.full(width, c.ulast[s]) if s == l
                 else _shift(C[s + 1, s + 1, l], wab[s]) + c.uall[s])
            v[:thr_all] = np.inf
            cell[s] = v
            if d == 0:
                continue
            # F_∅^s, t = s+1 .. l
            src = C[s + 1, s + 1:l + 1, l]
            idx = mm + wa[s - 1] - wa[s]
            moved = src[:, np.clip(idx, 0, S)] + c.uf[s]
            moved[:, idx < 0] = np.inf
            moved[:, :thr_f] = np.inf
            np.minimum(cell[s + 1:l + 1], moved, out=cell[s + 1:l + 1])
            # F_ck^s, t = s .. l-1, t' = s+1 .. l
            inner = _shift(C[s + 1, s + 1:l + 1, l], wa[s])  # (t', m)
            rest = C[s, s:l, s:l]  # (t, t'-1, m), infinite where t'-1 < t
            ck = (rest + inner[None]).min(axis=1) + c.uf[s]
            ck[:, :thr_f] = np.inf
            np.minimum(cell[s:l], ck, out=cell[s:l])
    return C


def _weak_sequence(c: _Arrays, C: np.ndarray, m0: int) -> list[Op]:
    """Algorithm 2: unfold the choices of :func:`_weak_table`, ties broken ``F_all``, ``F_∅``, ``F_ck``.

    Parameters
    ----------
    c : _Arrays
        As given to :func:`_weak_table`.
    C : numpy.ndarray
        Its table.
    m0 : int
        The bins left once ``a^0`` is held, with ``C[1, 1, L, m0]`` finite.

    Returns
    -------
    list of Op

    Raises
    ------
    AssertionError
        If the unfolding reaches an infeasible state (a table inconsistent with ``c``).

    Complexity
    ----------
    ``O(L)`` table reads an operation of the sequence.
    """
    wa, wab, wabl, wd, wdb, of, ob = (getattr(c, x).tolist() for x in ("wa", "wab", "wabl", "wd", "wdb", "of", "ob"))
    S = C.shape[-1] - 1
    inf = math.inf

    def cv(s, t, l, m):
        return C[s, t, l, min(m, S)] if m >= 0 else inf

    out: list[Op] = []
    todo: list = [("C", 1, 1, c.n, m0)]
    while todo:
        item = todo.pop()
        if isinstance(item, Op):
            out.append(item)
            continue
        _, s, t, l, m = item
        options = []  # (value, rank, expansion in execution order)
        thr_f = wd[l] + wa[s] + of[s]
        held = wabl[s] if s == l else wab[s]
        if t == s and m >= max(wd[l] + held + of[s], wd[s] + wdb[s] + held + ob[s]):
            if s == l:
                options.append((c.ulast[s], 0, [Op(F_ALL, s), Op(B, s)]))
            else:
                options.append((cv(s + 1, s + 1, l, m - wab[s]) + c.uall[s], 0,
                                [Op(F_ALL, s), ("C", s + 1, s + 1, l, m - wab[s]), Op(B, s)]))
        if t > s and m >= thr_f:
            m2 = m + wa[s - 1] - wa[s]
            options.append((cv(s + 1, t, l, m2) + c.uf[s], 1, [Op(F_NONE, s), ("C", s + 1, t, l, m2)]))
        if t < l and m >= thr_f:
            for tp in range(max(t, s) + 1, l + 1):
                val = cv(s + 1, tp, l, m - wa[s]) + cv(s, t, tp - 1, m) + c.uf[s]
                options.append((val, 2, [Op(F_CK, s), ("C", s + 1, tp, l, m - wa[s]),
                                         ("C", s, t, tp - 1, m)]))
        options = [o for o in options if o[0] < inf]
        if not options:
            raise AssertionError("reconstruction reached an infeasible state")
        _, _, expansion = min(options, key=lambda o: (o[0], o[1]))
        todo.extend(reversed(expansion))
    return out


def _weak_min_memory(c: _Arrays) -> float:
    """The same recurrences in (min, max): the smallest peak of a weakly persistent sequence.

    Parameters
    ----------
    c : _Arrays
        The chain, in its own units (no rounding).

    Returns
    -------
    float
        In the units of ``c``, ``a^0`` included.

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(L^4)``.
    """
    n = c.n
    wa, wab, wabl, wd, wdb, of, ob = (getattr(c, x).astype(float)
                                      for x in ("wa", "wab", "wabl", "wd", "wdb", "of", "ob"))
    M = np.full((n + 2, n + 2, n + 2), np.inf)
    for d in range(0, n):
        for s in range(1, n + 1 - d):
            l = s + d
            held = wabl[s] if s == l else wab[s]  # F_all^l with delta^l current: w_abar_last
            thr_all = max(wd[l] + held + of[s], wd[s] + wdb[s] + held + ob[s])
            thr_f = wd[l] + wa[s] + of[s]
            M[s, s, l] = thr_all if s == l else max(thr_all, wab[s] + M[s + 1, s + 1, l])
            if d == 0:
                continue
            moved = np.maximum(thr_f, M[s + 1, s + 1:l + 1, l] + wa[s] - wa[s - 1])
            M[s, s + 1:l + 1, l] = np.minimum(M[s, s + 1:l + 1, l], moved)
            inner = wa[s] + M[s + 1, s + 1:l + 1, l]  # (t',)
            ck = np.maximum(thr_f, np.maximum(M[s, s:l, s:l], inner[None]).min(axis=1))
            M[s, s:l, l] = np.minimum(M[s, s:l, l], ck)
    return float(wa[0] + M[1, 1, n])
