"""Predicted live-bytes timeline of a partitioned training step.

Budget definition (see the README): the bytes allocated by the compiled forward
and backward above what the step's inputs already hold. Inputs (parameters,
buffers, the batch) are not counted; every tensor the graphs allocate is, from
the op that makes it until its last use: forward temporaries, saved
activations, the forward's outputs (kept to the end, the caller holds them),
the tangents, backward temporaries and the parameter gradients the backward
returns (kept to the end: they become ``.grad``).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from . import oplib
from .passes.memory import Step, Timeline, simulate
from .sizes import is_multi_output, node_bytes, storage_of


# Inductor inlines a pointwise value into its reader's kernel; a value read by several
# kernels is, in our measurements, mostly written out once (realized) instead: with 1
# here, predicted peaks of Rotor plans (many recomputed values with several readers)
# moved from 20% below the measured ones to within 2-9%, min-cut plans unchanged.
MAX_FUSED_READERS = 1


def _readers(node: fx.Node) -> list[fx.Node]:
    """The nodes that read ``node``'s data, looking through views (the output node included)."""
    found = []
    for user in node.users:
        found.extend(_readers(user) if user.op == "call_function" and oplib.is_view(user) else [user])
    return found


def fused_away(node: fx.Node) -> bool:
    """Will Inductor compute this value inside its readers' kernels, never writing it to
    memory? Pointwise values whose readers are all fusible with them, few, and in the
    same graph; reductions, graph outputs and inputs of library kernels are written."""
    if node.op != "call_function" or is_multi_output(node) or oplib.is_reduction(node):
        return False
    if not oplib.is_fusible(node) or oplib.is_view(node) or oplib.is_getitem(node):
        return False
    readers = _readers(node)
    return 0 < len(readers) <= MAX_FUSED_READERS and all(
        r.op == "call_function" and oplib.fusible_pair(node, r) for r in readers)


_CONV_BACKWARD = torch.ops.aten.convolution_backward.default


def _graph_steps(gm: fx.GraphModule, phase: str, rename: dict[str, str], relaid: set[str] = frozenset(),
                 fusion: bool = False, channels_last: bool = False) -> tuple[list[Step], dict[str, str | None]]:
    """Steps of one graph, and the storage of each node by name; ``rename`` maps a
    placeholder to the storage it arrives in. Inputs in ``relaid`` are copied to a new
    layout before their first use (Inductor's channels-last convolutions): the copy
    is allocated there, and it is what the graph hands on if the input is saved.
    With ``fusion``, values Inductor fuses away (``fused_away``) allocate nothing and
    their readers keep alive what they were computed from instead."""
    storage: dict[fx.Node, str | None] = {}
    needs: dict[fx.Node, frozenset[str]] = {}  # storages that reading the node's value touches
    steps: list[Step] = []
    pending_copies = {n for n in gm.graph.find_nodes(op="placeholder") if n.name in relaid}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            storage[node] = f"{phase}:{node.name}:relaid" if node in pending_copies else rename.get(node.name)
            needs[node] = frozenset([storage[node]] if storage[node] else [])
            if storage[node] is not None and phase == "backward" and node.name.startswith("tangents"):
                steps.append(Step(node.name, allocates={storage[node]: node_bytes(node)}, phase=phase))
            continue
        if node.op == "output":
            continue
        reads = frozenset().union(*(needs.get(a, frozenset()) for a in node.all_input_nodes))
        base = storage_of(node)
        allocates: dict[str, int] = {}
        if base is None or base != node.name:
            # a view (lives in its base's storage) or a non-tensor
            base_node = next((a for a in node.all_input_nodes), None)
            storage[node] = storage.get(base_node) if base is not None and base_node is not None else None
            needs[node] = needs.get(base_node, frozenset()) if base is not None and base_node is not None else frozenset()
        elif is_multi_output(node):
            storage[node] = None  # its items are allocated by their getitems
            needs[node] = frozenset()
        elif fusion and fused_away(node):
            storage[node] = None
            needs[node] = reads
        else:
            storage[node] = f"{phase}:{node.name}"
            needs[node] = frozenset([storage[node]])
            allocates = {storage[node]: node_bytes(node)}
        for a in node.all_input_nodes:
            if a in pending_copies:
                pending_copies.discard(a)
                allocates[storage[a]] = node_bytes(a)
        if channels_last and node.target is _CONV_BACKWARD and isinstance(node.args[0], fx.Node):
            # With channels-last convolutions the library's backward takes the incoming
            # gradient (contiguous) in its own layout: a temporary copy of it, freed
            # when the op returns (measured on CPU: one grad_output-sized buffer).
            allocates[f"{phase}:{node.name}:workspace"] = node_bytes(node.args[0])
        # Inductor writes in place only from kernels it generates, not library calls.
        in_place = fusion and oplib.is_fusible(node)
        steps.append(Step(node.name, allocates=allocates, reads=sorted(reads), phase=phase, in_place=in_place))
    return steps, {n.name: s for n, s in storage.items()}


def _output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(iter(gm.graph.find_nodes(op="output")))
    return [a for a in out.args[0] if isinstance(a, fx.Node)]


def relaid_inputs(fwd: fx.GraphModule) -> set[str]:
    """Forward inputs Inductor copies to channels-last for its convolutions, if it will."""
    import torch

    from . import _compat

    convs = list(fwd.graph.find_nodes(op="call_function", target=torch.ops.aten.convolution.default))
    if not convs or not _compat.inductor_relayouts_convolutions(fwd):
        return set()
    return {a.name for c in convs for a in c.args[:2] if isinstance(a, fx.Node) and a.op == "placeholder"}


def predict(fwd: fx.GraphModule, bwd: fx.GraphModule, num_user_outputs: int,
            relaid: set[str] = frozenset(), fusion: bool = False) -> Timeline:
    """``relaid``: forward inputs the compiler copies to another layout (``relaid_inputs``);
    ``fusion``: model Inductor's fusion (values it never writes to memory)."""
    fwd_steps, fwd_storage = _graph_steps(fwd, "forward", {}, relaid, fusion, channels_last=bool(relaid))
    # The backward's saved inputs arrive in the storages the forward returned them in.
    fwd_out_args = list(next(iter(fwd.graph.find_nodes(op="output"))).args[0])
    rename = {}
    for node in bwd.graph.find_nodes(op="placeholder"):
        if node.name in fwd_storage:
            rename[node.name] = fwd_storage[node.name]
        elif node.name.startswith("tangents"):
            rename[node.name] = f"backward:{node.name}"
    bwd_steps, bwd_storage = _graph_steps(bwd, "backward", rename, fusion=fusion, channels_last=bool(relaid))
    bwd_outputs = {bwd_storage[n.name] for n in _output_nodes(bwd) if bwd_storage.get(n.name)}
    user_outputs = {
        s for a in fwd_out_args[:num_user_outputs] if isinstance(a, fx.Node)
        for s in [fwd_storage.get(a.name)] if s
    }
    return simulate(fwd_steps + bwd_steps, keep=user_outputs | bwd_outputs)
