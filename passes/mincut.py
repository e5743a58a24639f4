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
(``networkx.algorithms.flow.preflow_push``) on ``2V`` vertices.

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
    """No finite cut: some backward node needs a value that cannot be saved."""


@dataclasses.dataclass
class MinCutProblem:
    """The abstract min-cut problem.

    nodes: every node of the joint graph, in a topological order.
    edges: (producer, user) pairs.
    forward: nodes computable from the forward inputs alone (V_f); the rest are backward.
    inputs: forward inputs (always available, saving one costs only its read).
    weight: cost of one read of each forward node (its bytes, re-weighted).
    materialized: forward nodes written to memory whatever the plan (inputs, outputs,
        unfusible nodes): saving them costs ``w``, others ``2w``.
    banned: forward nodes that must never be recomputed.
    must_recompute: forward nodes the user asked to recompute (never saved).
    unsaveable: forward nodes that cannot be handed to the backward themselves
        (tuples of a multi-output op: their items are saved instead).
    byte_penalty: the price of holding a saved byte from the forward to the backward,
        in units of traffic: every saved node costs ``byte_penalty * w`` on top of its
        traffic. 0 (the default) is Yu & He's traffic-optimal cut; a large value gives
        the saved set of fewest bytes, ties broken by traffic (for tight budgets).
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
    saved: set[str]
    cost: float


def capacity(problem: MinCutProblem, node: str) -> float:
    """Algorithm 2: ``w`` when the forward materializes the node anyway, else ``2w``;
    plus ``byte_penalty * w`` for holding it."""
    w = problem.weight[node]
    return (1 if node in problem.materialized else 2) * w + problem.byte_penalty * w


def build_graph(problem: MinCutProblem) -> nx.DiGraph:
    """Algorithm 1's auxiliary graph. Edges without a ``capacity`` are infinite (NetworkX)."""
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


def solve(problem: MinCutProblem) -> MinCutSolution:
    """The saved set of the minimum cut. Deterministic for a given problem."""
    g = build_graph(problem)
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
        if f"{node}_in" in source_side and f"{node}_out" not in source_side
    }
    return MinCutSolution(saved=saved, cost=cost)


def brute_force(problem: MinCutProblem) -> MinCutSolution:
    """Exhaustive search over saved sets (tests only: exponential)."""
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
    """Forward nodes the backward must compute from ``saved``: ancestors of backward
    nodes reached without passing through a saved node."""
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
    """A saved set is valid when no input, banned or unsaveable-and-banned node must be recomputed."""
    again = recomputed(problem, saved)
    return not (again & (problem.inputs | problem.banned)) and not (saved & problem.must_recompute)
