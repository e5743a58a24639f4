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

import torch.fx as fx

from .passes.memory import Step, Timeline, simulate
from .sizes import is_multi_output, node_bytes, storage_of


def _graph_steps(gm: fx.GraphModule, phase: str, rename: dict[str, str]) -> tuple[list[Step], dict[str, str | None]]:
    """Steps of one graph, and the storage of each node by name; ``rename`` maps a
    placeholder to the storage it arrives in."""
    storage: dict[fx.Node, str | None] = {}
    steps: list[Step] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            storage[node] = rename.get(node.name)
            if storage[node] is not None and phase == "backward" and node.name.startswith("tangents"):
                steps.append(Step(node.name, allocates={storage[node]: node_bytes(node)}, phase=phase))
            continue
        if node.op == "output":
            continue
        base = storage_of(node)
        if base is None or base != node.name:
            # a view (lives in its base's storage) or a non-tensor
            base_node = next((a for a in node.all_input_nodes), None)
            storage[node] = storage.get(base_node) if base is not None and base_node is not None else None
            allocates = {}
        elif is_multi_output(node):
            storage[node] = None  # its items are allocated by their getitems
            allocates = {}
        else:
            storage[node] = f"{phase}:{node.name}"
            allocates = {storage[node]: node_bytes(node)}
        reads = [storage[a] for a in node.all_input_nodes if storage.get(a)]
        steps.append(Step(node.name, allocates=allocates, reads=reads, phase=phase))
    return steps, {n.name: s for n, s in storage.items()}


def _output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(iter(gm.graph.find_nodes(op="output")))
    return [a for a in out.args[0] if isinstance(a, fx.Node)]


def predict(fwd: fx.GraphModule, bwd: fx.GraphModule, num_user_outputs: int) -> Timeline:
    fwd_steps, fwd_storage = _graph_steps(fwd, "forward", {})
    # The backward's saved inputs arrive in the storages the forward returned them in.
    fwd_out_args = list(next(iter(fwd.graph.find_nodes(op="output"))).args[0])
    rename = {}
    for node in bwd.graph.find_nodes(op="placeholder"):
        if node.name in fwd_storage:
            rename[node.name] = fwd_storage[node.name]
        elif node.name.startswith("tangents"):
            rename[node.name] = f"backward:{node.name}"
    bwd_steps, bwd_storage = _graph_steps(bwd, "backward", rename)
    bwd_outputs = {bwd_storage[n.name] for n in _output_nodes(bwd) if bwd_storage.get(n.name)}
    user_outputs = {
        s for a in fwd_out_args[:num_user_outputs] if isinstance(a, fx.Node)
        for s in [fwd_storage.get(a.name)] if s
    }
    return simulate(fwd_steps + bwd_steps, keep=user_outputs | bwd_outputs)
