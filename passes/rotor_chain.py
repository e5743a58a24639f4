"""Rotor's problem: a heterogeneous chain, its operations, and the answer of a solver.

Problem
-------
A chain of ``L`` stages (:class:`Chain`): stage ``s`` turns ``a^(s-1)`` into ``a^s``
(forward ``F^s``) and ``delta^s`` into ``delta^(s-1)`` (backward ``B^s``). A plan is a
sequence of operations (:class:`Op`): ``F_all^s`` (record ``abar^s`` for the
backward), ``F_ck^s`` (keep the input, output ``a^s`` only), ``F_∅^s`` (output
``a^s``, free the input) and ``B^s``. :class:`Chain` states the memory model in
words; :mod:`passes.rotor_simulate` is its executable definition.

This module holds the plain data every Rotor module shares (the chain, the
operations and their text form, the answer and the budget error) and no algorithm.

References
----------
Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal re-materialization
strategies for heterogeneous chains", ACM TOMS 2024 (hal-02352969): section 3.1,
Table 1 (the operations) and Definitions 3.1-3.4 (valid sequence, makespan, memory).

Complexity: building a chain is ``O(L)``; reading or writing a sequence is linear
in its length.

Example
-------
>>> chain = Chain(u_f=[1, 2], u_b=[3, 4], w_a=[10, 20], w_abar=[15, 25], w_a0=5)
>>> chain.length, chain.w_delta, chain.with_loss().length
(2, (10.0, 20.0), 3)
>>> chain.with_loss(turn=7).o_f   # 7 bytes needed between the forward and the backward
(0.0, 0.0, 7.0)
>>> ops = parse_sequence("F_ck^1 F_none^2 B^2")
>>> ops[1], format_sequence(ops)
(Op(kind='F_none', stage=2), 'F_ck^1 F_∅^2 B^2')
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence

import numpy as np

F_ALL, F_CK, F_NONE, B = "F_all", "F_ck", "F_none", "B"
KINDS = (F_ALL, F_CK, F_NONE, B)
_SHOWN = {F_ALL: "F_all", F_CK: "F_ck", F_NONE: "F_∅", B: "B"}


class InfeasibleBudget(ValueError):
    """No sequence of the requested kind fits the budget; ``min_budget`` is the smallest that does.

    Raised by :func:`passes.rotor.solve` (with the exact ``min_budget``) and by
    :func:`passes.rotor_brute_force.brute_force` (``min_budget`` NaN: not computed).

    Parameters
    ----------
    message : str
    budget : float
        The budget asked for.
    min_budget : float
        The smallest feasible budget, or NaN when unknown.

    Returns
    -------
    InfeasibleBudget
        With ``budget`` and ``min_budget`` as attributes.

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """

    def __init__(self, message: str, budget: float, min_budget: float):
        super().__init__(message)
        self.budget = budget
        self.min_budget = min_budget


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a sequence: ``kind`` in ``F_all, F_ck, F_none, B``, ``stage`` in ``1..L``.

    ``str(op)`` is its text form (``F_∅^2``), read back by :func:`parse_sequence`.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS` (``F_ALL``, ``F_CK``, ``F_NONE``, ``B``).
    stage : int
        Checked against a chain by :func:`passes.rotor_simulate.simulate`.

    Returns
    -------
    Op
        Frozen (hashable).

    Raises
    ------
    ValueError
        If ``kind`` is not one of :data:`KINDS`.

    Complexity
    ----------
    ``O(1)``.
    """

    kind: str
    stage: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown operation kind {self.kind!r}; expected one of {KINDS}")

    def __str__(self) -> str:
        return f"{_SHOWN[self.kind]}^{self.stage}"


def parse_sequence(text: str) -> list[Op]:
    """Read a sequence written as ``"F_ck^1 F_∅^2 F_all^3 B^3 ..."``.

    ``F_none``, ``F_0``, ``F_phi`` and ``F_ø`` also read as ``F_∅``; ``F_ck^{12}`` as
    ``F_ck^12``.

    Parameters
    ----------
    text : str
        Operations separated by white space.

    Returns
    -------
    list of Op

    Raises
    ------
    ValueError
        If a token is not an operation.

    Complexity
    ----------
    ``O(len(text))``.
    """
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
    """The text form of a sequence, as the paper writes it (``F_ck^1 F_∅^2 B^2``).

    Parameters
    ----------
    sequence : iterable of Op

    Returns
    -------
    str
        The operations separated by single spaces (:func:`parse_sequence` reads it back).

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(len(sequence))``.
    """
    return " ".join(str(op) for op in sequence)


