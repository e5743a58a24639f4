"""TWRemat: low-memory schedules by divide and conquer on a tree decomposition.

Problem
-------
Given a :class:`~passes.remat_problem.RematProblem`, find a schedule with small peak
memory, recomputing as needed; no budget is given: the early-stop parameter
``k`` trades memory for schedule length.

Method
------
Kumar, Purohit, Svitkina, Vee, Wang, "Efficient Rematerialization for Deep
Networks", NeurIPS 2019, Algorithm 1 and section 4.3. Take a tree decomposition
of the undirected graph (NetworkX's minimum fill-in or minimum degree
heuristic), merge adjacent bags one of which contains the other (their
Lemma 1), and pick a balanced separator bag ``X*`` (Lemma 3: a centroid of the
tree of bags, Jordan's theorem). Removing ``X*`` from the decomposition splits
the nodes into components that touch each other only through ``X*``. To
compute a set ``S`` inside a part ``V'``: for each separator node ``v`` in
topological order, compute the inputs of ``v`` component by component
(recursively), then ``v``; then compute ``S \\ X*`` component by component
(recursively). With ``k``, a part whose decomposition has fewer than ``k`` bags
is computed directly in topological order (no recursion, no recomputation):
``k = 1`` is Algorithm 1, ``k > #bags`` is no rematerialization.

Two refinements, neither affecting the paper's bounds: only the separator nodes
that ``S`` depends on are computed (the paper's graphs have a single output
every node feeds), and frees are placed by :func:`passes.schedule.from_computes`
(each value freed after its last use before its next computation), which holds
at most what the paper's keep/free annotations hold. Problems with tied nodes
(:class:`~passes.remat_problem.RematProblem` ``tied``) are refused: the recursion may
separate a tied node from its owner. :func:`solve_for_budget` picks the cheapest
``k`` whose schedule fits a budget. Measured on training graphs (peak and length
against no rematerialization, over depth and ``k``): ``bench/twremat_report.py``.

Complexity: for width ``w`` and ``n`` nodes, the schedule has length
``O(T_onepass * w * n^log2(w+2))`` and peak ``O((M_in + w M_max) log n)``
(Theorem 5); building the decomposition is ``O(n^3)`` worst case (min fill-in),
the separator hierarchy ``O(w n log n)``, the schedule linear in its length times
the part sizes.

Example
-------
On a chain of 16 unit nodes, with only the last one kept, no rematerialization
holds two values at a time; TWRemat does as well but its recursion recomputes:

>>> from fxremat.passes.schedule import RematProblem
>>> names = [f"v{i}" for i in range(16)]
>>> p = RematProblem(nodes=names, edges=list(zip(names, names[1:])), cost=dict.fromkeys(names, 1),
...                  size=dict.fromkeys(names, 1), outputs={"v15"})
>>> sol = solve(p)
>>> sol.peak_bytes, sol.cost >= 16
(2, True)
"""

from __future__ import annotations

import dataclasses
from collections import deque

import networkx as nx
from networkx.algorithms.approximation import treewidth_min_degree, treewidth_min_fill_in

from .schedule import Op, RematProblem, from_computes, simulate

HEURISTICS = {"min_fill_in": treewidth_min_fill_in, "min_degree": treewidth_min_degree}


@dataclasses.dataclass
class TWRematSolution:
    """A TWRemat schedule and what it cost.

    Parameters
    ----------
    schedule : list of Op
    cost : float
        Total cost of ``schedule`` (:func:`passes.schedule.simulate`).
    peak_bytes : int
        Peak of ``schedule`` (:func:`passes.schedule.simulate`).
    k : int
        The early stop: parts with fewer than ``k`` bags are not split.
    width : int
        Width of the tree decomposition (largest bag size - 1).
    bags : int
        Bags of the decomposition after merging (Lemma 1).
    depth : int
        Levels of the separator hierarchy.

    Returns
    -------
    TWRematSolution

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
    k: int
    width: int
    bags: int
    depth: int


@dataclasses.dataclass
class _Part:
    """A part ``V'`` of the graph with its decomposition, split by a separator bag."""

    nodes: frozenset[int]
    nbags: int
    separator: list[int]          # the bag X*, in node (topological) order
    children: list[_Part]


