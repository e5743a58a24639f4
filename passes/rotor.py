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
  materialized in memory stays until its backward (their Algorithm 3/4, section 4.4).
  ``O(L^3 S)`` time, ``O(L^2 S)`` memory.
* ``persistent=False``: the best *weakly persistent* sequence (their section 4.3,
  Algorithms 1/2), optimal among all sequences (their Lemma 4.4; our tests check it
  against exhaustive search). Their recurrence moves the "floating" checkpoint several
  stages at once; here it moves one stage per ``F_∅`` and the budget grows by the freed
  size, which covers their cases plus moving and then ``F_all`` (their recurrence has
  no term for it), at ``O(L^4 S)`` time, ``O(L^3 S)`` memory, instead of ``O(L^6 S)``.

Corrections to the printed paper (see the fxremat papers' ERRATA): the size kept by
``F_all^s`` is ``omega_abar^s``, not ``omega_a^s`` (their eq. (5), ``C_all`` and the
``m_all`` bounds); the memory of a forward run is checked exactly for each split point
rather than with the paper's ``m_∅`` bound (which, in the non-persistent recurrence,
misses the moved checkpoint). The paper does not say what a forward does when its
output is already in memory: here that is invalid (see :class:`Chain`). The loss is an
extra stage of zero cost and size (:meth:`Chain.with_loss`), so that the backward
starts from an empty gradient.

Complexity: persistent ``O(L^3 S)`` (numpy over the bins and the left ends: a
340-stage chain with ``S = 500`` takes a few seconds), exact ``O(L^4 S)``.

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

import dataclasses
import heapq
import math
import re
from collections.abc import Iterable, Sequence

import numpy as np

F_ALL, F_CK, F_NONE, B = "F_all", "F_ck", "F_none", "B"
KINDS = (F_ALL, F_CK, F_NONE, B)
_SHOWN = {F_ALL: "F_all", F_CK: "F_ck", F_NONE: "F_∅", B: "B"}

# What is in memory at each chain position: nothing, a^l, or abar^l (which holds a^l).
_NO, _A, _ABAR = 0, 1, 2


class InvalidSequence(ValueError):
    """A sequence breaks the data dependencies of the model (or the budget given to simulate)."""


