"""Random problems for the solver tests (hypothesis strategies), in one place.

* :func:`dags`: random ``RematProblem`` DAGs; keyword arguments choose the family
  (how far back an edge reaches, extra sources and outputs, cost and size ranges).
* :func:`training_chain` / :func:`training_chains`: a forward chain and its backward.
* :func:`problems_and_budgets`: a problem and a budget around its feasible range.
* :func:`chains` / :func:`chains_and_budgets`: random Rotor chains (and budgets).

Imported as ``from strategies import ...``: pytest puts ``tests/`` on ``sys.path``
(rootdir conftest, ``prepend`` import mode), as for ``from conftest import ...``.
"""

from hypothesis import strategies as st

from fxremat.passes import rotor
from fxremat.passes.rotor import Chain
from fxremat.passes.schedule import RematProblem, memory_lower_bound, no_remat, simulate


# ----------------------------------------------------------------------------- DAGs


@st.composite
def dags(draw, min_nodes=2, max_nodes=6, *, window=None, min_preds=1, max_preds=2, sources=True, long_edges=False,
         all_feed=True, costs=(0, 5), sizes=(0, 4), extra_outputs=1):
    """A ``RematProblem`` on nodes ``v0 .. v{n-1}`` (in topological order), ``v{n-1}`` an output.

    Node ``j`` reads ``min_preds`` to ``max_preds`` earlier nodes, among the last ``window``
    (all earlier ones if None). ``sources``: now and then (1 in 10) a node reads none.
    ``long_edges``: past the window, now and then one more input from anywhere before.
    ``all_feed``: every node feeds a later one (so the last node needs them all). Costs and
    sizes are integers in the closed ranges ``costs`` and ``sizes``; up to ``extra_outputs``
    more outputs."""
    n = draw(st.integers(min_nodes, max_nodes))
    nodes = [f"v{i}" for i in range(n)]
    edges = []
    for j in range(1, n):
        fewest = 0 if sources and draw(st.integers(0, 9)) == 0 else min_preds
        first = 0 if window is None else max(0, j - window)
        preds = draw(st.sets(st.integers(first, j - 1), min_size=fewest, max_size=max_preds))
        if long_edges and j > window and draw(st.booleans()):
            preds.add(draw(st.integers(0, j - 1)))  # a long edge now and then
        edges += [(nodes[i], nodes[j]) for i in sorted(preds)]
    if all_feed:
        for i in range(n - 1):
            if not any(u == nodes[i] for u, _ in edges):
                edges.append((nodes[i], nodes[draw(st.integers(i + 1, n - 1))]))
    cost = {v: draw(st.integers(*costs)) for v in nodes}
    size = {v: draw(st.integers(*sizes)) for v in nodes}
    outputs = {nodes[-1]} | draw(st.sets(st.sampled_from(nodes), max_size=extra_outputs))
    return RematProblem(nodes=nodes, edges=edges, cost=cost, size=size, outputs=outputs)


def training_chain(layers, sizes=None, costs=None, skip=False):
    """Forward f0 -> ... -> fL (with residual edges f_{i-2} -> f_i when ``skip``), backward
    gL -> ... -> g1, g_i reading f_{i-1} (gL reads fL); g1 is the output. ``sizes`` and
    ``costs`` list the f's then the g's (default: size 4, cost 1)."""
    nodes = [f"f{i}" for i in range(layers + 1)] + [f"g{i}" for i in range(layers, 0, -1)]
    edges = [(f"f{i - 1}", f"f{i}") for i in range(1, layers + 1)]
    if skip:
        edges += [(f"f{i - 2}", f"f{i}") for i in range(2, layers + 1, 2)]
    for i in range(layers, 0, -1):
        edges += [(f"g{i + 1}" if i < layers else f"f{layers}", f"g{i}"), (f"f{i - 1}", f"g{i}")]
    sizes = sizes or [4] * len(nodes)
    costs = costs or [1] * len(nodes)
    return RematProblem(nodes=nodes, edges=edges, cost=dict(zip(nodes, costs)), size=dict(zip(nodes, sizes)),
                        outputs={"g1"})


@st.composite
def training_chains(draw, min_layers=1, max_layers=4, *, skips=False):
    """:func:`training_chain` with random sizes (1..8) and costs (1..5); with ``skips``,
    residual edges half of the time."""
    layers = draw(st.integers(min_layers, max_layers))
    n = 2 * layers + 1
    sizes = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    costs = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    return training_chain(layers, sizes, costs, skip=skips and draw(st.booleans()))


def budget_range(problem):
    """The working-set lower bound of ``problem`` and the peak of no rematerialization."""
    return memory_lower_bound(problem), simulate(problem, no_remat(problem)).peak_bytes


@st.composite
def problems_and_budgets(draw, problems, below=1):
    """A problem and a budget from ``below`` bytes under the working-set bound to no-remat's peak."""
    problem = draw(problems)
    lo, hi = budget_range(problem)
    return problem, draw(st.sampled_from(range(lo - below, hi + 1)))


# ----------------------------------------------------------------------------- Rotor chains


@st.composite
def chains(draw, max_stages=4, *, dag=False):
    """A Rotor chain of 1 to ``max_stages`` stages with small integer sizes and times.

    Mostly ``abar >= a`` (abar holds a), sometimes not, with or without the extensions
    ``w_g``, ``u_f_last`` and ``w_abar_last`` (``u_f_last <= u_f``, ``w_abar_last <= w_abar``:
    ``F_all^s`` with ``delta^s`` current skips the ops and values only ``a^s`` needs), with or
    without a loss stage. ``dag=True``: only chains :mod:`passes.chain_dag` maps (``abar >=
    a``, no extension, always the loss stage)."""
    n = draw(st.integers(1, max_stages))
    ints = lambda hi: st.lists(st.integers(0, hi), min_size=n, max_size=n)  # noqa: E731
    maybe = (lambda s: s) if dag else (lambda s: st.none() | s)  # noqa: E731
    w_a = draw(ints(4))
    extra = draw(ints(3))
    holds = [True] * n if dag else draw(st.lists(st.booleans(), min_size=n, max_size=n))
    w_abar = [a + e if keep else e for a, e, keep in zip(w_a, extra, holds)]
    u_f = draw(ints(4))
    u_f_last = None if dag else draw(st.none() | st.lists(st.integers(0, 4), min_size=n, max_size=n).map(
        lambda cut: [max(f - c, 0) for f, c in zip(u_f, cut)]))
    w_abar_last = None if dag else draw(st.none() | st.lists(st.integers(0, 4), min_size=n, max_size=n).map(
        lambda cut: [max(b - c, 0) for b, c in zip(w_abar, cut)]))
    chain = Chain(u_f=u_f, u_b=draw(ints(3)), w_a=w_a, w_abar=w_abar, w_a0=draw(st.integers(0, 4)),
                  w_delta=draw(maybe(ints(4))), w_delta0=draw(maybe(st.integers(0, 4))),
                  o_f=draw(ints(6)), o_b=draw(ints(6)), w_g=None if dag else draw(st.none() | ints(3)),
                  u_f_last=u_f_last, w_abar_last=w_abar_last)
    return chain.with_loss() if dag or draw(st.booleans()) else chain


@st.composite
def chains_and_budgets(draw, max_stages=3, *, dag=True):
    """A chain (:func:`chains`) and a budget from Rotor's least (or, one time in eight, one
    below it: infeasible) to the peak of storing everything."""
    chain = draw(chains(max_stages, dag=dag))
    top = int(rotor.simulate(chain, rotor.store_all(chain))[1])
    least = int(rotor.min_budget(chain, persistent=False))
    if draw(st.integers(0, 7)) == 0:
        return chain, max(least - 1, 1)  # infeasible (or least = 1)
    return chain, draw(st.sampled_from(range(max(least, 1), max(top, 1) + 1)))
