"""Rotor's memory-persistent dynamic program (the paper's Algorithms 3 and 4).

Problem
-------
The fastest *memory-persistent* sequence of a :class:`~passes.rotor_chain.Chain`
within a budget of ``S`` memory bins (sizes already in whole bins, see
:func:`passes.rotor.solve`): a value materialized in memory stays there until its
backward (the paper's Definition 4.1). Persistent sequences can cost more than the
best one (on the paper's Fig. 4 family ``(3n - 2) / (2n + 2)`` times, tending to 3/2;
ERRATA; :mod:`passes.rotor_weak` finds the best); on real chains they almost never do,
and this DP is ``L`` times faster.

Method
------
Beaumont et al., ACM TOMS 2024, section 4.4 (Theorem 4.8, Algorithms 3 and 4),
with ``omega_abar^s`` where the paper prints ``omega_a^s`` (ERRATA), an exact memory
check at every split point, and the extensions of :class:`~passes.rotor_chain.Chain`
(``w_g``, ``u_f_last``, ``w_abar_last``). The table is vectorised with numpy over the bins and the
left ends, in float32 (makespans are re-summed in float64 by the simulator)::

    P(s, t, m): best time to turn (a^(s-1), delta^t) into delta^(s-1) with a^(s-1) kept
      until B^s, peak <= m not counting a^(s-1). (wd^t: delta^t with the parameter gradients
      of stages > t; wdb^s: what B^s adds, delta^(s-1) and w_g^s; see _Arrays.)
      F_all^s:  u_f + u_b + P(s+1, t, m - w_abar^s)   [s < t]; u_f_last + u_b [s = t]
                if m >= max(wd^t + wab^s + of^s, wd^s + wdb^s + wab^s + ob^s)
                (wab^s: w_abar_last^s where s = t, delta^s being current)
      F_ck^s:   u_f^s + Q(s, s+1, t, m)  if m >= wd^t + wa^s + of^s           [s < t]
    Q(s, j, t, m): same, a^(s-1) kept and a^(j-1) (counted in m) the latest forward output.
      checkpoint a^(j-1):  P(j, t, m - wa^(j-1)) + P(s, j-1, m)
      F_∅^j:               u_f^j + Q(s, j+1, t, m)  if m >= wd^t + wa^(j-1) + wa^j + of^j  [j < t]

The paper's ``C_ck(s, s', t)`` is ``Q`` unrolled: ``F_ck^s F_∅^(s+1) .. F_∅^(s'-1)``
then the split. The same recurrences in (min, max) give the smallest peak.

Complexity: ``O(L^3 S)`` time, ``O(L^2 S)`` memory (a 340-stage chain with
``S = 500`` takes a few seconds); the smallest peak ``O(L^3)``.

Example
-------
The paper's Fig. 4 chain (``n = 6``) at ``M = 15``: the persistent optimum costs 16
(``3n - 2``), the weakly persistent one 14 (:mod:`passes.rotor_weak`).

>>> from fxremat.passes.rotor import Chain, is_persistent, min_budget, solve
>>> w = [1, 3, 3, 3, 3, 3, 3, 4]
>>> chain = Chain(u_f=[4, 2, 0, 0, 0, 0, 0, 0], u_b=[0] * 8, w_a=w, w_abar=w, w_a0=0).with_loss()
>>> sol = solve(chain, 15, bins=None)
>>> sol.makespan, sol.peak, is_persistent(sol.sequence), min_budget(chain)
(16.0, 15.0, True, 14.0)
"""

from __future__ import annotations

import numpy as np

from .rotor_chain import B, F_ALL, F_CK, F_NONE, Op, _Arrays

_DT = np.float32  # tables: half the memory traffic of float64; makespans are re-summed in float64


def _shift(row: np.ndarray, w: int) -> np.ndarray:
    """``out[m] = row[m - w]`` (infinite where ``m < w``)."""
    out = np.full_like(row, np.inf)
    if w < row.shape[-1]:
        out[..., w:] = row[..., :row.shape[-1] - w]
    return out


def _add_shifted(shifted: np.ndarray, w: int, other, out: np.ndarray) -> np.ndarray:
    """``out[..., m] = shifted[..., m - w] + other[..., m]`` (infinite where ``m < w``), ``other``
    a scalar or a row over the bins: ``_shift(shifted, w) + other`` without the temporary (the
    DP's inner loop made one per step)."""
    width = out.shape[-1]
    w = min(w, width)
    out[..., :w] = np.inf
    np.add(shifted[..., :width - w], other if np.isscalar(other) else other[..., w:], out=out[..., w:])
    return out


