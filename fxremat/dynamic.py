"""A budget at every size a dynamic graph runs (``torch.compile(dynamic=True)``, ``mark_dynamic``).

A graph compiled with symbolic sizes is planned at the sizes it was traced with (the shape
environment's hints). The plan's predicted peak at *every* size is a sympy expression in the
size symbols: the timeline predicted with symbolic bytes (``timeline.predict(symbolic=True)``)
has one expression a step, and the peak is their maximum (``peak_expressions`` keeps those no
other one dominates). The plan then holds where that maximum stays under the budget, a byte
budget as asked, for a fraction the same share of the way from the least-memory plan's peak
to the min-cut plan's, both at that size; fxremat adds that condition
to the shape environment as a guard (``bound``), so Dynamo checks it on every call and, at a
size outside it, compiles the graph again: a new plan for the new sizes (kept beside the first:
a training loop does not replan every step), or a ``BudgetError`` that names the sizes.

Data-dependent (unbacked) sizes, ``nonzero`` or ``.item()`` feeding a shape, have no hint:
``sizes`` plans them at the upper bound of their value range (the worst case: the budget holds
for every value) or, with none known, at Inductor's ``unbacked_symint_fallback``, and says so
(``plan.notes["assumed_sizes"]``, a ``BudgetWarning``). They cannot be guarded.
"""

from __future__ import annotations

import warnings
from typing import Any

import sympy
import torch.fx as fx

from . import _compat, sizes
from .plans import BudgetError, BudgetWarning
from .timeline import predict, relaid_inputs
from .workspace import scratch_model

MAX_GUARDS = 12  # more envelope expressions than this are guarded as one Max(...) <= budget


def size_symbols(joint: fx.GraphModule) -> tuple[set[sympy.Symbol], Any]:
    """The backed size symbols of the joint graph's inputs (what Dynamo guards on) and
    their shape environment (None without symbols)."""
    return _symbols_of([node.meta.get("val") for node in joint.graph.find_nodes(op="placeholder")])


def _symbols_of(values) -> tuple[set[sympy.Symbol], Any]:
    symbols: set[sympy.Symbol] = set()
    env = None
    for d in sizes.symbolic_dims(values):
        env = d.node.shape_env
        symbols |= {s for s in d.node.expr.free_symbols if s in _compat.shape_env_values(env)}
    return symbols, env


def pin_sizes(example_inputs) -> None:
    """Guard the graph's symbolic sizes to their traced values: a compiled function that
    holds only at these sizes (the backend's refusal of a dynamic graph's size)."""
    symbols, env = _symbols_of(example_inputs)
    values = _compat.shape_env_values(env) if env is not None else {}
    for symbol in symbols:
        env.evaluate_expr(sympy.Eq(symbol, values[symbol]))


def describe_sizes(symbols: set[sympy.Symbol], env) -> str:
    """``"L['x'].size()[0] = 64 (s0), ..."``: each size symbol's source and value at this compile."""
    values = _compat.shape_env_values(env)
    return ", ".join(f"{_sources(s, env)[0]} = {values[s]} ({s})" for s in sorted(symbols, key=str))


def _sources(symbol: sympy.Symbol, env) -> list[str]:
    """Where Dynamo read a size symbol from (``L['x'].size()[0]``, ...)."""
    return [_source_name(source) for source in env.var_to_sources.get(symbol, [])] or [str(symbol)]


def _source_name(source) -> str:
    """A Dynamo source's name ("L['x'].size()[0]"): a method on older torch, a property on newer."""
    name = source.name
    return name() if callable(name) else str(name)


def peak_expressions(fwd: fx.GraphModule, bwd: fx.GraphModule, num_user_outputs: int, options) -> list[sympy.Expr]:
    """The predicted live bytes of the candidate's steps as expressions in the size symbols,
    those no other one dominates (``envelope``): its peak at any size is their maximum."""
    inductor = options.compiler == "inductor"
    timeline = predict(fwd, bwd, num_user_outputs, relaid_inputs(fwd) if inductor else set(), fusion=inductor,
                       hold_outputs=options.hold_outputs, workspace=scratch_model(inductor),
                       symbolic=True)
    return envelope([sympy.sympify(b) for b in timeline.live_bytes])


def envelope(exprs: list[sympy.Expr]) -> list[sympy.Expr]:
    """``exprs`` less those another one dominates: ``e`` is dominated by ``f`` when ``f - e``,
    a polynomial in the sizes (never negative), has no negative coefficient. Expressions that
    are no polynomial in the sizes (a strided convolution's ``FloorDiv``) are all kept.

    >>> s = sympy.Symbol("s", positive=True, integer=True)
    >>> envelope([4 * s, 4 * s + 8, 2 * s + 100, sympy.Integer(50)])
    [4*s + 8, 2*s + 100]
    """
    distinct = list(dict.fromkeys(exprs))
    numbers = [e for e in distinct if e.is_number]
    found = [max(numbers)] if numbers else []
    polys, others = [], []
    for e in distinct:
        if e.is_number:
            continue
        try:
            polys.append((e, sympy.Poly(e, *sorted(e.free_symbols, key=str)).as_dict(), sorted(e.free_symbols, key=str)))
        except sympy.PolynomialError:
            others.append(e)
    terms = [(e, {tuple((x, p) for x, p in zip(symbols, monomial) if p): c for monomial, c in poly.items()})
             for e, poly, symbols in polys]
    if found:
        terms.append((found[0], {(): found[0]}))
    kept = []
    for i, (e, a) in enumerate(terms):
        dominated = any(j != i and _dominates(b, a) and (b != a or j < i) for j, (_, b) in enumerate(terms))
        if not dominated:
            kept.append(e)
    return kept + others


