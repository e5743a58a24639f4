"""Checkmate's mixed-integer program: variables and constraints of a staged schedule.

Problem
-------
Write "the cheapest staged schedule of a :class:`~passes.remat_problem.RematProblem` whose
peak is at most a budget" (:mod:`passes.checkmate`) as a MILP in the form of
``scipy.optimize.milp``, for :func:`passes.checkmate.solve` (integral),
:func:`passes.checkmate_rounding.solve_lp` (its LP relaxation) and
:func:`passes.checkmate.min_budget` (minimizing the peak instead). This module also
holds the result and error types the Checkmate solvers share.

Method
------
Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization", MLSys 2020 (arXiv 1910.02653): the MILP over staged schedules
(slides: ``checkmate-optimal-tensor-rematerialization-slides.md`` in the fxremat
papers). The schedule is cut
into *frontier-advancing stages*: stage ``t`` computes node ``t`` for the first time,
possibly after recomputing earlier nodes, each at most once, in node order. Binary
variables: ``R[t,i]`` (node ``i`` computed in stage ``t``), ``S[t,i]`` (``i``
resident when stage ``t`` starts; ``S[n,.]`` is the state at the end, where the
outputs must be resident); ``FREE[t,i,k]`` (``i`` freed just after computing ``k``
in stage ``t``, with ``i`` an input of ``k`` or ``k`` itself); continuous ``U[t,k]``
(bytes resident while ``k`` is computed in stage ``t``). Minimize ``sum C_i R[t,i]``
subject to

* ``R[t,t] = 1``; ``R`` lower triangular, ``S`` strictly lower triangular;
* ``R[t,j] <= R[t,i] + S[t,i]`` for every edge ``(i, j)`` (inputs available);
* ``S[t+1,i] <= R[t,i] + S[t,i]`` (only computed or kept values are kept);
* ``FREE[t,i,k] = R[t,k] (1 - S[t+1,i]) prod_{j users of i, k<j<=t} (1 - R[t,j])``,
  linearized with one inequality per factor and one for the sum (exact for 0/1 ``R, S``);
* ``U[t,0] = M_0 R[t,0] + sum_i M_i S[t,i]``,
  ``U[t,k] = U[t,k-1] - sum_{i in in(k-1) + {k-1}} M_i FREE[t,i,k-1] + M_k R[t,k]``,
  ``U[t,k] <= budget``.

Added cuts, all satisfied by some optimal solution (drop what is kept but never
read, and recomputations never read: cost and memory only go down):
``R[t,i] + S[t,i] <= 1`` (never recompute a resident value), and for ``i < t``
``S[t,i] <= S[t+1,i] + sum_{j users of i, j<=t} R[t,j]`` and the same bound on
``R[t,i]``. They make the LP relaxation much tighter. (Fixing ``S[t,i] = 0`` when
every user of ``i`` precedes ``t`` would *not* be safe: a user recomputed in
stage ``t`` may read a kept ``i``.)

Two additions to the paper's model (fields of :class:`~passes.remat_problem.RematProblem`):
a node's ``workspace`` ``W_k`` adds ``U[t,k] + W_k R[t,k] <= budget``; a node ``x``
*tied* to ``f`` (a second output of ``f``'s operation, such as the state a forward
records for its backward) has no stage of its own -- it may be computed in ``f``'s
first stage, right after ``f`` -- is computed only together with ``f``
(``R[t,x] <= R[t,f]``, no ``S`` term) and pins its inputs while resident
(``S[t,x] <= S[t,q]`` for every input ``q`` of ``x``). Stages are then numbered by
their first-computed ("head") node (:func:`stages_of`) and ``R``, ``S`` have one row
per stage. Sizes are divided by the largest size or workspace, so that HiGHS's
tolerances are relative.

Complexity: ``O(n^2)`` binary variables and ``O(n (n + m) d)`` constraints for
``n`` nodes, ``m`` edges, out-degree ``d``; building the model is linear in their
number.

Example
-------
A node ``x`` tied to ``f`` has no stage of its own: it shares ``f``'s.

>>> from fxremat.passes.schedule import RematProblem
>>> p = RematProblem(nodes=["a", "f", "x", "g"],
...                  edges=[("a", "f"), ("a", "x"), ("f", "x"), ("a", "g"), ("f", "g"), ("x", "g")],
...                  cost={"a": 1, "f": 4, "x": 0, "g": 1}, size={"a": 2, "f": 1, "x": 3, "g": 1},
...                  outputs={"g"}, tied={"x": "f"})
>>> stages_of(p)
[(0, 0), (1, 2), (3, 3)]
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .schedule import Op, RematProblem, from_computes, simulate


class NoScheduleFound(RuntimeError):
    """No schedule under the budget was found (not proven impossible: see InfeasibleBudget).

    Raised by :func:`passes.checkmate.solve` when HiGHS stops before any schedule is
    found, and by :func:`passes.checkmate_rounding.solve_lp` when no rounding fits.

    Parameters
    ----------
    message : str

    Returns
    -------
    NoScheduleFound

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """


class InfeasibleBudget(NoScheduleFound):
    """No staged schedule fits the budget (proven by the solver).

    A :class:`NoScheduleFound`, so that callers may catch both at once.

    Parameters
    ----------
    message : str
    budget : float
        The budget asked for.
    lower_bound : float
        Bytes every schedule needs (:func:`passes.schedule.memory_lower_bound`: the
        largest working set, all outputs together).
    min_feasible : float, optional
        The smallest budget with a staged schedule for this node order, if found.
    min_feasible_range : (float, float or None), optional
        ``(lower, upper)`` around it when the search stopped early.

    Returns
    -------
    InfeasibleBudget
        With the keyword arguments as attributes.

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """

    def __init__(self, message, *, budget, lower_bound, min_feasible=None, min_feasible_range=None):
        super().__init__(message)
        self.budget = budget
        self.lower_bound = lower_bound
        self.min_feasible = min_feasible
        self.min_feasible_range = min_feasible_range


@dataclasses.dataclass
class CheckmateSolution:
    """A Checkmate schedule, with what the solver proved about it.

    Parameters
    ----------
    schedule : list of Op
    cost : float
        Total cost of ``schedule`` (:func:`passes.schedule.simulate`).
    peak_bytes : int
        Peak of ``schedule`` (:func:`passes.schedule.simulate`), at most ``budget``.
    budget : float
    method : str
        ``"ilp"`` or ``"lp-rounding"``.
    status : str
        ``"optimal"``, ``"time_limit"`` (the incumbent, not proven optimal) or ``"rounded"``.
    stopped_early : bool
        The solver hit its time or node limit.
    objective : float
        HiGHS's objective (equals ``cost`` up to its tolerances).
    bound : float
        A lower bound on the staged optimum (the MIP dual bound; the LP value).
    gap : float
        ``(objective - bound) / objective``; 0 when proven optimal.
    solve_seconds : float
    nodes : list of str
        The nodes some output needs, in order (stage heads and tied nodes).
    R : numpy.ndarray
        ``R[t, i]``: ``nodes[i]`` computed in stage ``t``, shape ``(stages, n)``.
    S : numpy.ndarray
        ``S[t, i]``: ``nodes[i]`` resident when stage ``t`` starts, shape ``(stages + 1, n)``.

    Returns
    -------
    CheckmateSolution

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """

    schedule: list[Op]
    cost: float
    peak_bytes: int
    budget: float
    method: str
    status: str
    stopped_early: bool
    objective: float
    bound: float
    gap: float
    solve_seconds: float
    nodes: list[str]
    R: np.ndarray
    S: np.ndarray


def _empty(budget: float, method: str) -> CheckmateSolution:
    """The answer when no node is needed: the empty schedule."""
    z = np.zeros((0, 0))
    return CheckmateSolution([], 0, 0, budget, method, "optimal", False, 0.0, 0.0, 0.0, 0.0, [], z,
                             np.zeros((1, 0)))


def stages_of(sub: RematProblem) -> list[tuple[int, int]]:
    """The stages of ``sub`` as ``(head, top)`` node indices.

    Stage ``p`` computes ``head`` for the first time and may compute any node ``<= top``;
    ``top`` is ``head`` or the node tied to it (a tied node shares its owner's stage).

    Parameters
    ----------
    sub : RematProblem
        Restricted (:meth:`~passes.remat_problem.RematProblem.restricted`): every node needed.

    Returns
    -------
    list of (int, int)
        One pair a stage, in node order.

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(n)``.

    References
    ----------
    Jain et al., MLSys 2020: frontier-advancing stages.
    """
    tied_to = sub.tied_to
    out = []
    for i in range(len(sub.nodes)):
        if tied_to[i] is None:
            top = i + 1 if i + 1 < len(sub.nodes) and tied_to[i + 1] == i else i
            out.append((i, top))
    return out


class _Model:
    """The MILP in scipy.optimize.milp's form: variables, bounds, sparse rows."""

    def __init__(self, problem: RematProblem, budget: float | None):
        sub = problem.restricted()
        self.sub = sub
        self.n = n = len(sub.nodes)
        self.stages = stages = stages_of(sub)
        P = self.P = len(stages)
        preds, users, tied_to = sub.preds, sub.users, sub.tied_to
        cost = np.array([float(sub.cost[v]) for v in sub.nodes])
        size = np.array([float(sub.size[v]) for v in sub.nodes])
        work = np.array([float(w) for w in sub.work])
        self.scale = max(float((size + work).max(initial=0.0)), 1.0)
        mem = size / self.scale
        wmem = work / self.scale
        is_output = np.zeros(n, dtype=bool)
        is_output[sub.output_ids] = True

        c, lb, ub, integ = [], [], [], []

        def var(cost_=0.0, lo=0.0, hi=1.0, integer=True):
            c.append(cost_)
            lb.append(lo)
            ub.append(hi)
            integ.append(1 if integer else 0)
            return len(c) - 1

        self.r = {}
        for p, (head, top) in enumerate(stages):
            for i in range(top + 1):
                self.r[p, i] = var(cost[i], 1.0 if i == head else 0.0, 1.0)
        self.s = {}  # S[p, i]: i resident when stage p starts (i before its head); S[P, .]: the end
        for p in range(1, P + 1):
            for i in range(stages[p - 1][1] + 1):
                if p == P:
                    fixed = 1.0 if is_output[i] else 0.0
                    self.s[p, i] = var(0.0, fixed, fixed)
                else:
                    self.s[p, i] = var(0.0, 0.0, 1.0)
        self.free = {}
        for p, (_, top) in enumerate(stages):
            for k in range(top + 1):
                for i in preds[k] + [k]:
                    self.free[p, i, k] = var(0.0, 0.0, 1.0, integer=False)
        self.budget_var = None
        if budget is None:  # minimize the peak instead
            self.budget_var = var(1.0, 0.0, np.inf, integer=False)
            c[:self.budget_var] = [0.0] * self.budget_var
        u_hi = np.inf if budget is None else budget / self.scale
        self.u = {}
        for p, (_, top) in enumerate(stages):
            for k in range(top + 1):
                self.u[p, k] = var(0.0, 0.0, u_hi, integer=False)

        rows, cols, vals, lo_, hi_ = [], [], [], [], []

        def row(terms, lo=-np.inf, hi=np.inf):
            r = len(lo_)
            for col, val in terms:
                rows.append(r)
                cols.append(col)
                vals.append(val)
            lo_.append(lo)
            hi_.append(hi)

        R, S, F, U = self.r, self.s, self.free, self.u
        for p, (head, top) in enumerate(stages):
            # Inputs available: R[p,j] <= R[p,i] + S[p,i] (S only for values from earlier
            # stages); a tied node only with its owner: R[p,x] <= R[p,f].
            for j in range(top + 1):
                for i in preds[j]:
                    terms = [(R[p, j], 1.0), (R[p, i], -1.0)]
                    if i < head and tied_to[j] != i:
                        terms.append((S[p, i], -1.0))
                    row(terms, hi=0.0)
            for i in range(top + 1):
                readers = [(R[p, j], -1.0) for j in users[i] if j <= top]
                if i < head:
                    # Kept only if computed or kept; no recompute of a resident value.
                    row([(S[p + 1, i], 1.0), (R[p, i], -1.0), (S[p, i], -1.0)], hi=0.0)
                    row([(R[p, i], 1.0), (S[p, i], 1.0)], hi=1.0)
                    # Cut: what is kept into stage p is read in the stage or kept on.
                    row([(S[p, i], 1.0), (S[p + 1, i], -1.0)] + readers, hi=0.0)
                else:
                    if i != head:  # a tied node computed in its owner's first stage
                        row([(S[p + 1, i], 1.0), (R[p, i], -1.0)], hi=0.0)
                if i != head:
                    # Cut: what is recomputed is read in the stage or kept on.
                    row([(R[p, i], 1.0), (S[p + 1, i], -1.0)] + readers, hi=0.0)
            # FREE[p,i,k] = R[p,k] (1 - S[p+1,i]) prod (1 - R[p,j]), j users of i in (k, top].
            for k in range(top + 1):
                for i in preds[k] + [k]:
                    f = F[p, i, k]
                    later = [j for j in users[i] if k < j <= top]
                    row([(f, 1.0), (R[p, k], -1.0)], hi=0.0)
                    row([(f, 1.0), (S[p + 1, i], 1.0)], hi=1.0)
                    for j in later:
                        row([(f, 1.0), (R[p, j], 1.0)], hi=1.0)
                    row([(R[p, k], 1.0), (S[p + 1, i], -1.0), (f, -1.0)] + [(R[p, j], -1.0) for j in later],
                        hi=0.0)
            # Memory: U[p,k] is resident bytes after computing k (when computed).
            row([(U[p, 0], 1.0), (R[p, 0], -mem[0])] + [(S[p, i], -mem[i]) for i in range(head)],
                lo=0.0, hi=0.0)
            for k in range(1, top + 1):
                terms = [(U[p, k], 1.0), (U[p, k - 1], -1.0), (R[p, k], -mem[k])]
                terms += [(F[p, i, k - 1], mem[i]) for i in preds[k - 1] + [k - 1]]
                row(terms, lo=0.0, hi=0.0)
            for k in range(top + 1):
                if work[k] > 0:  # the workspace while k is computed
                    terms = [(U[p, k], 1.0), (R[p, k], wmem[k])]
                    if self.budget_var is None:
                        row(terms, hi=budget / self.scale)
                    else:
                        row(terms + [(self.budget_var, -1.0)], hi=0.0)
                elif self.budget_var is not None:
                    row([(U[p, k], 1.0), (self.budget_var, -1.0)], hi=0.0)
        # Tied nodes pin their inputs: S[p,x] <= S[p,q] for every input q of x.
        for p in range(1, P + 1):
            for x in range(stages[p - 1][1] + 1):
                if tied_to[x] is not None:
                    for q in preds[x]:
                        row([(S[p, x], 1.0), (S[p, q], -1.0)], hi=0.0)

        self.c = np.array(c)
        self.bounds = Bounds(np.array(lb), np.array(ub))
        self.integrality = np.array(integ)
        nvar = len(c)
        self.A = coo_matrix((vals, (rows, cols)), shape=(len(lo_), nvar)).tocsr()
        self.lo = np.array(lo_)
        self.hi = np.array(hi_)

    def run(self, *, integral: bool, time_limit: float | None, mip_rel_gap: float = 0.0,
            node_limit: int | None = None):
        """Solve with HiGHS: the MILP (``integral``) or its LP relaxation.

        Returns ``(scipy.optimize.OptimizeResult, seconds)``.
        """
        options = {"disp": False, "presolve": True}
        if time_limit is not None:
            options["time_limit"] = float(time_limit)
        if node_limit is not None and integral:
            options["node_limit"] = int(node_limit)
        if integral:
            options["mip_rel_gap"] = float(mip_rel_gap)
        start = time.perf_counter()
        res = milp(self.c, integrality=self.integrality if integral else None, bounds=self.bounds,
                   constraints=LinearConstraint(self.A, self.lo, self.hi), options=options)
        return res, time.perf_counter() - start

    def matrices(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """R (stages, n) and S (stages + 1, n) as arrays of floats (0 outside the model)."""
        R = np.zeros((self.P, self.n))
        S = np.zeros((self.P + 1, self.n))
        for (p, i), col in self.r.items():
            R[p, i] = x[col]
        for (p, i), col in self.s.items():
            S[p, i] = x[col]
        return R, S


def _computes(nodes: list[str], R: np.ndarray) -> list[str]:
    """The nodes ``R`` computes, stage by stage, each stage in node order."""
    return [nodes[i] for p in range(R.shape[0]) for i in range(R.shape[1]) if R[p, i]]


def _schedule(problem: RematProblem, nodes: list[str], R: np.ndarray) -> tuple[list[Op], float, int]:
    """The schedule of ``R`` (frees after last use) with its simulated cost and peak."""
    schedule = from_computes(problem, _computes(nodes, R))
    cost, peak = simulate(problem, schedule)
    return schedule, cost, peak
