"""The DAG rematerialization problem: nodes, edges, costs, sizes, outputs, ties.

Problem
-------
A computation DAG whose nodes are listed in a topological order; each node has a
compute cost, an output of some bytes and, optionally, a ``workspace`` (temporary
bytes of its operation); some nodes are the outputs, to be resident when a schedule
ends. :class:`RematProblem` holds it as plain data, checks it, and gives the index
views the solvers read (inputs, users, the nodes the outputs need). Schedules and the
simulator that judges them are in :mod:`passes.schedule`; the solvers are Checkmate
(:mod:`passes.checkmate`) and TWRemat (:mod:`passes.twremat`).

*Tied* nodes model an operation with two outputs of which the second may be
kept or dropped, such as a forward stage that also records what its backward
needs (Rotor's ``F_all`` against ``F_ck``; :mod:`passes.chain_dag`). A node
``x`` tied to ``f`` (``tied={x: f}``, ``f`` an input of ``x``, listed right
before it) can only be computed directly after ``f`` (no compute in between:
the same operation), and while ``x`` is resident none of its inputs may be
freed (``x`` references them, as saved tensors do).

Complexity: checking a problem is ``O(n + m d)`` for ``n`` nodes, ``m`` edges and
in-degree ``d``; each index view is computed once, in ``O(n + m)``.

Example
-------
>>> p = RematProblem(nodes=["a", "b", "c", "d"], edges=[("a", "b"), ("b", "c"), ("a", "c")],
...                  cost=dict.fromkeys("abcd", 1), size={"a": 4, "b": 8, "c": 2, "d": 1}, outputs={"c"})
>>> p.preds, p.users, p.needed
([[], [0], [0, 1], []], [[1, 2], [2], [], []], [0, 1, 2])
>>> list(p.restricted().nodes)
['a', 'b', 'c']
>>> try:
...     RematProblem(nodes=["a", "b"], edges=[("b", "a")], cost={"a": 1, "b": 1}, size={"a": 1, "b": 1})
... except ValueError as err:
...     print(err)
edge ('b', 'a') goes against the node order (not topological)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class RematProblem:
    """The abstract rematerialization problem.

    Graph inputs held by the caller anyway are best given size 0 and cost 0: they then
    cost nothing to hold or to "compute" (read).

    Parameters
    ----------
    nodes : sequence of str
        Every node, in a topological order (producers before users).
    edges : sequence of (str, str)
        ``(producer, user)`` pairs; the user reads the producer's output.
    cost : dict of str to float
        Cost of one computation of each node (time, FLOPs, any additive unit, >= 0).
    size : dict of str to int
        Bytes of each node's output (>= 0).
    outputs : set of str, optional
        Nodes that must be resident when the schedule ends. Nodes that are not ancestors
        of an output are never computed by the solvers.
    workspace : dict of str to int, optional
        Temporary bytes of a node's operation, counted while it is computed (on top of
        its inputs and output); missing nodes have none.
    tied : dict of str to str, optional
        ``{x: f}``: ``x`` is a second output of ``f``'s operation (see the module
        docstring). ``f`` must be an input of ``x`` and come right before it in ``nodes``;
        every user of ``x`` must also read every input of ``x`` (so that freeing values
        after their last use never frees an input of a resident ``x``).

    Returns
    -------
    RematProblem
        Frozen; its index views (``index``, ``preds``, ``users``, ...) are computed once.

    Raises
    ------
    ValueError
        If a node is listed twice, an edge names an unknown node or goes against the node
        order, a node lacks a cost or a size or has a negative one, an output is unknown,
        a workspace is negative or names an unknown node, or a tie breaks its rules.

    Complexity
    ----------
    ``O(n + m d)`` for ``n`` nodes, ``m`` edges and in-degree ``d``.
    """

    nodes: Sequence[str]
    edges: Sequence[tuple[str, str]]
    cost: dict[str, float]
    size: dict[str, int]
    outputs: frozenset[str] | set[str] = frozenset()
    workspace: dict[str, int] = dataclasses.field(default_factory=dict)
    tied: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        index = {}
        for i, v in enumerate(self.nodes):
            if v in index:
                raise ValueError(f"node {v!r} listed twice")
            index[v] = i
        for u, v in self.edges:
            if u not in index or v not in index:
                raise ValueError(f"edge ({u!r}, {v!r}) names an unknown node")
            if index[u] >= index[v]:
                raise ValueError(f"edge ({u!r}, {v!r}) goes against the node order (not topological)")
        for v in self.nodes:
            if self.cost.get(v, -1) < 0 or self.size.get(v, -1) < 0:
                raise ValueError(f"node {v!r} needs a cost >= 0 and a size >= 0")
        unknown = [o for o in self.outputs if o not in index]
        if unknown:
            raise ValueError(f"unknown outputs {sorted(unknown)!r}")
        object.__setattr__(self, "_index", index)
        for v, w in self.workspace.items():
            if v not in index or w < 0:
                raise ValueError(f"workspace of {v!r}: needs a known node and bytes >= 0")
        for x, f in self.tied.items():
            if x not in index or f not in index:
                raise ValueError(f"tied ({x!r}, {f!r}) names an unknown node")
            if index[x] != index[f] + 1 or index[f] not in self.preds[index[x]]:
                raise ValueError(f"tied node {x!r} must read {f!r} and come right after it in the node order")
            if f in self.tied or x in self.tied.values():
                raise ValueError(f"tied ({x!r}, {f!r}): an operation has at most two outputs")
            for u in self.users[index[x]]:
                missing = [self.nodes[q] for q in self.preds[index[x]] if q not in self.preds[u]]
                if missing:
                    raise ValueError(f"{self.nodes[u]!r} reads the tied node {x!r} but not its inputs {missing!r}")

    # Index views (node i is self.nodes[i]); lists keep node order for reproducibility.
    @property
    def index(self) -> dict[str, int]:
        """``index[v]``: the position of node ``v`` in ``nodes``."""
        return self._index  # type: ignore[attr-defined]

    @functools.cached_property
    def preds(self) -> list[list[int]]:
        """``preds[i]``: the inputs of node ``i``, as sorted node indices."""
        preds: list[list[int]] = [[] for _ in self.nodes]
        for u, v in self.edges:
            if self.index[u] not in preds[self.index[v]]:
                preds[self.index[v]].append(self.index[u])
        return [sorted(p) for p in preds]

    @functools.cached_property
    def users(self) -> list[list[int]]:
        """``users[i]``: the nodes that read node ``i``, as sorted node indices."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for v, ps in enumerate(self.preds):
            for p in ps:
                users[p].append(v)
        return users

    @functools.cached_property
    def tied_to(self) -> list[int | None]:
        """``tied_to[x]``: the index of the node ``x`` is tied to, or None."""
        out: list[int | None] = [None] * len(self.nodes)
        for x, f in self.tied.items():
            out[self.index[x]] = self.index[f]
        return out

    @functools.cached_property
    def pinned_by(self) -> list[list[int]]:
        """``pinned_by[q]``: the tied nodes that read ``q`` (``q`` stays while one is resident)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for x, f in enumerate(self.tied_to):
            if f is not None:
                for q in self.preds[x]:
                    out[q].append(x)
        return out

    @functools.cached_property
    def work(self) -> list[int]:
        """Workspace bytes by node index."""
        return [self.workspace.get(v, 0) for v in self.nodes]

    @functools.cached_property
    def output_ids(self) -> list[int]:
        """The indices of the outputs, in node order."""
        return [i for i, v in enumerate(self.nodes) if v in self.outputs]

    @functools.cached_property
    def needed(self) -> list[int]:
        """Indices of the ancestors of the outputs (outputs included), in node order."""
        mark = [False] * len(self.nodes)
        for o in self.output_ids:
            mark[o] = True
        for v in range(len(self.nodes) - 1, -1, -1):
            if mark[v]:
                for p in self.preds[v]:
                    mark[p] = True
        return [v for v in range(len(self.nodes)) if mark[v]]

    def restricted(self) -> RematProblem:
        """The same problem without the nodes no output depends on.

        Returns
        -------
        RematProblem
            The nodes of :attr:`needed`, in the same order, with their edges, costs, sizes,
            workspaces and ties.

        Raises
        ------
        Nothing

        Complexity
        ----------
        ``O(n + m)``.
        """
        keep = [self.nodes[i] for i in self.needed]
        kept = set(keep)
        return RematProblem(
            nodes=keep,
            edges=[(u, v) for u, v in self.edges if u in kept and v in kept],
            cost={v: self.cost[v] for v in keep}, size={v: self.size[v] for v in keep},
            outputs=frozenset(self.outputs),
            workspace={v: w for v, w in self.workspace.items() if v in kept},
            tied={x: f for x, f in self.tied.items() if x in kept})