def _dominates(b: dict, a: dict) -> bool:
    """Is polynomial ``b`` at least ``a`` wherever the sizes are (all coefficients of b - a >= 0)?"""
    return all(b.get(m, 0) - a.get(m, 0) >= 0 for m in set(a) | set(b))


def bound(ctx, chosen, mincut_plan, budget: int, least=None) -> None:
    """Keep ``chosen`` to the sizes where it meets the budget: its peak expression in
    ``plan.notes``, and the condition added to the shape environment as guards. For a
    fraction the budget is a formula too: that far from the least-memory plan's peak
    (``least``, the plan found at the traced sizes) to the min-cut plan's, at each size. If
    the symbolic prediction does not meet the budget even at the traced sizes (it reuses
    buffers only where sizes are equal as expressions, not as numbers), the plan is kept to
    exactly these sizes."""
    symbols, env = size_symbols(ctx.joint)
    plan = chosen.plan
    if not symbols or plan.notes.get("nothing_to_trade"):
        return  # static; or a graph whose min-cut plan is its plan at every fraction
    exprs = peak_expressions(chosen.forward, chosen.backward, ctx.num_fwd_outputs, ctx.options)
    hints = {s: _compat.shape_env_values(env)[s] for s in symbols}
    assumed = sizes.assumed_sizes()  # data-dependent sizes: at their assumed values, never guarded

    def at_assumed(exprs):
        return [e.xreplace({u: assumed[str(u)]["value"] for u in e.free_symbols if str(u) in assumed}) for e in exprs]

    def peak_of(candidate):
        if candidate is chosen:
            found = exprs
        else:
            candidate.realize()  # a light (or released) candidate gets its torch.fx graphs
            found = at_assumed(peak_expressions(candidate.forward, candidate.backward, ctx.num_fwd_outputs,
                                                ctx.options))
        return _compat.symbolic_max(*found) if len(found) > 1 else found[0]

    exprs = at_assumed(exprs)
    peak = peak_of(chosen)
    fraction = ctx.options.memory_budget.fraction
    if fraction is None:
        limit = sympy.Integer(budget)
        conditions = [sympy.Le(e, limit) for e in exprs] if len(exprs) <= MAX_GUARDS else [sympy.Le(peak, limit)]
    else:
        unconstrained = peak_of(mincut_plan)
        lowest = peak_of(least) if least is not None else unconstrained
        limit = lowest + sympy.Rational(str(fraction)) * (unconstrained - lowest)
        conditions = [sympy.Le(peak, limit)]
        plan.notes["budget_expression"] = str(limit)
    plan.notes["size_symbols"] = {str(s): {"source": _sources(s, env), "value": int(v)} for s, v in hints.items()}
    plan.notes["peak_expression"] = str(peak)
    at_hints = all(bool(c.xreplace(hints)) for c in conditions)
    if at_hints:
        for condition in conditions:
            env.evaluate_expr(condition)  # a guard: Dynamo compiles again where it fails
        plan.notes["valid_while"] = [str(c) for c in conditions]
    else:
        for s, value in hints.items():
            env.evaluate_expr(sympy.Eq(s, value))
        plan.notes["valid_while"] = [f"{s} == {v}" for s, v in hints.items()]


def with_sizes(error: BudgetError, ctx) -> BudgetError:
    """``error`` naming the sizes of this compile, for a dynamic graph."""
    symbols, env = size_symbols(ctx.joint)
    if symbols and "at sizes" not in error.args[0]:
        error.args = (f"{error.args[0]} (This graph has dynamic sizes; planned at sizes {describe_sizes(symbols, env)}.)",)
    return error


def warn_assumed(ctx, plan) -> None:
    """Say which data-dependent sizes the plan assumed (``sizes.assumed_sizes``)."""
    assumed = sizes.assumed_sizes()
    if not assumed:
        return
    plan.notes["assumed_sizes"] = assumed
    unbounded = {k: v["value"] for k, v in assumed.items() if v["from"] != "range"}
    described = ", ".join(f"{k} = {v['value']} ({'its largest value' if v['from'] == 'range' else 'a fallback'})"
                          for k, v in assumed.items())
    if unbounded:
        warnings.warn(BudgetWarning(
            f"fxremat (graph {ctx.graph_id}): data-dependent sizes with no known bound are planned at {described}: "
            f"the budget holds while they stay at or under those values; it cannot be checked at run time. "
            f"torch._check(size <= bound) in the model gives fxremat a bound."), stacklevel=3)