# ----------------------------------------------------------------------------- decomposition


def tree_decomposition(problem: RematProblem, heuristic: str = "min_fill_in"
                       ) -> tuple[int, dict[int, frozenset[int]], dict[int, set[int]]]:
    """A tree decomposition of the undirected graph of ``problem``, merged by Lemma 1.

    The decomposition of NetworkX's heuristic, its trees joined into one (a graph in
    several components gives a forest), then every tree edge whose one bag contains the
    other contracted.

    Parameters
    ----------
    problem : RematProblem
    heuristic : {"min_fill_in", "min_degree"}, optional
        NetworkX's ``treewidth_min_fill_in`` or ``treewidth_min_degree``.

    Returns
    -------
    width : int
        The largest bag size minus one (-1 for an empty problem).
    bags : dict of int to frozenset of int
        The bags (sets of node indices) by id.
    adjacency : dict of int to set of int
        The tree: the neighbours of each bag id.

    Raises
    ------
    KeyError
        If ``heuristic`` is not one of :data:`HEURISTICS`.

    Complexity
    ----------
    ``O(n^3)`` worst case for ``n`` nodes (minimum fill-in); the merge is linear in the
    number of bags times the bag size.

    References
    ----------
    Kumar et al., NeurIPS 2019, section 2.2 and Lemma 1.
    """
    g = nx.Graph()
    g.add_nodes_from(range(len(problem.nodes)))
    for v, ps in enumerate(problem.preds):
        g.add_edges_from((p, v) for p in ps)
    if len(g) == 0:
        return -1, {}, {}
    _, decomp = HEURISTICS[heuristic](g)
    ids = {bag: i for i, bag in enumerate(decomp.nodes)}
    bags = {i: bag for bag, i in ids.items()}
    adj: dict[int, set[int]] = {i: set() for i in bags}
    for a, b in decomp.edges:
        adj[ids[a]].add(ids[b])
        adj[ids[b]].add(ids[a])
    _connect_forest(adj)
    _merge_nested(bags, adj)
    return max(len(b) for b in bags.values()) - 1, bags, adj


def _connect_forest(adj: dict[int, set[int]]) -> None:
    """Join the trees of a forest of bags into one tree (valid: they share no node)."""
    seen: set[int] = set()
    roots = []
    for start in sorted(adj):
        if start in seen:
            continue
        roots.append(start)
        seen.add(start)
        queue = deque([start])
        while queue:
            a = queue.popleft()
            for b in adj[a]:
                if b not in seen:
                    seen.add(b)
                    queue.append(b)
    for a, b in zip(roots, roots[1:]):
        adj[a].add(b)
        adj[b].add(a)


def _merge_nested(bags: dict[int, frozenset[int]], adj: dict[int, set[int]]) -> None:
    """Lemma 1: contract every tree edge whose one bag contains the other (in place)."""
    work = [(a, b) for a in sorted(adj) for b in sorted(adj[a]) if a < b]
    while work:
        a, b = work.pop()
        if a not in bags or b not in bags or b not in adj[a]:
            continue
        if bags[a] <= bags[b]:
            gone, kept = a, b
        elif bags[b] <= bags[a]:
            gone, kept = b, a
        else:
            continue
        adj[kept].discard(gone)
        for c in sorted(adj.pop(gone)):
            if c == kept:
                continue
            adj[c].discard(gone)
            adj[c].add(kept)
            adj[kept].add(c)
            work.append((c, kept))
        del bags[gone]


def _centroid(ids: list[int], adj: dict[int, set[int]]) -> int:
    """Lemma 3 (Jordan): a bag whose removal leaves components of at most half the bags."""
    root = ids[0]
    parent = {root: None}
    order = [root]
    for a in order:
        for b in sorted(adj[a]):
            if b not in parent:
                parent[b] = a
                order.append(b)
    below = dict.fromkeys(order, 1)
    for a in reversed(order[1:]):
        below[parent[a]] += below[a]
    total = len(order)
    best, best_size = root, total
    for a in order:
        largest = total - below[a]
        for b in adj[a]:
            if parent.get(b) == a:
                largest = max(largest, below[b])
        if largest < best_size or (largest == best_size and a < best):
            best, best_size = a, largest
    return best