def _persistent_table(c: _Arrays, S: int) -> list[np.ndarray]:
    """Algorithm 3: the table of ``P`` (module docstring), vectorised over the bins and ``s``.

    Parameters
    ----------
    c : _Arrays
        The chain, sizes in whole bins.
    S : int
        The budget in bins.

    Returns
    -------
    list of numpy.ndarray
        ``P[t][s, m] = P(s, t, m)`` for ``t`` in ``1..L`` (``P[0]`` is empty), float32,
        infinite where infeasible.

    Raises
    ------
    ValueError
        If the table would have more than ``2^30`` entries.

    Complexity
    ----------
    ``O(L^3 S)`` time, ``O(L^2 S)`` memory.
    """
    n = c.n
    wa, wab, wabl, wd, wdb, of, ob = (getattr(c, x).tolist() for x in ("wa", "wab", "wabl", "wd", "wdb", "of", "ob"))
    uf = c.uf.astype(_DT)
    uall, ulast = c.uall.astype(_DT), c.ulast.astype(_DT)
    width = S + 1
    cells = (n + 1) * (n + 2) // 2 * width
    if cells > 2 ** 30:
        raise ValueError(f"the persistent DP would need a {cells:,}-entry table: use fewer bins")
    P: list[np.ndarray] = [np.empty((0, width), _DT)]  # P[t][s, m] = P(s, t, m)
    buf = np.empty((n + 1, width), _DT)
    ck = np.empty(width, _DT)
    for t in range(1, n + 1):
        Pt = np.full((t + 1, width), np.inf, _DT)
        P.append(Pt)
        Q = np.full((t + 1, width), np.inf, _DT)  # Q[s] = Q(s, j+1, t) entering step j
        for j in range(t, 0, -1):
            row = Pt[j]
            held = wabl[j] if j == t else wab[j]  # F_all^t with delta^t current: w_abar_last
            thr_all = max(wd[t] + held + of[j], wd[j] + wdb[j] + held + ob[j])
            if j == t:
                row[min(thr_all, width):] = ulast[j]
            else:
                _add_shifted(Pt[j + 1], wab[j], uall[j], out=row)
                row[:thr_all] = np.inf
                np.add(Q[j], uf[j], out=ck)
                ck[:wd[t] + wa[j] + of[j]] = np.inf
                np.minimum(row, ck, out=row)
            if j >= 2:
                rows = Q[1:j]
                mat = _add_shifted(row, wa[j - 1], P[j - 1][1:j], out=buf[:j - 1])
                if j == t:
                    rows[...] = mat
                else:
                    rows += uf[j]
                    rows[:, :wd[t] + wa[j - 1] + wa[j] + of[j]] = np.inf
                    np.minimum(rows, mat, out=rows)
    return P


def _persistent_sequence(c: _Arrays, P: list[np.ndarray], m0: int) -> list[Op]:
    """Algorithm 4: unfold the choices (recomputed from the table, same float32 sums).

    Parameters
    ----------
    c : _Arrays
        As given to :func:`_persistent_table`.
    P : list of numpy.ndarray
        Its table.
    m0 : int
        The bins left once ``a^0`` is held, with ``P[L][1, m0]`` finite.

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
    uf = c.uf.astype(_DT)
    uall, ulast = c.uall.astype(_DT), c.ulast.astype(_DT)
    inf = _DT(np.inf)

    def p(s, t, m):
        return P[t][s, m] if m >= 0 else inf

    out: list[Op] = []
    todo: list = [("P", 1, c.n, m0)]
    while todo:
        item = todo.pop()
        if isinstance(item, Op):
            out.append(item)
            continue
        _, s, t, m = item
        held = wabl[s] if s == t else wab[s]
        thr_all = max(wd[t] + held + of[s], wd[s] + wdb[s] + held + ob[s])
        v_all = inf
        if m >= thr_all:
            v_all = ulast[s] if s == t else p(s + 1, t, m - wab[s]) + uall[s]
        v_ck, chain_q = inf, None
        if s < t and m >= wd[t] + wa[s] + of[s]:
            # Q(s, j, t, m) for j = t .. s+1, and whether F_∅^j was the better move.
            q, moves = inf, {}
            for j in range(t, s, -1):
                mat = p(j, t, m - wa[j - 1]) + p(s, j - 1, m)
                fwd = q + uf[j] if j < t and m >= wd[t] + wa[j - 1] + wa[j] + of[j] else inf
                moves[j] = fwd < mat
                q = fwd if moves[j] else mat
            v_ck, chain_q = q + uf[s], moves
        if not (v_all < inf or v_ck < inf):
            raise AssertionError("reconstruction reached an infeasible state")
        if v_all <= v_ck:
            todo.append(Op(B, s))
            if s < t:
                todo.append(("P", s + 1, t, m - wab[s]))
            todo.append(Op(F_ALL, s))
        else:
            ops = [Op(F_CK, s)]
            j = s + 1
            while chain_q[j]:
                ops.append(Op(F_NONE, j))
                j += 1
            todo.append(("P", s, j - 1, m))
            todo.append(("P", j, t, m - wa[j - 1]))
            todo.extend(reversed(ops))
    return out


def _persistent_min_memory(c: _Arrays) -> float:
    """The same recurrences in (min, max): the smallest peak of a persistent sequence.

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
    ``O(L^3)``.
    """
    n = c.n
    wa, wab, wabl, wd, wdb, of, ob = (getattr(c, x).astype(float)
                                      for x in ("wa", "wab", "wabl", "wd", "wdb", "of", "ob"))
    MP = [np.empty(0)] + [np.full(t + 1, np.inf) for t in range(1, n + 1)]  # MP[t][s]
    for t in range(1, n + 1):
        MQ = np.full(t + 1, np.inf)
        for j in range(t, 0, -1):
            held = wabl[j] if j == t else wab[j]
            thr_all = max(wd[t] + held + of[j], wd[j] + wdb[j] + held + ob[j])
            if j == t:
                MP[t][j] = thr_all
            else:
                v_all = max(thr_all, wab[j] + MP[t][j + 1])
                v_ck = max(wd[t] + wa[j] + of[j], MQ[j])
                MP[t][j] = min(v_all, v_ck)
            if j >= 2:
                mat = np.maximum(MP[j - 1][1:j], wa[j - 1] + MP[t][j])
                if j == t:
                    MQ[1:j] = mat
                else:
                    fwd = np.maximum(MQ[1:j], wd[t] + wa[j - 1] + wa[j] + of[j])
                    MQ[1:j] = np.minimum(mat, fwd)
    return float(wa[0] + MP[n][1])
