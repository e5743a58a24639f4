"""A graph's floor: the bytes no plan can go under, whatever it recomputes.

    graph_floor(joint, input_names, end_bytes, inlines=True) -> Floor

Three things every plan must hold at some moment of the step:

- what it keeps to the end (``end_bytes`` of any plan's timeline: the parameter gradients
  and the outputs the caller holds);
- the largest single operation's working set: an op runs with its operands and its
  result in memory at once, and a backward op besides with the parameter gradients made
  before it and the outputs the caller holds (every plan runs the backward's ops in the
  joint graph's order; recomputation only adds forward ops between them). Only ops that
  write their result to memory count: under Inductor (``inlines=True``) a pointwise op or
  a reduction may be fused into its reader and never be materialized, so only library
  kernels (matmuls, convolutions, attention, embedding lookups) count there; with
  ``compiler="eager"`` every op does; and
- under the step's budget (``fxremat.step``), what the step's later graphs need between
  this graph's forward and its backward, beside the forward's outputs they read.

The floor is the largest of the three, a lower bound of every plan's predicted peak: a
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
    later_graphs_bytes: int = 0  # the step's later graphs' need with the outputs they read (0: none)

    def describe(self) -> str:
        """Which of the three bounds the floor is, in words."""
        from .options import format_bytes

        if self.later_graphs_bytes and self.later_graphs_bytes >= max(self.op_bytes, self.end_bytes):
            return (f"the step's later graphs need {format_bytes(self.later_graphs_bytes)} between this graph's "
                    f"forward and backward, with the outputs of this graph they read")
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
                gradients: list[fx.Node] = (), held: list[fx.Node] = (), inlines: bool = True,
                outputs: list[fx.Node] = (), later_graphs: tuple[int, int] = (0, 0)) -> Floor:
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
    outputs : list of fx.Node
        The forward's outputs, which the step's later graphs read.
    later_graphs : (int, int)
        What the step's later graphs need between the forward and the backward, and what
        of it they keep through the backward (``Budget.later_graphs``, ``later_graphs_kept``).

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
    alive_bytes = sum(map(node_bytes, alive.values())) + later_graphs[1]
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
    between = 0
    if later_graphs[0]:
        between = later_graphs[0] + sum(map(node_bytes, storages([o for o in outputs if isinstance(o, fx.Node)],
                                                              input_names).values()))
    return Floor(max(end_bytes, largest_bytes, between), end_bytes, None if largest is None else _where(largest),
                 largest_bytes, in_backward=largest is not None and largest not in forward, later_graphs_bytes=between)


def _where(node: fx.Node) -> str:
    """An op as a user finds it: its node name, and the module it belongs to when known."""
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else None
    return f"{node.name}, in {path}" if path else node.name