def _split(bags: dict[int, frozenset[int]], adj: dict[int, set[int]]) -> _Part:
    """The separator hierarchy of a part: its centroid bag ``X*``, then each component without it, recursively."""
    ids = sorted(bags)
    nodes = frozenset().union(*bags.values())
    if len(ids) == 1:
        return _Part(nodes, 1, sorted(bags[ids[0]]), [])
    center = _centroid(ids, adj)
    sep = bags[center]
    children = []
    seen = {center}
    for start in sorted(adj[center]):
        if start in seen:
            continue
        comp = [start]
        seen.add(start)
        for a in comp:
            for b in sorted(adj[a]):
                if b not in seen:
                    seen.add(b)
                    comp.append(b)
        sub_bags = {a: bags[a] - sep for a in comp}
        if not any(sub_bags.values()):
            continue
        members = set(comp)
        sub_adj = {a: {b for b in adj[a] if b in members} for a in comp}
        _merge_nested(sub_bags, sub_adj)
        children.append(_split(sub_bags, sub_adj))
    return _Part(nodes, len(ids), sorted(sep), children)


def _depth(part: _Part) -> int:
    """The levels of the separator hierarchy below ``part``."""
    return 1 + max((_depth(c) for c in part.children), default=0)


# ----------------------------------------------------------------------------- Algorithm 1


def _ancestors_within(preds: list[list[int]], within: frozenset[int], targets) -> list[int]:
    """Nodes of ``within`` that ``targets`` depend on through ``within``, in node order."""
    seen = set(targets)
    stack = list(seen)
    while stack:
        v = stack.pop()
        for p in preds[v]:
            if p in within and p not in seen:
                seen.add(p)
                stack.append(p)
    return sorted(seen)


def _twremat(part: _Part, targets: set[int], k: int, preds: list[list[int]], out: list[int]) -> None:
    """Algorithm 1: append to ``out`` a compute sequence of ``targets`` within ``part``.

    For each separator node the targets need, in node order: its inputs component by
    component (recursively), then the node; then the targets component by component.
    A part of fewer than ``k`` bags (or a single bag) computes what is needed once, in
    node order.
    """
    if not targets:
        return
    needed = _ancestors_within(preds, part.nodes, targets)
    if part.nbags < k or not part.children:
        # Base case: one bag, or stopped early: each needed node once, in topological order
        # (for one bag this is also the separator loop of Algorithm 1).
        out.extend(needed)
        return
    needed_set = set(needed)
    for v in part.separator:
        if v not in needed_set:
            continue
        for child in part.children:
            _twremat(child, {p for p in preds[v] if p in child.nodes}, k, preds, out)
        out.append(v)
    for child in part.children:
        _twremat(child, {u for u in targets if u in child.nodes}, k, preds, out)