def _floats(values, n: int, name: str) -> tuple[float, ...]:
    """``values`` as a tuple of ``n`` finite, non-negative floats; ValueError otherwise."""
    out = tuple(float(v) for v in values)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries, the chain has {n} stages")
    if any(not math.isfinite(v) or v < 0 for v in out):
        raise ValueError(f"{name} must be finite and non-negative")
    return out


@dataclasses.dataclass(frozen=True)
class Chain:
    """A chain of ``L`` stages; entry ``s - 1`` of each list describes stage ``s``.

    Parameters
    ----------
    u_f, u_b : sequence of float
        Times of ``F^s`` (any mode) and ``B^s``.
    w_a : sequence of float
        ``omega_a^s``, size of the stage output ``a^s``.
    w_abar : sequence of float
        ``omega_abar^s``, size of ``abar^s``, everything ``F_all^s`` keeps for ``B^s``,
        ``a^s`` included (physically ``w_abar >= w_a``; not required).
    w_a0 : float
        ``omega_a^0``, size of the chain input ``a^0``.
    w_delta : sequence of float, optional
        ``omega_delta^s``, size of the gradient ``delta^s`` (default ``w_a``).
    w_delta0 : float, optional
        Size of ``delta^0``, the gradient of the input (default ``w_a0``).
    o_f, o_b : sequence of float, optional
        Peak overheads of ``F^s`` and ``B^s``: temporary memory on top of their inputs and
        outputs (default 0).
    w_g : sequence of float, optional
        Bytes ``B^s`` makes that stay to the end of the step (the gradients of the stage's
        parameters; default 0). An extension of the paper's model: counted outside the
        chain as alive throughout, the gradients of a deep model's later layers would be
        counted during its whole forward, and the DP would recompute more than a budget
        needs.
    u_f_last : sequence of float, optional
        Time of ``F_all^s`` run while the current gradient is ``delta^s`` (default ``u_f``).
        The stages after ``s`` are then done, so nothing reads ``a^s`` again and the ops
        that only make it are skipped: a stage whose output is made by a matmul that its
        backward does not need (a transformer block's last projection) costs less there.
        An extension of the paper's model, which charges ``u_f`` and so overprices the last
        stage of every recomputed segment.
    w_abar_last : sequence of float, optional
        Size of what ``F_all^s`` keeps for ``B^s`` when it runs while the current gradient is
        ``delta^s`` (default ``w_abar``): only what ``B^s`` reads, since ``a^s`` is then not
        made unless ``B^s`` reads it. The memory twin of ``u_f_last``: a transformer MLP's
        activation-function stage keeps its input for its backward, not its output (a small
        ViT's, 1 MiB a layer: its least plan measured 7.82 MiB before, 7.56 MiB with it).

    Returns
    -------
    Chain
        Frozen, every list a tuple of floats, the defaults filled in.

    Raises
    ------
    ValueError
        If there is no stage, a list's length is not ``L``, or a value is negative or not
        finite.

    Complexity
    ----------
    ``O(L)``.

    Notes
    -----
    The memory model (the paper's section 3.1, Table 1 and Definitions 3.3-3.4). Only
    activations and gradients count (weights and their gradients are outside the
    budget). Memory holds, per position ``l``, nothing, ``a^l`` (``w_a``) or ``abar^l``
    (``w_abar``, which holds ``a^l``), plus the one current gradient ``delta^k``. A sequence
    starts with ``a^0`` and ``delta^L`` (so a chain ending in a loss should end with a
    zero-size stage: :meth:`with_loss`) and must end with ``delta^0``.

    * ``F_all^s``, ``F_ck^s``, ``F_∅^s`` need ``a^(s-1)`` (or ``abar^(s-1)``); while running
      they use everything in memory plus their output (``w_abar^s`` for ``F_all``, or
      ``w_abar_last^s`` while ``delta^s`` is current, else ``w_a^s``) plus ``o_f^s``.
      ``F_all`` leaves ``abar^s`` (without ``a^s`` in the second case: no forward can read
      it), the others ``a^s``; ``F_∅`` then frees ``a^(s-1)`` unless it is part of
      ``abar^(s-1)``.
    * ``B^s`` needs ``delta^s``, ``abar^s`` and ``a^(s-1)``; while running it uses
      everything in memory plus ``w_delta^(s-1) + w_g^s + o_b^s``; it then frees ``delta^s``,
      ``abar^s`` and ``a^(s-1)`` (unless part of ``abar^(s-1)``), leaving ``delta^(s-1)``
      and ``w_g^s`` (held to the end).
    * A forward never recomputes a value that is in memory: ``F^s`` is invalid while
      ``a^s`` or ``abar^s`` is held. (The paper leaves this case open; allowing it would
      turn ``F_∅^s`` after ``F_all^s`` into a paid "free ``a^(s-1)``" operation that the
      model does not otherwise have.)

    The peak of a sequence is the largest of these running totals.

    References
    ----------
    Beaumont et al., ACM TOMS 2024 (hal-02352969), section 3.1; ``u_f_last`` and ``w_g``
    are fxremat's.
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
    w_abar_last: Sequence[float] | None = None

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
        fix("w_abar_last", _floats(self.w_abar if self.w_abar_last is None else self.w_abar_last, n, "w_abar_last"))
        fix("w_a0", _floats([self.w_a0], 1, "w_a0")[0])
        fix("w_delta0", _floats([self.w_a0 if self.w_delta0 is None else self.w_delta0], 1, "w_delta0")[0])

    @property
    def length(self) -> int:
        """``L``, the number of stages."""
        return len(self.u_f)

    def with_loss(self, turn: float = 0.0, turn_kept: float = 0.0) -> Chain:
        """The chain with a final stage of zero cost and size: the loss, as in the paper's Table 2.

        The backward then starts from an empty gradient instead of holding ``delta^L`` all
        along.

        Parameters
        ----------
        turn : float, optional
            Bytes needed once at the turn from forward to backward, beside all that the
            forward leaves in memory: the loss stage's forward overhead ``o_f``. fxremat's
            extension: the step's later graphs run there while this graph is held.
        turn_kept : float, optional
            Of ``turn``, the bytes that stay to the end of the step (the later graphs'
            parameter gradients): the loss stage's ``w_g``.

        Returns
        -------
        Chain
            ``L + 1`` stages, or the chain itself when ``delta^L`` is already empty and
            ``turn`` is 0.

        Raises
        ------
        Nothing

        Complexity
        ----------
        ``O(L)``.
        """
        if self.w_delta[-1] == 0 and not turn and not turn_kept:
            return self
        return Chain(u_f=self.u_f + (0.0,), u_b=self.u_b + (0.0,), w_a=self.w_a + (0.0,),
                     w_abar=self.w_abar + (0.0,), w_a0=self.w_a0, w_delta=self.w_delta + (0.0,),
                     w_delta0=self.w_delta0, o_f=self.o_f + (float(turn),), o_b=self.o_b + (0.0,),
                     w_g=self.w_g + (float(turn_kept),), u_f_last=self.u_f_last + (0.0,),
                     w_abar_last=self.w_abar_last + (0.0,))


@dataclasses.dataclass
class Solution:
    """The answer of :func:`passes.rotor.solve` and :func:`passes.rotor_brute_force.brute_force`.

    Parameters
    ----------
    makespan : float
        Of the sequence, summed in float64 by :func:`passes.rotor_simulate.simulate`.
    peak : float
        Of the sequence, under the exact (unrounded) sizes.
    sequence : list of Op
    persistent : bool
        Whether the search was restricted to memory-persistent sequences.

    Returns
    -------
    Solution

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """

    makespan: float
    peak: float
    sequence: list[Op]
    persistent: bool


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
        self.wabl = np.array((chain.w_a0,) + chain.w_abar_last)  # F_all^s with delta^s current
        delta = np.array((chain.w_delta0,) + chain.w_delta)
        grads = np.array(z + chain.w_g)
        later = np.concatenate([np.cumsum(grads[::-1])[::-1][1:], [0.0]])  # later[k]: w_g of stages > k
        self.wd = delta + later
        self.wdb = np.concatenate([[0.0], delta[:-1] + grads[1:]])
        self.of = np.array(z + chain.o_f)
        self.ob = np.array(z + chain.o_b)
        if scale is not None:
            for name in ("wa", "wab", "wabl", "wd", "wdb", "of", "ob"):
                setattr(self, name, scale(getattr(self, name)))
