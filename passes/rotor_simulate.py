"""Rotor's memory model, executable: a sequence checked, its makespan and its peak.

Problem
-------
Given a :class:`~passes.rotor_chain.Chain` and a sequence of its operations, decide
whether the sequence is valid (every operation finds its inputs in memory, no forward
recomputes a value that is in memory, the sequence ends with ``delta^0``) and return
its makespan (the sum of the operation times) and its peak (the largest memory while
an operation runs). This is the ground truth the dynamic programs and the exhaustive
search are checked against: :func:`passes.rotor.solve` simulates every plan it
returns.

Method
------
Track, for each chain position ``l``, whether memory holds nothing, ``a^l`` or
``abar^l``, and which gradient ``delta^k`` is current, and apply each operation's
rules as :class:`~passes.rotor_chain.Chain` states them.

References
----------
Beaumont et al., ACM TOMS 2024 (hal-02352969): section 3.1, Table 1 and
Definitions 3.1-3.4; memory persistence, Definition 4.1.

Complexity: ``O(L + len(sequence))``.

Example
-------
Three unit stages: checkpoint ``a^0`` and ``a^2`` only, then recompute stage 1:

>>> from fxremat.passes.rotor_chain import Chain, parse_sequence
>>> chain = Chain(u_f=[1, 1, 1], u_b=[1, 1, 1], w_a=[1, 1, 1], w_abar=[1, 1, 1], w_a0=1)
>>> sequence = parse_sequence("F_ck^1 F_∅^2 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1")
>>> simulate(chain, sequence), simulate(chain, store_all(chain))
((8.0, 5.0), (6.0, 6.0))
>>> memory_profile(chain, sequence[:4])
[3.0, 4.0, 4.0, 5.0]
>>> is_persistent(sequence)
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .rotor_chain import B, F_ALL, F_CK, F_NONE, Chain, Op, _Arrays

# What is in memory at each chain position: nothing, a^l, abar^l (which holds a^l), or
# abar^l made while delta^l was current (w_abar_last: a^l itself was not made).
_NO, _A, _ABAR, _ABAR_LAST = 0, 1, 2, 3


class InvalidSequence(ValueError):
    """A sequence breaks the data dependencies of the model (or the budget given to simulate).

    Parameters
    ----------
    message : str
        The first broken rule, with the operation.

    Returns
    -------
    InvalidSequence

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """


def _apply(c: _Arrays, act: list, k: int, mem, op: Op):
    """Run ``op`` on the state (``act`` is changed in place). Returns
    ``(k, mem after, memory while running)``; raises InvalidSequence."""
    s = op.stage
    if not 1 <= s <= c.n:
        raise InvalidSequence(f"{op}: no stage {s} in a chain of {c.n} stages")
    if act[s - 1] in (_NO, _ABAR_LAST):
        raise InvalidSequence(f"{op}: a^{s - 1} is not in memory")
    if op.kind == B:
        if k != s:
            raise InvalidSequence(f"{op}: needs delta^{s}, but the current gradient is delta^{k}")
        if act[s] not in (_ABAR, _ABAR_LAST):
            raise InvalidSequence(f"{op}: abar^{s} is not in memory (run F_all^{s} first)")
        during = mem + c.wdb[s] + c.ob[s]
        mem = mem + c.wd[s - 1] - c.wd[s] - (c.wabl[s] if act[s] == _ABAR_LAST else c.wab[s])
        act[s] = _NO
        if act[s - 1] == _A:
            act[s - 1] = _NO
            mem -= c.wa[s - 1]
        return s - 1, mem, during
    if act[s] != _NO:
        raise InvalidSequence(f"{op}: a^{s} is already in memory")
    if op.kind == F_ALL:  # with delta^s current, only what B^s reads (w_abar_last)
        out, size = (_ABAR_LAST, c.wabl[s]) if k == s else (_ABAR, c.wab[s])
    else:
        out, size = _A, c.wa[s]
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
    """``(makespan, peak memory)`` of ``sequence`` under the model of :class:`~passes.rotor_chain.Chain`.

    Parameters
    ----------
    chain : Chain
    sequence : iterable of Op
    budget : float, optional
        If given, the memory while each operation runs must not exceed it.

    Returns
    -------
    makespan : float
        The sum of the operation times (``u_f_last`` for ``F_all^s`` run while ``delta^s``
        is the current gradient), in float64.
    peak : float
        The largest memory while an operation runs (at least ``a^0`` and ``delta^L``).

    Raises
    ------
    InvalidSequence
        When an operation names no stage of the chain, misses an input or recomputes a
        value in memory, when the sequence does not end with ``delta^0``, or when the
        memory exceeds ``budget``.

    Complexity
    ----------
    ``O(L + len(sequence))``.

    References
    ----------
    Beaumont et al., ACM TOMS 2024, Table 1 and Definitions 3.1-3.4.
    """
    time, peak = 0.0, float(chain.w_a0 + chain.w_delta[-1])
    for _, t, during in _run(chain, sequence, budget):
        time += t
        peak = max(peak, during)
    return time, peak


def memory_profile(chain: Chain, sequence: Iterable[Op]) -> list[float]:
    """The memory while each operation runs.

    Validated as by :func:`simulate`, but ``sequence`` may stop before ``delta^0``.

    Parameters
    ----------
    chain : Chain
    sequence : iterable of Op

    Returns
    -------
    list of float
        One value an operation.

    Raises
    ------
    InvalidSequence
        When an operation names no stage of the chain, misses an input or recomputes a
        value in memory.

    Complexity
    ----------
    ``O(L + len(sequence))``.
    """
    return [during for _, _, during in _run(chain, sequence, None, complete=False)]


def store_all(chain: Chain) -> list[Op]:
    """The sequence without rematerialization: ``F_all^1 .. F_all^L B^L .. B^1``.

    Parameters
    ----------
    chain : Chain

    Returns
    -------
    list of Op

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(L)``.
    """
    n = chain.length
    return [Op(F_ALL, s) for s in range(1, n + 1)] + [Op(B, s) for s in range(n, 0, -1)]


def is_persistent(sequence: Sequence[Op]) -> bool:
    """Whether ``sequence`` is memory persistent.

    After ``F_ck^i`` or ``F_all^i`` and until ``B^i``: no ``F_∅^i`` and no operation of a
    stage ``< i``.

    Parameters
    ----------
    sequence : sequence of Op

    Returns
    -------
    bool

    Raises
    ------
    Nothing
        The sequence is not checked against a chain.

    Complexity
    ----------
    ``O(len(sequence) * L)``.

    References
    ----------
    Beaumont et al., ACM TOMS 2024, Definition 4.1.
    """
    pending: set[int] = set()
    for op in sequence:
        if any(i > op.stage for i in pending) or (op.kind == F_NONE and op.stage in pending):
            return False
        if op.kind in (F_ALL, F_CK):
            pending.add(op.stage)
        elif op.kind == B:
            pending.discard(op.stage)
    return True