class InfeasibleBudget(ValueError):
    """No sequence of the requested kind fits the budget; ``min_budget`` is the smallest that does."""

    def __init__(self, message: str, budget: float, min_budget: float):
        super().__init__(message)
        self.budget = budget
        self.min_budget = min_budget


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a sequence: ``kind`` in ``F_all, F_ck, F_none, B``, ``stage`` in ``1..L``."""

    kind: str
    stage: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown operation kind {self.kind!r}; expected one of {KINDS}")

    def __str__(self) -> str:
        return f"{_SHOWN[self.kind]}^{self.stage}"


def parse_sequence(text: str) -> list[Op]:
    """``"F_ck^1 F_∅^2 F_all^3 B^3 ..."`` -> ops (``F_none``, ``F_0``, ``F_phi`` also read as ``F_∅``)."""
    names = {"F_all": F_ALL, "F_ck": F_CK, "F_∅": F_NONE, "F_none": F_NONE, "F_0": F_NONE,
             "F_phi": F_NONE, "F_ø": F_NONE, "B": B}
    ops = []
    for token in text.split():
        m = re.fullmatch(r"(F_all|F_ck|F_∅|F_none|F_0|F_phi|F_ø|B)\^\{?(\d+)\}?", token)
        if not m:
            raise ValueError(f"cannot read operation {token!r}")
        ops.append(Op(names[m.group(1)], int(m.group(2))))
    return ops


def format_sequence(sequence: Iterable[Op]) -> str:
    return " ".join(str(op) for op in sequence)


def _floats(values, n: int, name: str) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries, the chain has {n} stages")
    if any(not math.isfinite(v) or v < 0 for v in out):
        raise ValueError(f"{name} must be finite and non-negative")
    return out


@dataclasses.dataclass(frozen=True)
class Chain:
    """A chain of ``L`` stages; entry ``s - 1`` of each list describes stage ``s``.

    u_f, u_b: times of ``F^s`` (any mode) and ``B^s``.
    w_a: ``omega_a^s``, size of the stage output ``a^s``.
    w_abar: ``omega_abar^s``, size of ``abar^s``, everything ``F_all^s`` keeps for ``B^s``,
        ``a^s`` included (physically ``w_abar >= w_a``; not required).
    w_a0: ``omega_a^0``, size of the chain input ``a^0``.
    w_delta: ``omega_delta^s``, size of the gradient ``delta^s`` (default ``w_a``).
    w_delta0: size of ``delta^0``, the gradient of the input (default ``w_a0``).
    o_f, o_b: peak overheads of ``F^s`` and ``B^s``: temporary memory on top of their
        inputs and outputs (default 0).
    u_f_last: time of ``F_all^s`` run while the current gradient is ``delta^s`` (default
        ``u_f``). The stages after ``s`` are then done, so nothing reads ``a^s`` again and
        the ops that only make it are skipped: a stage whose output is made by a matmul
        that its backward does not need (a transformer block's last projection) costs
        less there. An extension of the paper's model, which charges ``u_f`` and so
        overprices the last stage of every recomputed segment.
    w_g: bytes ``B^s`` makes that stay to the end of the step (the gradients of the
        stage's parameters; default 0). An extension of the paper's model: counted
        outside the chain as alive throughout, the gradients of a deep model's later
        layers would be counted during its whole forward, and the DP would recompute
        more than a budget needs.

    Memory model (the paper's section 3.1, Table 1 and Definitions 3.3-3.4). Only
    activations and gradients count (weights and their gradients are outside the
    budget). Memory holds, per position ``l``, nothing, ``a^l`` (``w_a``) or ``abar^l``
    (``w_abar``, which holds ``a^l``), plus the one current gradient ``delta^k``. A sequence
    starts with ``a^0`` and ``delta^L`` (so a chain ending in a loss should end with a
    zero-size stage: :meth:`with_loss`) and must end with ``delta^0``.

    * ``F_all^s``, ``F_ck^s``, ``F_∅^s`` need ``a^(s-1)`` (or ``abar^(s-1)``); while running
      they use everything in memory plus their output (``w_abar^s`` for ``F_all``, else
      ``w_a^s``) plus ``o_f^s``. ``F_all`` leaves ``abar^s``, the others ``a^s``;
      ``F_∅`` then frees ``a^(s-1)`` unless it is part of ``abar^(s-1)``.
    * ``B^s`` needs ``delta^s``, ``abar^s`` and ``a^(s-1)``; while running it uses
      everything in memory plus ``w_delta^(s-1) + w_g^s + o_b^s``; it then frees ``delta^s``,
      ``abar^s`` and ``a^(s-1)`` (unless part of ``abar^(s-1)``), leaving ``delta^(s-1)``
      and ``w_g^s`` (held to the end).
    * A forward never recomputes a value that is in memory: ``F^s`` is invalid while
      ``a^s`` or ``abar^s`` is held. (The paper leaves this case open; allowing it would
      turn ``F_∅^s`` after ``F_all^s`` into a paid "free ``a^(s-1)``" operation that the
      model does not otherwise have.)

    The peak of a sequence is the largest of these running totals.
    """

    u_f: Sequence[float]
    u_b: Sequence[float]
    w_a: Sequence[float]
    w_abar: Sequence[float]
    w_a0: float
    w_delta: Sequence[float] | None = None
    w_delta0: float | None = None
    o_f: Sequence[float] | None = None
    o_b: Sequence[float] | None = None
    w_g: Sequence[float] | None = None
    u_f_last: Sequence[float] | None = None

    def __post_init__(self):
        n = len(self.u_f)
        if n < 1:
            raise ValueError("a chain needs at least one stage")
        fix = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        fix("u_f", _floats(self.u_f, n, "u_f"))
        fix("u_b", _floats(self.u_b, n, "u_b"))
        fix("w_a", _floats(self.w_a, n, "w_a"))
        fix("w_abar", _floats(self.w_abar, n, "w_abar"))
        fix("w_delta", _floats(self.w_a if self.w_delta is None else self.w_delta, n, "w_delta"))
        fix("o_f", _floats([0.0] * n if self.o_f is None else self.o_f, n, "o_f"))
        fix("o_b", _floats([0.0] * n if self.o_b is None else self.o_b, n, "o_b"))
        fix("w_g", _floats([0.0] * n if self.w_g is None else self.w_g, n, "w_g"))
        fix("u_f_last", _floats(self.u_f if self.u_f_last is None else self.u_f_last, n, "u_f_last"))
        fix("w_a0", _floats([self.w_a0], 1, "w_a0")[0])
        fix("w_delta0", _floats([self.w_a0 if self.w_delta0 is None else self.w_delta0], 1, "w_delta0")[0])

    @property
    def length(self) -> int:
        return len(self.u_f)

    def with_loss(self) -> Chain:
        """The chain with a final stage of zero cost and size (the loss, as in the paper's
        Table 2), so that the backward starts from an empty gradient instead of holding
        ``delta^L`` all along. Returns the chain itself when ``delta^L`` is already empty."""
        if self.w_delta[-1] == 0:
            return self
        return Chain(u_f=self.u_f + (0.0,), u_b=self.u_b + (0.0,), w_a=self.w_a + (0.0,),
                     w_abar=self.w_abar + (0.0,), w_a0=self.w_a0, w_delta=self.w_delta + (0.0,),
                     w_delta0=self.w_delta0, o_f=self.o_f + (0.0,), o_b=self.o_b + (0.0,),
                     w_g=self.w_g + (0.0,), u_f_last=self.u_f_last + (0.0,))


@dataclasses.dataclass
class Solution:
    makespan: float  # of the sequence, summed in float64 by simulate
    peak: float  # of the sequence under the exact (unrounded) sizes
    sequence: list[Op]
    persistent: bool


# --------------------------------------------------------------------------------------
# The model: simulate (ground truth) and exhaustive search.
# --------------------------------------------------------------------------------------

class _Arrays:
    """Per-position arrays indexed 0..L (index 0: the input; stage fields 0 there).

    ``wd[k]``: what is held with the current gradient ``delta^k``: ``delta^k`` and the
    parameter gradients of stages ``k+1..L``, made by the ``B`` ops that ran (so the
    recurrences, which count the held gradient of each subproblem, count those too).
    ``wdb[s]``: what ``B^s`` adds while it runs: ``delta^(s-1)`` and ``w_g^s``."""

    def __init__(self, chain: Chain, scale=None):
        self.n = chain.length
        z = (0.0,)
        self.uf = np.array(z + chain.u_f)
        self.ufl = np.array(z + chain.u_f_last)
        self.ub = np.array(z + chain.u_b)
        self.uall = self.uf + self.ub  # F_all^s then B^s
        self.ulast = self.ufl + self.ub  # the same with delta^s current: a^s is not made
        self.wa = np.array((chain.w_a0,) + chain.w_a)
        self.wab = np.array((chain.w_a0,) + chain.w_abar)
        delta = np.array((chain.w_delta0,) + chain.w_delta)
        grads = np.array(z + chain.w_g)
        later = np.concatenate([np.cumsum(grads[::-1])[::-1][1:], [0.0]])  # later[k]: w_g of stages > k
        self.wd = delta + later
        self.wdb = np.concatenate([[0.0], delta[:-1] + grads[1:]])
        self.of = np.array(z + chain.o_f)
        self.ob = np.array(z + chain.o_b)
        if scale is not None:
            for name in ("wa", "wab", "wd", "wdb", "of", "ob"):
                setattr(self, name, scale(getattr(self, name)))


def _apply(c: _Arrays, act: list, k: int, mem, op: Op):
    """Run ``op`` on the state (``act`` is changed in place). Returns
    ``(k, mem after, memory while running)``; raises InvalidSequence."""
    s = op.stage
    if not 1 <= s <= c.n:
        raise InvalidSequence(f"{op}: no stage {s} in a chain of {c.n} stages")
    if act[s - 1] == _NO:
        raise InvalidSequence(f"{op}: a^{s - 1} is not in memory")
    if op.kind == B:
        if k != s:
            raise InvalidSequence(f"{op}: needs delta^{s}, but the current gradient is delta^{k}")
        if act[s] != _ABAR:
            raise InvalidSequence(f"{op}: abar^{s} is not in memory (run F_all^{s} first)")
        during = mem + c.wdb[s] + c.ob[s]
        mem = mem + c.wd[s - 1] - c.wd[s] - c.wab[s]
        act[s] = _NO
        if act[s - 1] == _A:
            act[s - 1] = _NO
            mem -= c.wa[s - 1]
        return s - 1, mem, during
    if act[s] != _NO:
        raise InvalidSequence(f"{op}: a^{s} is already in memory")
    out, size = (_ABAR, c.wab[s]) if op.kind == F_ALL else (_A, c.wa[s])
    during = mem + size + c.of[s]
    mem += size
    act[s] = out
    if op.kind == F_NONE and act[s - 1] == _A:
        act[s - 1] = _NO
        mem -= c.wa[s - 1]
    return k, mem, during


def _time(c: _Arrays, op: Op, k: int) -> float:
    """The time of ``op`` run while the current gradient is ``delta^k``."""
    if op.kind == B:
        return float(c.ub[op.stage])
    return float(c.ufl[op.stage] if op.kind == F_ALL and op.stage == k else c.uf[op.stage])


def _run(chain: Chain, sequence: Iterable[Op], budget: float | None, complete: bool = True):
    """Yields ``(op, time, memory while op runs)``; the checks of :func:`simulate`."""
    c = _Arrays(chain)
    act = [_NO] * (c.n + 1)
    act[0] = _A
    k = c.n
    mem = float(c.wa[0] + c.wd[c.n])
    for i, op in enumerate(sequence):
        gradient = k
        k, mem, during = _apply(c, act, k, mem, op)  # validates op first
        time = _time(c, op, gradient)
        if budget is not None and during > budget:
            raise InvalidSequence(f"operation {i} ({op}) needs {float(during):g} > budget {budget:g}")
        yield op, time, float(during)
    if complete and k != 0:
        raise InvalidSequence(f"the sequence ends with delta^{k}, not delta^0")


def simulate(chain: Chain, sequence: Iterable[Op], budget: float | None = None) -> tuple[float, float]:
    """``(makespan, peak memory)`` of ``sequence`` under the model of :class:`Chain`.

    Raises InvalidSequence when an operation misses an input or recomputes a value in
    memory, when the sequence does not end with ``delta^0``, or when the memory exceeds
    ``budget`` (if given)."""
    time, peak = 0.0, float(chain.w_a0 + chain.w_delta[-1])
    for _, t, during in _run(chain, sequence, budget):
        time += t
        peak = max(peak, during)
    return time, peak


def memory_profile(chain: Chain, sequence: Iterable[Op]) -> list[float]:
    """The memory while each operation runs (validated as by :func:`simulate`, but
    ``sequence`` may stop before ``delta^0``)."""
    return [during for _, _, during in _run(chain, sequence, None, complete=False)]


def store_all(chain: Chain) -> list[Op]:
    """The sequence without rematerialization: ``F_all^1 .. F_all^L B^L .. B^1``."""
    n = chain.length
    return [Op(F_ALL, s) for s in range(1, n + 1)] + [Op(B, s) for s in range(n, 0, -1)]


def is_persistent(sequence: Sequence[Op]) -> bool:
    """Memory persistence (the paper's Definition 4.1): after ``F_ck^i`` or ``F_all^i`` and
    until ``B^i``, no ``F_∅^i`` and no operation of a stage ``< i``."""
    pending: set[int] = set()
    for op in sequence:
        if any(i > op.stage for i in pending) or (op.kind == F_NONE and op.stage in pending):
            return False
        if op.kind in (F_ALL, F_CK):
            pending.add(op.stage)
        elif op.kind == B:
            pending.discard(op.stage)
    return True


def brute_force(chain: Chain, budget: float, persistent: bool = False) -> Solution:
    """Exhaustive search (tests only: exponential in L). Dijkstra over the model's states
    (what is in memory, the current gradient, and for ``persistent`` the pending
    checkpoints), stepping with the same code as :func:`simulate`; operations whose
    running memory exceeds ``budget`` are not taken. Forwards of stages past the current
    gradient are skipped (their outputs can never be used)."""
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


# --------------------------------------------------------------------------------------
# Discretisation.
# --------------------------------------------------------------------------------------

def _discretise(chain: Chain, budget: float, bins: int | None) -> tuple[_Arrays, int]:
    """Sizes in whole bins (rounded up) and the budget in bins (rounded down)."""
    if bins is None:
        values = (chain.w_a0, chain.w_delta0, budget) + chain.w_a + chain.w_abar + chain.w_delta \
            + chain.o_f + chain.o_b + chain.w_g
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


# --------------------------------------------------------------------------------------
# Memory-persistent DP (Algorithm 3), vectorised over the bins and the left ends.
#
# P(s, t, m): best time to turn (a^(s-1), delta^t) into delta^(s-1) with a^(s-1) kept
#   until B^s, peak <= m not counting a^(s-1). (wd^t: delta^t with the parameter gradients
#   of stages > t; wdb^s: what B^s adds, delta^(s-1) and w_g^s; see _Arrays.)
#   F_all^s:  u_f + u_b + P(s+1, t, m - w_abar^s)   [s < t]; u_f_last + u_b [s = t]
#             if m >= max(wd^t + wab^s + of^s, wd^s + wdb^s + wab^s + ob^s)
#   F_ck^s:   u_f^s + Q(s, s+1, t, m)  if m >= wd^t + wa^s + of^s           [s < t]
# Q(s, j, t, m): same, a^(s-1) kept and a^(j-1) (counted in m) the latest forward output.
#   checkpoint a^(j-1):  P(j, t, m - wa^(j-1)) + P(s, j-1, m)
#   F_∅^j:               u_f^j + Q(s, j+1, t, m)  if m >= wd^t + wa^(j-1) + wa^j + of^j  [j < t]
# The paper's C_ck(s, s', t) is Q unrolled: F_ck^s F_∅^(s+1) .. F_∅^(s'-1) then the split.
# --------------------------------------------------------------------------------------

_DT = np.float32  # tables: half the memory traffic of float64; makespans are re-summed in float64


def _shift(row: np.ndarray, w: int) -> np.ndarray:
    """``out[m] = row[m - w]`` (infinite where ``m < w``)."""
    out = np.full_like(row, np.inf)
    if w < row.shape[-1]:
        out[..., w:] = row[..., :row.shape[-1] - w]
    return out


def _persistent_table(c: _Arrays, S: int) -> list[np.ndarray]:
    n = c.n
    wa, wab, wd, wdb, of, ob = (getattr(c, x).tolist() for x in ("wa", "wab", "wd", "wdb", "of", "ob"))
    uf = c.uf.astype(_DT)
    uall, ulast = c.uall.astype(_DT), c.ulast.astype(_DT)
    width = S + 1
    cells = (n + 1) * (n + 2) // 2 * width
    if cells > 2 ** 30:
        raise ValueError(f"the persistent DP would need a {cells:,}-entry table: use fewer bins")
    P: list[np.ndarray] = [np.empty((0, width), _DT)]  # P[t][s, m] = P(s, t, m)
    buf = np.empty((n + 1, width), _DT)
    for t in range(1, n + 1):
        Pt = np.full((t + 1, width), np.inf, _DT)
        P.append(Pt)
        Q = np.full((t + 1, width), np.inf, _DT)  # Q[s] = Q(s, j+1, t) entering step j
        for j in range(t, 0, -1):
            row = Pt[j]
            thr_all = max(wd[t] + wab[j] + of[j], wd[j] + wdb[j] + wab[j] + ob[j])
            if j == t:
                row[min(thr_all, width):] = ulast[j]
            else:
                np.add(_shift(Pt[j + 1], wab[j]), uall[j], out=row)
                row[:thr_all] = np.inf
                ck = Q[j] + uf[j]
                ck[:wd[t] + wa[j] + of[j]] = np.inf
                np.minimum(row, ck, out=row)
            if j >= 2:
                rows = Q[1:j]
                mat = np.add(P[j - 1][1:j], _shift(row, wa[j - 1]), out=buf[:j - 1])
                if j == t:
                    rows[...] = mat
                else:
                    rows += uf[j]
                    rows[:, :wd[t] + wa[j - 1] + wa[j] + of[j]] = np.inf
                    np.minimum(rows, mat, out=rows)
    return P


def _persistent_sequence(c: _Arrays, P: list[np.ndarray], m0: int) -> list[Op]:
    """Algorithm 4: unfold the choices (recomputed from the table, same float32 sums)."""
    wa, wab, wd, wdb, of, ob = (getattr(c, x).tolist() for x in ("wa", "wab", "wd", "wdb", "of", "ob"))
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
        thr_all = max(wd[t] + wab[s] + of[s], wd[s] + wdb[s] + wab[s] + ob[s])
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
    """The same recurrences in (min, max): the smallest peak of a persistent sequence,
    in the units of ``c`` (no rounding)."""
    n = c.n
    wa, wab, wd, wdb, of, ob = (getattr(c, x).astype(float) for x in ("wa", "wab", "wd", "wdb", "of", "ob"))
    MP = [np.empty(0)] + [np.full(t + 1, np.inf) for t in range(1, n + 1)]  # MP[t][s]
    for t in range(1, n + 1):
        MQ = np.full(t + 1, np.inf)
        for j in range(t, 0, -1):
            thr_all = max(wd[t] + wab[j] + of[j], wd[j] + wdb[j] + wab[j] + ob[j])
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


# --------------------------------------------------------------------------------------
# Weakly persistent (exact) DP (Algorithm 1), one floating checkpoint move per F_∅.
#
# C(s, t, l, m): from (a^(s-1), delta^l), reach delta^(t-1) having discarded every
#   activation of index >= s-1, peak <= m not counting a^(s-1); s <= t <= l.
#   F_all^s  [t = s]:  u_f + u_b + C(s+1, s+1, l, m - wab^s)  ([s = l]: u_f_last + u_b)
#                      if m >= max(wd^l + wab^s + of^s, wd^s + wdb^s + wab^s + ob^s)
#   F_∅^s    [t > s]:  u_f^s + C(s+1, t, l, m + wa^(s-1) - wa^s)   if m >= wd^l + wa^s + of^s
#   F_ck^s   [t < l]:  u_f^s + min over t' in (t, l] of
#                      C(s+1, t', l, m - wa^s) + C(s, t, t'-1, m)    if m >= wd^l + wa^s + of^s
# --------------------------------------------------------------------------------------

def _weak_table(c: _Arrays, S: int) -> np.ndarray:
    n = c.n
    wa, wab, wd, wdb, of, ob = (getattr(c, x).tolist() for x in ("wa", "wab", "wd", "wdb", "of", "ob"))
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
            thr_all = max(wd[l] + wab[s] + of[s], wd[s] + wdb[s] + wab[s] + ob[s])
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
    wa, wab, wd, wdb, of, ob = (getattr(c, x).tolist() for x in ("wa", "wab", "wd", "wdb", "of", "ob"))
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
        if t == s and m >= max(wd[l] + wab[s] + of[s], wd[s] + wdb[s] + wab[s] + ob[s]):
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
    """(min, max) version of the exact DP: the smallest peak of a weakly persistent sequence."""
    n = c.n
    wa, wab, wd, wdb, of, ob = (getattr(c, x).astype(float) for x in ("wa", "wab", "wd", "wdb", "of", "ob"))
    M = np.full((n + 2, n + 2, n + 2), np.inf)
    for d in range(0, n):
        for s in range(1, n + 1 - d):
            l = s + d
            thr_all = max(wd[l] + wab[s] + of[s], wd[s] + wdb[s] + wab[s] + ob[s])
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


# --------------------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------------------

def min_budget(chain: Chain, persistent: bool = True) -> float:
    """The smallest budget at which a (persistent, or weakly persistent) sequence exists,
    with the exact sizes (no rounding)."""
    c = _Arrays(chain)
    return _persistent_min_memory(c) if persistent else _weak_min_memory(c)


def solve(chain: Chain, budget: float, *, bins: int | None = 500, persistent: bool = True) -> Solution:
    """The fastest sequence whose peak memory is at most ``budget``.

    bins: memory is counted in ``bins`` bins of ``budget / bins`` (sizes rounded up,
        so the plan always fits; it is optimal for the rounded sizes). ``None``: exact,
        with integer sizes and budget in a unit of 1 (the table then has ``budget + 1``
        columns).
    persistent: the memory-persistent DP (default, ``O(L^3 bins)``); ``False``: the
        exact weakly persistent DP (``O(L^4 bins)`` time, ``O(L^3 bins)`` memory).

    Raises InfeasibleBudget (with ``min_budget``) when no sequence fits.
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
