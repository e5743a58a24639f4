"""A graph's floor: the bytes no plan can go under, whatever it recomputes.

    graph_floor(joint, input_names, end_bytes, inlines=True) -> Floor

Two things every plan must hold at some moment of the step:

- what it keeps to the end (``end_bytes`` of any plan's timeline: the parameter gradients
  and the outputs the caller holds); and
- the largest single operation's working set: an op runs with its operands and its
  result in memory at once, and a backward op besides with the parameter gradients made
  before it and the outputs the caller holds (every plan runs the backward's ops in the
  joint graph's order; recomputation only adds forward ops between them). Only ops that
  write their result to memory count: under Inductor (``inlines=True``) a pointwise op or
  a reduction may be fused into its reader and never be materialized, so only library
  kernels (matmuls, convolutions, attention, embedding lookups) count there; with
  ``compiler="eager"`` every op does.

The floor is the larger of the two, a lower bound of every plan's predicted peak: a
least-memory plan is as close to the limit as its peak is to the floor. The step's
inputs (parameters, buffers, the batch) are not counted, as in the budget.
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from . import oplib
from .sizes import flat_tensors, node_bytes, storages


@dataclasses.dataclass(frozen=True)
class Floor:
    """``bytes``: the floor; ``end_bytes``: what every plan keeps to the end of the step;
    ``largest_op``: the op of the largest working set, and ``op_bytes`` that working set."""

    bytes: int
    end_bytes: int
    largest_op: str | None
    op_bytes: int
    in_backward: bool = False  # the largest op is a backward op (gradients made before it count)

    def describe(self) -> str:
        """Which of the two bounds the floor is, in words."""
        from .options import format_bytes

        if self.largest_op is not None and self.op_bytes > self.end_bytes:
            held = " with the parameter gradients made before it" if self.in_backward else ""
            return (f"the largest single operation ({self.largest_op}) needs {format_bytes(self.op_bytes)} for its "
                    f"operands and result at once{held}")
        return (f"the parameter gradients and outputs every plan keeps to the end of the step take "
                f"{format_bytes(self.end_bytes)}")


def _materializes(node: fx.Node, inlines: bool) -> bool:
    """Does ``node`` write a result of its own to memory in every plan?"""
    if node.op != "call_function" or oplib.is_view(node) or oplib.is_getitem(node):
        return False
    if not flat_tensors(node.meta.get("val")):
        return False
    return not (inlines and oplib.is_fusible(node))


def graph_floor(joint: fx.GraphModule, input_names: set[str], end_bytes: int, *, forward: set[fx.Node] = frozenset(),
                gradients: list[fx.Node] = (), held: list[fx.Node] = (), inlines: bool = True) -> Floor:
    """The floor of the joint graph ``joint`` (module docstring).

    Parameters
    ----------
    joint : fx.GraphModule
        The joint forward/backward graph, nodes carrying ``meta["val"]``.
    input_names : set of str
        The step's inputs (not counted).
    end_bytes : int
        What every plan keeps to the end of the step (``Timeline.end_bytes``).
    forward : set of fx.Node
        The forward's nodes; the others are the backward's.
    gradients : list of fx.Node
        The backward's outputs (parameter gradients): each is held from the op that makes
        it to the end of the step.
    held : list of fx.Node
        The forward's outputs the caller holds through the backward.
    inlines : bool
        Whether the compiler fuses pointwise ops into their readers (Inductor).

    Returns
    -------
    Floor

    Raises
    ------
    Nothing.

    Complexity: ``O(V + E)``.

    Examples
    --------
    >>> import torch
    >>> from fxremat.floor import graph_floor
    >>> def f(x, w):
    ...     return torch.ops.aten.mm.default(x, w).relu()
    >>> gm = torch.fx.symbolic_trace(f)
    >>> x, w, mm = list(gm.graph.nodes)[:3]
    >>> x.meta["val"], w.meta["val"], mm.meta["val"] = torch.ones(4, 8), torch.ones(8, 16), torch.ones(4, 16)
    >>> graph_floor(gm, {"x", "w"}, end_bytes=0).op_bytes   # the mm's result; its operands are inputs
    256
    """
    grads = {g for g in gradients if isinstance(g, fx.Node)}
    # What a backward op runs beside: the held outputs and the gradients made so far, by
    # storage, kept with their total as the walk goes (not summed again at every op).
    alive = storages([h for h in held if isinstance(h, fx.Node)], input_names)
    alive_bytes = sum(map(node_bytes, alive.values()))
    largest, largest_bytes = None, 0
    for node in joint.graph.nodes:
        if _materializes(node, inlines):
            own = storages([node, *node.all_input_nodes], input_names)
            if node in forward:
                size = sum(map(node_bytes, own.values()))
            else:
                size = alive_bytes + sum(node_bytes(b) for name, b in own.items() if name not in alive)
            if size > largest_bytes:
                largest, largest_bytes = node, size
        if node in grads:
            for name, b in storages([node], input_names).items():
                if name not in alive:
                    alive[name] = b
                    alive_bytes += node_bytes(b)
    return Floor(max(end_bytes, largest_bytes), end_bytes, None if largest is None else _where(largest), largest_bytes,
                 in_backward=largest is not None and largest not in forward)


def _where(node: fx.Node) -> str:
    """An op as a user finds it: its node name, and the module it belongs to when known."""
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else None
    return f"{node.name}, in {path}" if path else node.name
