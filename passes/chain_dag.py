"""Rotor's chains as rematerialization DAGs: Checkmate and Rotor on the same problem.

Problem
-------
Given a Rotor chain (:class:`passes.rotor_chain.Chain`: stage times ``u_f, u_b``, sizes
``omega_a, omega_abar, omega_delta``, overheads ``o_f, o_b``), build a
:class:`passes.remat_problem.RematProblem` whose schedules are Rotor's operation sequences,
with the same costs and the same memory, so that Checkmate's ILP
(:mod:`passes.checkmate`) and Rotor's dynamic programs (:mod:`passes.rotor`) can be
checked against each other.

Method
------
Stage ``s`` (``1..L``) becomes three nodes, listed ``f1 x1 f2 x2 .. fL xL bL .. b1``:

* ``f{s}``: ``F^s``, the output ``a^s``. Reads ``f{s-1}``; cost ``u_f^s``, size
  ``omega_a^s``, workspace ``o_f^s``.
* ``x{s}``: what ``F_all^s`` records beyond ``a^s`` (``abar^s - a^s``), *tied* to ``f{s}``
  (:class:`~passes.remat_problem.RematProblem`, ``tied``). Reads ``f{s-1}`` and ``f{s}``;
  cost 0, size ``omega_abar^s - omega_a^s``, workspace ``o_f^s``.
* ``b{s}``: ``B^s``, the gradient ``delta^(s-1)``. Reads ``b{s+1}`` (``delta^s``),
  ``f{s}``, ``x{s}`` (``abar^s``) and ``f{s-1}``; cost ``u_b^s``, size
  ``omega_delta^(s-1)``, workspace ``o_b^s``. The output is ``b1``.

So ``F_all^s`` is ``compute f{s}, compute x{s}`` (running: resident + ``omega_abar^s +
o_f^s``), ``F_ck^s`` is ``compute f{s}`` (resident + ``omega_a^s + o_f^s``), ``F_∅^s``
is ``compute f{s}`` then ``free f{s-1}``, and ``B^s`` is ``compute b{s}`` then frees its
inputs -- Rotor's memory model, operation by operation.

The tie is what separates a stage's keep-all (``omega_abar``) from its keep-input-only
(``omega_a``) the way autograd does: the saved state ``abar^s`` is recorded only by
running the stage forward (``x{s}`` right after ``f{s}``, together costing ``u_f^s``
once), having ``a^s`` in memory does not give it, and while it is held the values it
references (``a^s``, and ``a^(s-1)`` that ``B^s`` reads) stay -- in Rotor only ``B^s``
frees them. With a plain node for ``abar^s - a^s`` instead, computable from ``a^(s-1)``
and ``a^s`` at no cost, the DAG would skip Rotor's re-runs of ``F_all^s`` after
``F_ck^s`` and beat every Rotor sequence.

``a^0`` is in memory during every Rotor sequence (``B^1``, the last operation, reads it
and nothing recomputes it), so it is not a node: it is a constant ``omega_a^0`` under the
peak, and a Rotor budget ``M`` is the DAG budget ``M - omega_a^0`` (:func:`dag_budget`).
The chain must start its backward from an empty gradient (``omega_delta^L = 0``, as
:meth:`Chain.with_loss <passes.rotor_chain.Chain.with_loss>` makes it): Rotor holds
``delta^L`` from the first operation.

What holds (``tests/test_solver_crosscheck.py``): every Rotor sequence is, by
:func:`to_computes`, a valid schedule of the same cost whose peak is at most the Rotor
peak minus ``omega_a^0`` (equal for the DP's sequences); memory-persistent sequences
(forwards between two backward steps go up the chain, each at most once) are *staged*
in this node order, so Checkmate's ILP optimum is at most the persistent DP's
makespan; and the cheapest schedule of the DAG (exhaustive search) equals the cheapest
Rotor sequence (Rotor's exhaustive search, or the weakly persistent DP). Hence
``weak DP <= ILP <= persistent DP``, with equality throughout whenever a persistent
sequence is optimal, which is the common case on small chains.

Complexity: ``O(L)`` nodes and edges.

Example
-------
>>> from fxremat.passes.rotor import Chain
>>> chain = Chain(u_f=[1, 1, 1], u_b=[1, 1, 1], w_a=[1, 1, 1], w_abar=[2, 2, 1], w_a0=1).with_loss()
>>> problem = from_chain(chain)
>>> list(problem.nodes)
['f1', 'x1', 'f2', 'x2', 'f3', 'x3', 'f4', 'x4', 'b4', 'b3', 'b2', 'b1']
>>> problem.tied["x2"], problem.size["x2"], problem.size["b2"]
('f2', 1.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Iterable

from .rotor_chain import B, F_ALL, Chain, Op as RotorOp
from .schedule import Op, RematProblem, from_computes


def _names(s: int) -> tuple[str, str, str]:
    """The nodes of stage ``s``: ``f{s}``, ``x{s}``, ``b{s}``."""
    return f"f{s}", f"x{s}", f"b{s}"


def from_chain(chain: Chain) -> RematProblem:
    """The RematProblem of ``chain``, node by node as the module docstring lays it out.

    Parameters
    ----------
    chain : Chain
        With an empty last gradient (``omega_delta^L = 0``: :meth:`Chain.with_loss
        <passes.rotor_chain.Chain.with_loss>`) and ``omega_abar^s >= omega_a^s`` at every
        stage. ``u_f_last``, ``w_abar_last`` and ``w_g`` are not mapped.

    Returns
    -------
    RematProblem
        Nodes ``f1 x1 .. fL xL bL .. b1``, ``x{s}`` tied to ``f{s}``, output ``b1``.

    Raises
    ------
    ValueError
        If ``omega_delta^L`` is not 0 or a stage records less than its output
        (``omega_abar^s < omega_a^s``).

    Complexity
    ----------
    ``O(L)``.
    """
    n = chain.length
    if chain.w_delta[-1] != 0:
        raise ValueError("the chain's last gradient must be empty (omega_delta^L = 0): use chain.with_loss()")
    bad = [s for s in range(1, n + 1) if chain.w_abar[s - 1] < chain.w_a[s - 1]]
    if bad:
        raise ValueError(f"stages {bad} record less than their output (omega_abar < omega_a)")
    nodes, edges = [], []
    cost, size, work, tied = {}, {}, {}, {}
    for s in range(1, n + 1):
        f, x, _ = _names(s)
        prev = [_names(s - 1)[0]] if s > 1 else []
        nodes += [f, x]
        edges += [(p, f) for p in prev] + [(p, x) for p in prev] + [(f, x)]
        cost[f], size[f], work[f] = chain.u_f[s - 1], chain.w_a[s - 1], chain.o_f[s - 1]
        cost[x], size[x], work[x] = 0.0, chain.w_abar[s - 1] - chain.w_a[s - 1], chain.o_f[s - 1]
        tied[x] = f
    for s in range(n, 0, -1):
        f, x, b = _names(s)
        nodes.append(b)
        reads = ([_names(s + 1)[2]] if s < n else []) + [f, x] + ([_names(s - 1)[0]] if s > 1 else [])
        edges += [(r, b) for r in reads]
        cost[b], work[b] = chain.u_b[s - 1], chain.o_b[s - 1]
        size[b] = chain.w_delta[s - 2] if s > 1 else chain.w_delta0
    return RematProblem(nodes=nodes, edges=edges, cost=cost, size=size, outputs={"b1"}, workspace=work,
                        tied=tied)


def dag_budget(chain: Chain, budget: float) -> float:
    """The DAG budget of a Rotor budget: without ``a^0``, held throughout.

    Parameters
    ----------
    chain : Chain
    budget : float
        A Rotor budget (memory with ``a^0``).

    Returns
    -------
    float
        ``budget - omega_a^0``.

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """
    return budget - chain.w_a0


def to_computes(sequence: Iterable[RotorOp]) -> list[str]:
    """The computes of a Rotor sequence.

    ``F_all^s`` -> ``f{s}, x{s}``; ``F_ck^s`` and ``F_∅^s`` -> ``f{s}``; ``B^s`` -> ``b{s}``.

    Parameters
    ----------
    sequence : iterable of passes.rotor_chain.Op

    Returns
    -------
    list of str

    Raises
    ------
    Nothing
        The sequence is not checked (:func:`passes.schedule.simulate` checks the schedule).

    Complexity
    ----------
    ``O(len(sequence))``.
    """
    out = []
    for op in sequence:
        f, x, b = _names(op.stage)
        out += [b] if op.kind == B else [f, x] if op.kind == F_ALL else [f]
    return out


def to_schedule(problem: RematProblem, sequence: Iterable[RotorOp]) -> list[Op]:
    """A Rotor sequence as a schedule of ``problem``, each value freed after its last use.

    Parameters
    ----------
    problem : RematProblem
        :func:`from_chain` of the sequence's chain.
    sequence : iterable of passes.rotor_chain.Op

    Returns
    -------
    list of passes.schedule.Op

    Raises
    ------
    ScheduleError
        If a compute comes before any computation of one of its inputs.

    Complexity
    ----------
    ``O(len(sequence))``.
    """
    return from_computes(problem, to_computes(sequence))