class TWRemat:
    """A problem prepared once (decomposition and separator hierarchy); schedules for any ``k``.

    Parameters
    ----------
    problem : RematProblem
        Without tied nodes.
    heuristic : {"min_fill_in", "min_degree"}, optional
        The tree decomposition heuristic (:func:`tree_decomposition`).

    Returns
    -------
    TWRemat
        With ``width``, ``bags`` and ``depth`` of the hierarchy, and ``sub``, the problem
        restricted to the nodes the outputs need.

    Raises
    ------
    ValueError
        If ``problem`` has tied nodes (the recursion may separate a tied node from its
        owner: use :mod:`passes.checkmate`).
    KeyError
        If ``heuristic`` is unknown.

    Complexity
    ----------
    The decomposition (:func:`tree_decomposition`), then ``O(w n log n)`` for the separator
    hierarchy, for width ``w``.

    References
    ----------
    Kumar et al., NeurIPS 2019: Lemma 3 (balanced separator, by Jordan's theorem).
    """

    def __init__(self, problem: RematProblem, heuristic: str = "min_fill_in"):
        if problem.tied:
            raise ValueError("TWRemat does not handle tied nodes (its recursion may separate a tied node "
                             "from its owner): use passes.checkmate")
        self.problem = problem
        self.sub = problem.restricted()
        self.width, bags, adj = tree_decomposition(self.sub, heuristic)
        self.root = _split(bags, adj) if bags else None
        self.bags = len(bags)
        self.depth = _depth(self.root) if self.root else 0

    def computes(self, k: int = 1) -> list[str]:
        """The compute sequence of TWRemat(``k``) (Algorithm 1, stopped at parts of fewer than ``k`` bags).

        Parameters
        ----------
        k : int, optional
            1 is Algorithm 1; more than :attr:`bags` computes each needed node once, in node order.

        Returns
        -------
        list of str
            Node names; a node may appear several times (recomputed).

        Raises
        ------
        ValueError
            If ``k < 1``.

        Complexity
        ----------
        Linear in the length of the sequence times the part sizes; the length is
        ``O(T_onepass * w * n^log2(w+2))`` (Theorem 5).

        References
        ----------
        Kumar et al., NeurIPS 2019, Algorithm 1; the early stop ``k``, section 4.3.
        """
        if k < 1:
            raise ValueError("k must be >= 1")
        out: list[int] = []
        if self.root is not None:
            _twremat(self.root, set(self.sub.output_ids), k, self.sub.preds, out)
        return [self.sub.nodes[i] for i in out]

    def solve(self, k: int = 1) -> TWRematSolution:
        """TWRemat(``k``) as a schedule, simulated.

        Parameters
        ----------
        k : int, optional
            As :meth:`computes`.

        Returns
        -------
        TWRematSolution
            The frees placed by :func:`passes.schedule.from_computes`.

        Raises
        ------
        ValueError
            If ``k < 1``.

        Complexity
        ----------
        As :meth:`computes`, plus the simulation, linear in the schedule's length.
        """
        schedule = from_computes(self.problem, self.computes(k))
        cost, peak = simulate(self.problem, schedule)
        return TWRematSolution(schedule=schedule, cost=cost, peak_bytes=peak, k=k, width=self.width,
                               bags=self.bags, depth=self.depth)


def solve(problem: RematProblem, k: int = 1, heuristic: str = "min_fill_in") -> TWRematSolution:
    """TWRemat(``k``): Algorithm 1, stopping the recursion at parts with fewer than ``k`` bags.

    Parameters
    ----------
    problem : RematProblem
        Without tied nodes.
    k : int, optional
        The early stop (1: no early stop).
    heuristic : {"min_fill_in", "min_degree"}, optional
        The tree decomposition heuristic.

    Returns
    -------
    TWRematSolution

    Raises
    ------
    ValueError
        If ``problem`` has tied nodes or ``k < 1``.

    Complexity
    ----------
    :class:`TWRemat`'s preparation, then :meth:`TWRemat.solve`: peak
    ``O((M_in + w M_max) log n)`` (Theorem 5).

    References
    ----------
    Kumar et al., NeurIPS 2019, Algorithm 1 and Theorem 5.
    """
    return TWRemat(problem, heuristic).solve(k)


def solve_for_budget(problem: RematProblem, budget: float, heuristic: str = "min_fill_in"
                     ) -> TWRematSolution | None:
    """The cheapest TWRemat(``k``) whose peak fits ``budget``.

    Parameters
    ----------
    problem : RematProblem
        Without tied nodes.
    budget : float
        Bytes.
    heuristic : {"min_fill_in", "min_degree"}, optional

    Returns
    -------
    TWRematSolution or None
        The cheapest over ``k = 1, 2, 4, ..., #bags + 1`` with peak <= ``budget``; None if
        even ``k = 1`` does not fit.

    Raises
    ------
    ValueError
        If ``problem`` has tied nodes.

    Complexity
    ----------
    One preparation and ``O(log #bags)`` schedules.
    """
    prepared = TWRemat(problem, heuristic)
    ks = sorted({1 << e for e in range(max(prepared.bags, 1).bit_length() + 1)} | {prepared.bags + 1})
    best = None
    for k in ks:
        sol = prepared.solve(k)
        if sol.peak_bytes <= budget and (best is None or sol.cost < best.cost):
            best = sol
    return best
