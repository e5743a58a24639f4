"""The joint forward/backward graph, read for planning: which nodes the forward can
compute, which it must not recompute and why (``classify``, ``ban_reason``), and the
graph as an abstract min-cut problem (``mincut_problem``, solved by ``passes.mincut``)."""

from __future__ import annotations

import dataclasses
import re
import warnings

import torch
import torch.fx as fx

from . import _compat, oplib
from .aliasing import is_alias, readers
from .passes import mincut
from .sizes import is_multi_output, is_tensor_node, node_bytes, storage_of

# Saving a node ``d`` ops away from the backward costs (1 + REWEIGHT * d) times its
# bytes: a tie-break that prefers saving values close to the backward, which need
# the shortest recomputation (Yu & He, section 3.4).
REWEIGHT = 0.01
REWEIGHT_MAX_DISTANCE = 100
# Reductions whose output is this many times smaller than their input are saved,
# never recomputed (Yu & He, section 3.4).
SMALL_REDUCTION_RATIO = 4
# The lean cut (for budgets the traffic-optimal plan does not fit) prices a saved byte at
# this many reads: bytes decide, traffic breaks ties.
LEAN_BYTE_PENALTY = 8.0


def module_path(node: fx.Node) -> str:
    """The dotted path of the innermost ``nn.Module`` whose forward made ``node`` ("blocks.3.attn"),
    from Dynamo's ``nn_module_stack`` (a backward op's ``fwd_nn_module_stack``: the module
    whose forward it differentiates); "" for what no module made (inputs, a loss computed
    in the model's own ``forward``). Reports group a plan by it."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    # Dynamo spells a path as Python source: L['self'].blocks.0, or
    # L['self']._modules['blocks']._modules['0'] on some releases.
    path = re.sub(r"^L\['self'\]\.?|^L\['[^']*'\]\.?", "", path)
    path = re.sub(r"\.?_modules\['([^']*)'\]|\['([^']*)'\]|\[(\d+)\]",
                  lambda m: "." + next(g for g in m.groups() if g is not None), path)
    return path.lstrip(".")


def recomputed_entry(copy: fx.Node, source: str) -> dict:
    """A plan's record of one op the backward computes again: the copy's name and op, and the
    forward node it copies (``source``: a value recomputed twice has two copies of one
    source). Its module is added to the plan chosen (``add_modules``)."""
    return {"name": copy.name, "op": oplib.op_name(copy.target), "source": source}


def add_modules(saved: list[dict], recomputed: list[dict], joint: fx.GraphModule, backward: fx.GraphModule) -> None:
    """The ``module`` (``module_path``) of each saved value (a joint node) and each recomputed
    copy (a node of ``backward``), for reports: done for the plan chosen, not for every
    candidate a search scores."""
    nodes = {n.name: n for n in joint.graph.nodes}
    copies = {n.name: n for n in backward.graph.nodes}
    for entry, found in [(e, nodes) for e in saved] + [(e, copies) for e in recomputed]:
        node = found.get(entry["name"])
        entry["module"] = module_path(node) if node is not None else ""


def prepare(joint: fx.GraphModule) -> fx.GraphModule:
    """The joint graph as the planners read it: dead code removed, common
    subexpressions merged, and the ops torch always saves marked MUST_SAVE."""
    joint.graph.eliminate_dead_code()
    joint.recompile()
    joint = _compat.cse(joint)
    joint.recompile()
    _compat.force_save_special_ops(joint)
    return joint


def warn_on_checkpoint_preferences(joint: fx.GraphModule, graph_id: str) -> None:
    """torch.utils.checkpoint regions mark their ops PREFER_RECOMPUTE (selective policies may
    say PREFER_SAVE); fxremat plans the whole graph itself and follows only the MUST_* marks.
    Says so once per graph, and names the MUST_RECOMPUTE marks it cannot follow (random ops:
    drawing again would change the numbers)."""
    count = sum(_compat.is_prefer_policy(n) for n in joint.graph.nodes)
    if count:
        warnings.warn(
            f"fxremat (graph {graph_id}): {count} ops carry torch.utils.checkpoint PREFER_* marks; fxremat "
            "chooses what to recompute itself (within the memory budget, if one is given) and does not follow "
            "them. MUST_SAVE / MUST_RECOMPUTE marks from selective checkpoint policies are followed. Remove "
            "the checkpoint wrappers to silence this.",
            stacklevel=3,
        )
    random = [n.name for n in joint.graph.nodes if _compat.is_must_recompute(n) and oplib.is_random(n)]
    if random:
        warnings.warn(
            f"fxremat (graph {graph_id}): {len(random)} random ops are marked MUST_RECOMPUTE ({', '.join(random[:5])}"
            f"{', ...' if len(random) > 5 else ''}); fxremat keeps them, since drawing again would change the "
            "numbers.", stacklevel=3)


@dataclasses.dataclass
class NodeClasses:
    forward: set[fx.Node]  # V_f: computable from the forward inputs alone
    required_forward: set[fx.Node]  # needed by the forward's outputs
    inputs: list[fx.Node]  # primals and forward RNG seeds
    fwd_outputs: list[fx.Node]
    bwd_outputs: list[fx.Node]
    distance_to_backward: dict[fx.Node, int]


def classify(joint: fx.GraphModule, num_fwd_outputs: int) -> NodeClasses:
    fwd_outputs, bwd_outputs = _compat.fwd_bwd_outputs(joint, num_fwd_outputs)
    forward: set[fx.Node] = set()
    inputs: list[fx.Node] = []
    for node in joint.graph.nodes:
        if node.op == "placeholder":
            if _compat.is_primal(node) or _compat.is_fwd_seed_offset(node):
                forward.add(node)
                inputs.append(node)
        elif node.op == "get_attr":
            forward.add(node)
        elif node.op == "call_function":
            if all(a in forward for a in node.all_input_nodes) and not _compat.must_be_in_backward(node):
                forward.add(node)
    required: set[fx.Node] = set()
    stack = [n for n in fwd_outputs if isinstance(n, fx.Node)]
    while stack:
        node = stack.pop()
        if node in required or node not in forward:
            continue
        required.add(node)
        stack.extend(node.all_input_nodes)
    distance: dict[fx.Node, int] = {}
    for node in reversed(joint.graph.nodes):
        if node not in forward:
            distance[node] = 0
        else:
            distance[node] = min((distance[u] + 1 for u in node.users if u.op != "output"),
                                 default=REWEIGHT_MAX_DISTANCE)
    return NodeClasses(forward, required, inputs, list(fwd_outputs), list(bwd_outputs), distance)


def _consumers(node: fx.Node) -> list[fx.Node]:
    """The ops that read ``node``'s data (``aliasing.readers``), not the graph's output."""
    return [r for r in readers(node) if r.op != "output"]


def ban_reason(node: fx.Node, classes: NodeClasses, lean: bool = False) -> str | None:
    """Why a forward node must not be recomputed in the backward, or None if it may be.
    ``lean``: for the saved set of fewest bytes, a node the backward materializes anyway
    may be recomputed (it saves no traffic, but it saves memory)."""
    if _compat.is_must_save(node):
        return "must_save"
    if oplib.is_random(node):
        return "random"  # recomputing would draw new numbers
    if _compat.is_sym_node(node):
        return "symint"  # a few bytes; recomputing shape arithmetic buys nothing
    if _compat.is_must_recompute(node):
        # A selective checkpoint policy's mark wins over the cost rules below, as in
        # torch's partitioner: the user traded the recomputation for the memory.
        return None
    if node not in classes.required_forward:
        # Only the backward uses it: computing it there is not a recomputation.
        return None
    if oplib.is_getitem(node) or oplib.is_view(node):
        return None  # free to take again from what it aliases: never worth a ban
    if oplib.is_compute_intensive(node):
        return "compute_intensive"
    if not oplib.is_fusible(node):
        return "unfusible"
    if not lean and any(u not in classes.forward and not oplib.fusible_pair(node, u) for u in _consumers(node)):
        # The backward materializes it anyway (Lemma 3.1): recomputing saves no traffic.
        return "unfusible_backward_user"
    if oplib.is_reduction(node):
        in_bytes = max((node_bytes(a) for a in node.all_input_nodes), default=0)
        if node_bytes(node) * SMALL_REDUCTION_RATIO <= in_bytes:
            return "small_reduction"
    return None


def is_materialized(node: fx.Node, classes: NodeClasses) -> bool:
    """Algorithm 2: written to memory by the forward whatever the plan."""
    if node.op == "placeholder" or node in classes.fwd_outputs:
        return True
    if not oplib.is_fusible(node):
        return True
    return any(not oplib.fusible_pair(node, u) for u in _consumers(node))


def mincut_problem(joint: fx.GraphModule, classes: NodeClasses, lean: bool = False
                   ) -> tuple[mincut.MinCutProblem, dict[str, str]]:
    """The min-cut problem of the joint graph and why each banned node is banned.
    ``lean``: the problem whose cut saves the fewest bytes (``LEAN_BYTE_PENALTY``),
    recomputing in the backward the cheap ops the traffic-optimal cut saves because the
    backward would write them anyway (a GELU, a layer norm feeding a matmul)."""
    nodes = [n for n in joint.graph.nodes if n.op != "output"]
    banned: dict[str, str] = {}
    weight: dict[str, float] = {}
    unsaveable: set[str] = set()
    must_recompute: set[str] = set()
    materialized: set[str] = set()
    input_names = {n.name for n in classes.inputs}
    for node in nodes:
        if node not in classes.forward:
            continue
        reason = None if node.op in ("placeholder", "get_attr") else ban_reason(node, classes, lean)
        if reason:
            banned[node.name] = reason
        if node.op == "get_attr" or is_multi_output(node):
            unsaveable.add(node.name)  # constants are in both graphs; tuples are saved item by item
        elif is_alias(node) and storage_of(node) not in input_names:
            # Save the base, not the view (nor an item of a view op's tuple: q, k, v of a
            # ``split``): two saved tensors sharing a storage would let Inductor's backward
            # reuse (donate) one buffer while the other still reads it.
            unsaveable.add(node.name)
        elif not is_tensor_node(node) and not _compat.is_sym_node(node):
            unsaveable.add(node.name)
        if _compat.is_must_recompute(node) and not reason:
            must_recompute.add(node.name)
        if is_materialized(node, classes):
            materialized.add(node.name)
        size = max(node_bytes(node), 1)  # symints weigh a byte: cheap to save, never free
        weight[node.name] = size * (1 + REWEIGHT * min(classes.distance_to_backward[node], REWEIGHT_MAX_DISTANCE))
    problem = mincut.MinCutProblem(
        nodes=[n.name for n in nodes],
        edges=[(a.name, n.name) for n in nodes for a in n.all_input_nodes],
        forward={n.name for n in classes.forward},
        inputs={n.name for n in classes.inputs},
        weight=weight,
        materialized=materialized,
        banned=set(banned),
        must_recompute=must_recompute,
        unsaveable=unsaveable,
        byte_penalty=LEAN_BYTE_PENALTY if lean else 0.0,
    )
    return problem, banned


def differentiable_inputs(joint: fx.GraphModule, classes: NodeClasses) -> set[fx.Node] | None:
    """The primals that get a gradient (the joint's gradient outputs are one per primal,
    None where there is none); None if that correspondence does not hold."""
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and _compat.is_primal(n)]
    grads = classes.bwd_outputs
    if len(grads) != len(primals):
        return None
    return {p for p, g in zip(primals, grads) if g is not None}


def graph_device(joint: fx.GraphModule) -> str:
    """"cuda" if any input of the joint graph lives on a CUDA device, else "cpu"."""
    for n in joint.graph.find_nodes(op="placeholder"):
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return "cuda"
    return "cpu"
