"""Which saved values to give up under a memory budget: a greedy knapsack.

Problem
-------
The min-cut plan saves values that are expensive to recompute (a matmul's output
is never recomputed by the traffic-optimal cut). Under a budget the plan does not
fit, give up some of them: allow each given-up value to be recomputed in the
backward, so that the plan's peak fits the budget at the least added time. Each
candidate ``item`` has the seconds it takes to recompute (``seconds``) and the
bytes it frees when it is not saved (``nbytes``).

Method
------
The 0/1 knapsack "free at least this many bytes at the least seconds", solved the
way Dantzig's greedy solves its fractional relaxation: give up items in order of
seconds per freed byte, cheapest first, and stop at the shortest prefix that fits.
PyTorch's ``activation_memory_budget`` partitioner sets up the same trade with a
knapsack over summed bytes; here whether a prefix fits is asked of the caller
(``fits``), which predicts the real peak of the plan built from it: bytes freed do
not add up (a value freed where the peak is not frees nothing), so the prefix is
found by a galloping search on ``fits``.

Complexity: ``O(n log n)`` to rank ``n`` items, then ``O(log k)`` calls of ``fits``
for an answer ``k``.

Example
-------
>>> items = [Item("mm", seconds=4.0, nbytes=8), Item("bmm", seconds=1.0, nbytes=8),
...          Item("norm", seconds=0.1, nbytes=4)]
>>> [item.name for item in rank(items)]
['norm', 'bmm', 'mm']
>>> least_prefix(3, lambda k: k >= 2)
2
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Item:
    """A saved value that could be given up.

    Parameters
    ----------
    name : str
    seconds : float
        Time to recompute it in the backward.
    nbytes : int
        Memory it frees when it is not saved.

    Returns
    -------
    Item
        Frozen (hashable).

    Raises
    ------
    Nothing
        Fields are not checked.

    Complexity
    ----------
    ``O(1)``.
    """

    name: str
    seconds: float
    nbytes: int


def rank(items: Sequence[Item]) -> list[Item]:
    """The items in the order to give them up: cheapest seconds per freed byte first.

    Parameters
    ----------
    items : sequence of Item

    Returns
    -------
    list of Item
        Sorted by ``seconds / max(nbytes, 1)`` (an item freeing nothing counts as one
        byte); ties keep the given order, so the ranking is reproducible.

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(n log n)`` for ``n`` items.

    References
    ----------
    Dantzig, "Discrete-variable extremum problems", Operations Research 5(2), 1957: the
    greedy order that solves the fractional knapsack.
    """
    order = sorted(range(len(items)), key=lambda i: (items[i].seconds / max(items[i].nbytes, 1), i))
    return [items[i] for i in order]


def least_prefix(n: int, fits: Callable[[int], bool]) -> int | None:
    """The least ``k`` in ``0..n`` with ``fits(k)``, asking ``fits`` as rarely as can be.

    Gallop (1, 2, 4, ...) to the first power of two that fits, then bisect below it
    (``fits`` assumed monotone on the way: a longer prefix gives up more). Galloping, not
    bisecting all of ``0..n``, keeps away from the long prefixes, which give up values
    whose inputs are given up too and so recompute chains that span the model (on a
    12-layer transformer the peak falls with the prefix, then rises again at the end).

    Parameters
    ----------
    n : int
        The number of items ranked (the longest prefix).
    fits : callable of int to bool
        Whether the plan that gives up the first ``k`` ranked items fits the budget.

    Returns
    -------
    int or None
        ``k``, or None when no probe fits (``fits(n)`` is the last one tried).

    Raises
    ------
    Exception
        Whatever ``fits`` raises.

    Complexity
    ----------
    ``O(log k)`` calls of ``fits`` for an answer ``k`` (``O(log n)`` when none fits).

    References
    ----------
    Bentley & Yao, "An almost optimal algorithm for unbounded searching", Information
    Processing Letters 5(3), 1976 (galloping, or exponential, search).
    """
    if fits(0):
        return 0
    lo, hi = 0, 1  # fits(lo) fails
    while not fits(min(hi, n)):
        if hi >= n:
            return None
        lo, hi = hi, 2 * hi
    hi = min(hi, n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi
