"""Facts of a node that planning asks again and again, found once per planning.

A search scores dozens of candidate graphs, and each candidate's timeline asks of every
node its bytes and, op by op, a library call's scratch bytes: the 48-layer transformer of
``bench/plan_time.py`` asked 370,000 times in one plan, for 10,000 distinct nodes. Light
copies (``lite``) share their joint-graph node's ``meta`` dictionary, so a fact keyed by
that dictionary is found once for the joint node and every copy of it.

The memo lives only while a graph is planned (``planning``, entered by ``partition._plan``),
so it keeps no graph alive after; outside it every question is answered afresh.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

# (kind, id(meta)) -> (meta, val, target, answer): the meta dictionary is held, so its id
# is not reused while the memo lives; val and target are checked, so a node whose value
# or op was replaced is asked again.
_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("fxremat_node_memo", default=None)


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """Remember ``per_meta`` answers until the block ends, from a fresh memo (a rank that plans
    again with rank 0's figures starts afresh: ``ranks.same_plan``).

    >>> import torch.fx as fx
    >>> g = fx.Graph(); x = g.placeholder("x"); x.meta["val"] = 3
    >>> calls = []
    >>> with planning():
    ...     answers = [per_meta("double", x, lambda n: calls.append(n) or 2 * n.meta["val"]) for _ in range(3)]
    >>> answers, len(calls)
    ([6, 6, 6], 1)
    """
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def per_meta(kind: str, node: Any, compute: Callable[[Any], Any]) -> Any:
    """``compute(node)``, remembered while planning for every node that shares ``node``'s
    meta dictionary, value and op (a joint-graph node and its light copies).

    Only for facts that follow from the node's op, its value and its inputs' values (a
    copy reads copies of the same joint nodes): its bytes, a library call's scratch."""
    memo = _MEMO.get()
    if memo is None:
        return compute(node)
    meta = node.meta
    val, target = meta.get("val"), node.target
    key = (kind, id(meta))
    entry = memo.get(key)
    if entry is not None and entry[0] is meta and entry[1] is val and entry[2] == target:
        return entry[3]
    answer = compute(node)
    memo[key] = (meta, val, target, answer)
    return answer


def per_planning(kind: str, compute: Callable[[], Any]) -> Any:
    """``compute()``, remembered while planning: for what no node changes and one plan
    cannot change either (whether Dynamo is tracing, an Inductor setting), which a search
    asks of every node of every candidate. Outside ``planning`` it is asked afresh.

    >>> calls = []
    >>> with planning():
    ...     answers = [per_planning("seven", lambda: calls.append(1) or 7) for _ in range(3)]
    >>> answers, len(calls)
    ([7, 7, 7], 1)
    """
    memo = _MEMO.get()
    if memo is None:
        return compute()
    key = ("per planning", kind)
    if key not in memo:
        memo[key] = compute()
    return memo[key]
