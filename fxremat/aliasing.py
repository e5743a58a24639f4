"""Aliasing in FX graphs: who reads a value, and which storage holds it.

The partitioner (bans, materialized values), the memory timeline and the cost model
must agree on both questions, so each has one answer here:

* :func:`storage_node`: the node whose allocation holds a value's data. A view shares
  its base's storage, and so does an item of a view op's tuple (``split``, ``unbind``).
* :func:`readers`: the nodes that read a value's data. A view or a tuple item reads
  nothing itself; its own readers read the value.
"""

from __future__ import annotations

from typing import Callable

import torch.fx as fx

from . import oplib
from .lite import NODES


def is_alias(node: fx.Node) -> bool:
    """Does ``node`` share its first input's storage: a view, or an item of a view
    op's tuple (``getitem(split(x), 0)``)? Such a node runs no kernel."""
    if node.op != "call_function":
        return False
    if oplib.is_view(node):
        return True
    return oplib.is_getitem(node) and isinstance(node.args[0], NODES) and oplib.is_view(node.args[0])


def storage_node(node: fx.Node) -> fx.Node:
    """The node whose allocation holds ``node``'s data: ``node`` itself unless it is an
    alias (:func:`is_alias`), then its base's storage node."""
    while is_alias(node) and node.args and isinstance(node.args[0], NODES):
        node = node.args[0]
    return node


def readers(node: fx.Node, stop: Callable[[fx.Node], bool] | None = None) -> list[fx.Node]:
    """The nodes that read ``node``'s data (the graph's output node included), looking
    through views and tuple items, which read nothing themselves. ``stop(view)``: count
    that view as a reader instead of looking through it (the timeline's views Inductor
    copies into a buffer of their own)."""
    found = []
    for user in node.users:
        passes_on = user.op == "call_function" and (oplib.is_view(user) or oplib.is_getitem(user))
        if passes_on and not (stop is not None and stop(user)):
            found.extend(readers(user, stop))
        else:
            found.append(user)
    return found
