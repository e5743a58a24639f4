"""Fusion-aware min-cut choice of saved activations.

Problem
-------
Given the joint forward/backward dataflow graph, choose the set of forward
nodes to save (``saved``) so that every backward node can be computed from
``saved`` and the tangents, no *banned* node is recomputed, and the memory
traffic between the passes is smallest: a saved node costs one read in the
backward, plus one write in the forward if the forward would not have
materialized it anyway. Nodes computable in the backward from ``saved`` are
recomputed there, fused into the backward kernels.

Method
------
Yu & He, "Transcending runtime-memory tradeoffs in checkpointing by being
fusion aware", MLSys 2023, Algorithms 1 and 2. Each forward node ``i`` becomes
an edge ``i_in -> i_out`` with capacity ``w`` (materialized anyway) or ``2w``
(not); edges along the dataflow have infinite capacity; forward inputs and
banned nodes hang from the source, backward nodes from the sink. A finite
s-t cut is exactly a valid saved set and its capacity is its traffic
(their Lemmas 3.2-3.5), so a minimum cut is an optimal plan.

Complexity: one max-flow, ``O(V^2 sqrt(E))`` with push-relabel
(``networkx.algorithms.flow.preflow_push``) on at most ``2V`` vertices, fewer once
:func:`contract` has merged the ones no cut separates.

Example
-------
>>> problem = MinCutProblem(
...     nodes=["x", "t1", "t2", "g"], edges=[("x", "t1"), ("t1", "t2"), ("t1", "g"), ("t2", "g")],
...     forward={"x", "t1", "t2"}, inputs={"x"}, weight={"x": 4.0, "t1": 4.0, "t2": 4.0},
...     materialized={"x", "t2"})
>>> sorted(solve(problem).saved)
['x']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import networkx as nx
from networkx.algorithms.flow import preflow_push

SOURCE, SINK = "__source__", "__sink__"


class InfeasibleCut(RuntimeError):
    """No finite cut: some backward node needs a value that cannot be saved.

    Raised by :func:`solve` when every cut has infinite capacity (a backward node
    depends, through no saveable node, on a value that is neither saveable nor
    recomputable), and by :func:`brute_force` when no saved set is valid.

    Parameters
    ----------
    message : str
        What could not be cut.

    Returns
    -------
    InfeasibleCut
        The exception.

    Raises
    ------
    Nothing
        Constructing it does not raise.

    Complexity
    ----------
    ``O(1)``.
    """


@dataclasses.dataclass
class MinCutProblem:
    """The abstract min-cut problem.

    Parameters
    ----------
    nodes : list of str
        Every node of the joint graph, in a topological order.
    edges : list of (str, str)
        ``(producer, user)`` pairs.
    forward : set of str
        Nodes computable from the forward inputs alone (``V_f``); the rest are backward.
    inputs : set of str
        Forward inputs (always available, saving one costs only its read).
    weight : dict of str to float
        Cost of one read of each forward node (its bytes, re-weighted).
    materialized : set of str, optional
        Forward nodes written to memory whatever the plan (inputs, outputs, unfusible
        nodes): saving them costs ``w``, others ``2w``.
    banned : set of str, optional
        Forward nodes that must never be recomputed.
    must_recompute : set of str, optional
        Forward nodes the user asked to recompute (never saved).
    unsaveable : set of str, optional
        Forward nodes that cannot be handed to the backward themselves (tuples of a
        multi-output op: their items are saved instead).
    byte_penalty : float, optional
        The price of holding a saved byte from the forward to the backward, in units of
        traffic: every saved node costs ``byte_penalty * w`` on top of its traffic. 0 (the
        default) is Yu & He's traffic-optimal cut; a large value gives the saved set of
        fewest bytes, ties broken by traffic (for tight budgets).

    Returns
    -------
    MinCutProblem
        The fields as given (nothing is copied or checked).

    Raises
    ------
    Nothing
        Fields are not validated here; a node missing from ``weight`` or an edge from
        an unknown node raises ``KeyError`` in :func:`build_graph`.

    Complexity
    ----------
    ``O(1)``.
    """

    nodes: list[str]
    edges: list[tuple[str, str]]
    forward: set[str]
    inputs: set[str]
    weight: dict[str, float]
    materialized: set[str] = dataclasses.field(default_factory=set)
    banned: set[str] = dataclasses.field(default_factory=set)
    must_recompute: set[str] = dataclasses.field(default_factory=set)
    unsaveable: set[str] = dataclasses.field(default_factory=set)
    byte_penalty: float = 0.0


@dataclasses.dataclass
class MinCutSolution:
    """The answer of :func:`solve` or :func:`brute_force`.

    Parameters
    ----------
    saved : set of str
        The forward nodes handed to the backward.
    cost : float
        Their summed :func:`capacity` (the traffic, plus the byte penalty).

    Returns
    -------
    MinCutSolution
        The fields as given.

    Raises
    ------
    Nothing
        Constructing it does not raise.

    Complexity
    ----------
    ``O(1)``.
    """

    saved: set[str]
    cost: float


def capacity(problem: MinCutProblem, node: str) -> float:
    """The capacity of a forward node's ``in -> out`` edge: the traffic of saving it.

    ``w`` when the forward materializes the node anyway (one read in the backward), else
    ``2w`` (one write in the forward too); plus ``byte_penalty * w`` for holding it.

    Parameters
    ----------
    problem : MinCutProblem
    node : str
        A forward node of ``problem``.

    Returns
    -------
    float

    Raises
    ------
    KeyError
        If ``node`` has no weight.

    Complexity
    ----------
    ``O(1)``.

    References
    ----------
    Yu & He, MLSys 2023, Algorithm 2 (Get Capacity).
    """
    w = problem.weight[node]
    return (1 if node in problem.materialized else 2) * w + problem.byte_penalty * w


def build_graph(problem: MinCutProblem) -> nx.DiGraph:
    """Algorithm 1's auxiliary graph, whose finite ``SOURCE``-``SINK`` cuts are the valid saved sets.

    Each forward node ``i`` becomes vertices ``i_in``, ``i_out`` joined by an edge of
    :func:`capacity` (infinite, so never cut, for ``unsaveable`` and ``must_recompute``
    nodes); backward nodes hang from the sink; forward inputs and banned nodes from the
    source; ``must_recompute`` nodes (unless banned) also from the sink; every dataflow
    edge ``(i, j)`` becomes ``i_out -> j_in``. Edges without a ``capacity`` attribute are
    infinite (NetworkX's convention).

    Parameters
    ----------
    problem : MinCutProblem

    Returns
    -------
    networkx.DiGraph
        On the vertices ``SOURCE``, ``SINK`` and ``{node}_in`` / ``{node}_out``.

    Raises
    ------
    KeyError
        If an edge's producer is not in ``problem.nodes``, or a forward node has no weight.

    Complexity
    ----------
    ``O(V + E)`` for ``V`` nodes and ``E`` edges.

    References
    ----------
    Yu & He, MLSys 2023, section 3.3, Algorithm 1 (with ``must_recompute`` and
    ``unsaveable`` added here).
    """
    g = nx.DiGraph()
    g.add_node(SOURCE)
    g.add_node(SINK)
    users: dict[str, list[str]] = {n: [] for n in problem.nodes}
    for producer, user in problem.edges:
        users[producer].append(user)
    for node in problem.nodes:
        if node not in problem.forward:
            g.add_edge(f"{node}_in", SINK)
            continue
        if node in problem.inputs or node in problem.banned:
            g.add_edge(SOURCE, f"{node}_in")
        if node in problem.must_recompute and node not in problem.banned:
            g.add_edge(f"{node}_in", SINK)
        if node in problem.unsaveable or (node in problem.must_recompute and node not in problem.banned):
            g.add_edge(f"{node}_in", f"{node}_out")
        else:
            g.add_edge(f"{node}_in", f"{node}_out", capacity=capacity(problem, node))
        for user in users[node]:
            g.add_edge(f"{node}_out", f"{user}_in")
    return g


def contract(problem: MinCutProblem) -> tuple[nx.DiGraph, dict[str, str]]:
    """:func:`build_graph`'s network with the vertices no minimum cut can separate merged,
    and the vertices no flow can pass removed: the same minimal minimum cut on a network a
    fraction of the size (a 16-layer transformer's: 2,100 vertices of 8,900).

    Exact for the minimal source side ``S*`` (what :func:`solve` reads the saved set from):

    - a backward node's vertex hangs from the sink by an infinite edge, so it is never in
      ``S*``: it is the sink; a forward input's or banned node's ``in`` vertex is always in
      ``S*``: it is the source (edges into the source or out of the sink cross no cut);
    - a vertex ``v`` whose only incoming edge is an infinite ``u -> v`` (a node with a single
      producer: its ``in`` vertex; an uncuttable node: its ``out`` vertex) is in ``S*``
      exactly when ``u`` is (``u`` in, ``v`` out would cut an infinite edge; ``v`` in, ``u``
      out: ``S* - {v}`` would cut no more, and be smaller), so it is merged into ``u``;
    - a vertex the source cannot reach or that cannot reach the sink carries no flow and
      holds no saved node's ``in`` vertex with its ``out`` vertex outside ``S*``: removed.

    Parallel edges between merged vertices are one edge of their summed capacity.

    Parameters
    ----------
    problem : MinCutProblem

    Returns
    -------
    (networkx.DiGraph, dict of str to str)
        The network, on ``SOURCE``, ``SINK`` and representative vertices; and each vertex of
        :func:`build_graph`'s network (``{node}_in`` / ``{node}_out`` of a forward node) that
        the network keeps, mapped to its representative.

    Raises
    ------
    KeyError
        As :func:`build_graph`.

    Complexity
    ----------
    ``O(V + E)``.

    References
    ----------
    The merge rule is the textbook contraction of a vertex whose in-flow has one way in;
    the minimal minimum cut is the set the source reaches in any maximum flow's residual
    network (Ford & Fulkerson, "Flows in Networks", 1962, chapter I).
    """
    forward = problem.forward
    producers: dict[str, list[str]] = {n: [] for n in problem.nodes}
    for producer, user in problem.edges:
        if producer not in producers[user]:
            producers[user].append(producer)
    rep: dict[str, str] = {}
    for node in problem.nodes:
        if node not in forward:
            rep[f"{node}_in"] = SINK
            continue
        recompute = node in problem.must_recompute and node not in problem.banned
        if node in problem.inputs or node in problem.banned:
            rep[f"{node}_in"] = SOURCE
        elif len(producers[node]) == 1 and producers[node][0] in forward:
            rep[f"{node}_in"] = rep[f"{producers[node][0]}_out"]
        else:
            rep[f"{node}_in"] = f"{node}_in"
        infinite = node in problem.unsaveable or recompute
        rep[f"{node}_out"] = rep[f"{node}_in"] if infinite else f"{node}_out"
    g = nx.DiGraph()
    g.add_node(SOURCE)
    g.add_node(SINK)

    def add(u: str, v: str, cap: float | None) -> None:
        if u == v or v == SOURCE or u == SINK:
            return
        if g.has_edge(u, v):
            data = g.edges[u, v]
            if "capacity" in data:
                if cap is None:
                    del data["capacity"]
                else:
                    data["capacity"] += cap
        elif cap is None:
            g.add_edge(u, v)
        else:
            g.add_edge(u, v, capacity=cap)

    for node in problem.nodes:
        if node not in forward:
            continue
        v_in, v_out = rep[f"{node}_in"], rep[f"{node}_out"]
        if node in problem.must_recompute and node not in problem.banned:
            add(v_in, SINK, None)
        if v_in != v_out:
            add(v_in, v_out, capacity(problem, node))
    for producer, user in problem.edges:
        if producer in forward:
            add(rep[f"{producer}_out"], rep[f"{user}_in"], None)
    useful = nx.descendants(g, SOURCE) & nx.ancestors(g, SINK)
    g.remove_nodes_from([v for v in list(g) if v not in useful and v not in (SOURCE, SINK)])
    return g, {vertex: r for vertex, r in rep.items() if r in g}


def solve(problem: MinCutProblem) -> MinCutSolution:
    """The saved set of the minimum cut: the valid saved set of least traffic.

    Parameters
    ----------
    problem : MinCutProblem

    Returns
    -------
    MinCutSolution
        ``saved``: the forward nodes whose ``in`` vertex is on the source side and ``out``
        vertex on the sink side of the minimal minimum cut; ``cost``: the cut's capacity.
        Deterministic for a given problem.

    Raises
    ------
    InfeasibleCut
        If every cut has infinite capacity.
    KeyError
        As :func:`build_graph`.

    Complexity
    ----------
    One max-flow with push-relabel (``networkx.algorithms.flow.preflow_push``):
    ``O(V^2 sqrt(E))`` on the vertices of :func:`contract` (at most the ``2V`` of
    :func:`build_graph`).

    References
    ----------
    Yu & He, MLSys 2023, Algorithm 1; a finite cut is a valid saved set and back
    (Lemmas 3.2-3.4), its capacity is its traffic (Lemma 3.5), so the minimum cut is an
    optimal plan (Theorem 3.6).
    """
    g, rep = contract(problem)
    try:
        cost, (source_side, _) = nx.minimum_cut(g, SOURCE, SINK, flow_func=preflow_push)
    except nx.NetworkXUnbounded as err:
        raise InfeasibleCut(
            "every cut has infinite capacity: a backward node depends on a forward value that "
            "can be neither saved nor recomputed"
        ) from err
    saved = {
        node
        for node in problem.forward
        if rep.get(f"{node}_in") in source_side and rep.get(f"{node}_out", SOURCE) not in source_side
    }
    # The cut's edges are the saved nodes' in->out edges. NetworkX sums their capacities
    # over a set, whose order (and so the value's last bits) follows the string hash
    # seed; summed in node order the value is the same in every process.
    cost = sum(capacity(problem, node) for node in problem.nodes if node in saved)
    return MinCutSolution(saved=saved, cost=cost)


def brute_force(problem: MinCutProblem) -> MinCutSolution:
    """Exhaustive search over saved sets: the reference :func:`solve` is tested against.

    Parameters
    ----------
    problem : MinCutProblem

    Returns
    -------
    MinCutSolution
        A valid saved set of least summed :func:`capacity` (the first found in order of
        size, then of ``problem.nodes``).

    Raises
    ------
    InfeasibleCut
        If no saved set is valid.

    Complexity
    ----------
    ``O(2^F (V + E))`` for ``F`` saveable forward nodes: tests only.
    """
    import itertools

    candidates = [
        n for n in problem.nodes
        if n in problem.forward and n not in problem.unsaveable and n not in problem.must_recompute
    ]
    best: MinCutSolution | None = None
    for k in range(len(candidates) + 1):
        for combo in itertools.combinations(candidates, k):
            saved = set(combo)
            if is_valid(problem, saved):
                cost = sum(capacity(problem, n) for n in saved)
                if best is None or cost < best.cost - 1e-9:
                    best = MinCutSolution(saved=saved, cost=cost)
    if best is None:
        raise InfeasibleCut("no valid saved set")
    return best


def recomputed(problem: MinCutProblem, saved: Iterable[str]) -> set[str]:
    """The forward nodes the backward must compute from ``saved``.

    They are the forward ancestors of the backward nodes (and of the ``must_recompute``
    nodes that are not banned) reached without passing through a saved node.

    Parameters
    ----------
    problem : MinCutProblem
    saved : iterable of str
        Forward nodes handed to the backward.

    Returns
    -------
    set of str

    Raises
    ------
    KeyError
        If an edge names a node not in ``problem.nodes``.

    Complexity
    ----------
    ``O(V + E)``.
    """
    saved = set(saved)
    preds: dict[str, list[str]] = {n: [] for n in problem.nodes}
    for producer, user in problem.edges:
        preds[user].append(producer)
    # Roots: the backward nodes, and the nodes the user asked to recompute (their
    # in-vertices hang from the sink just like backward nodes).
    forced = problem.must_recompute - problem.banned
    needed: set[str] = set(forced)
    stack = [n for n in problem.nodes if n not in problem.forward or n in forced]
    seen = set(stack)
    while stack:
        node = stack.pop()
        for p in preds[node]:
            if p in seen:
                continue
            seen.add(p)
            if p in problem.forward and p not in saved:
                needed.add(p)
                stack.append(p)
            elif p not in problem.forward:
                stack.append(p)
    return needed


def is_valid(problem: MinCutProblem, saved: set[str]) -> bool:
    """Whether a saved set is a valid plan.

    Valid: no forward input and no banned node has to be recomputed
    (:func:`recomputed`), and no ``must_recompute`` node is saved.

    Parameters
    ----------
    problem : MinCutProblem
    saved : set of str

    Returns
    -------
    bool

    Raises
    ------
    KeyError
        As :func:`recomputed`.

    Complexity
    ----------
    ``O(V + E)``.
    """
    again = recomputed(problem, saved)
    return not (again & (problem.inputs | problem.banned)) and not (saved & problem.must_recompute)
