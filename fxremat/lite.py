"""Light graphs for scoring candidates: what the timeline, the emitter and the placement
pass read of an FX graph (nodes in order, their op, target, arguments, users and meta),
without FX's bookkeeping (name spaces, argument trees, code generation).

Planning probes many saved sets and schedules; each probe needs only its predicted peak.
Building its forward and backward as ``torch.fx`` graphs (torch's extractor, node copies)
was most of the planning time on large graphs (issue #21: 16-layer transformer, 52
extractions, 163k node copies). Probes are built here instead, with the same algorithm
(``extract`` follows torch's ``_extract_fwd_bwd_modules``), and the FX graphs of the
plan chosen only; ``strategies`` check that the chosen plan's FX graphs predict the
same peak as its light ones (``Candidate.realize``).

A light node's ``source`` is the joint-graph node it copies: purity (``is_impure``) is the
source's, since copies differ only in which nodes they read.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from . import _compat, memo


class Node:  # NODES below: what the planner's isinstance checks accept
    """A node of a light ``Graph``: the ``torch.fx.Node`` attributes the planner reads."""

    __slots__ = ("name", "op", "target", "args", "kwargs", "meta", "users", "all_input_nodes", "source", "graph")

    def __init__(self, graph: Graph, name: str, op: str, target: Any, args: tuple, kwargs: dict,
                 meta: dict, source: fx.Node | None, inputs: list[Node] | None = None) -> None:
        self.graph, self.name, self.op, self.target = graph, name, op, target
        self.args, self.kwargs, self.meta, self.source = args, kwargs, meta, source
        self.users: dict[Node, None] = {}
        if inputs is None:
            found: dict[Node, None] = {}
            _collect(args, found)
            _collect(kwargs, found)
            inputs = list(found)
        self.all_input_nodes = inputs
        for a in inputs:
            a.users[self] = None

    def is_impure(self, impure_random: bool = True) -> bool:
        if self.op in ("placeholder", "output"):
            return True
        if self.source is None:
            return False
        return self.graph.facts.impure(self.source)

    def __repr__(self) -> str:
        return self.name


NODES = (fx.Node, Node)  # a node of a torch.fx graph or of a light one


def _collect(a: Any, found: dict, kinds: Any = Node) -> None:
    if isinstance(a, kinds):
        found[a] = None
    elif isinstance(a, (tuple, list)):
        for x in a:
            _collect(x, found, kinds)
    elif isinstance(a, dict):
        for x in a.values():
            _collect(x, found, kinds)
    elif isinstance(a, slice):
        _collect((a.start, a.stop, a.step), found, kinds)


def map_arg(a: Any, fn: Callable[[fx.Node], Node]) -> Any:
    """``fx.node.map_arg`` for the argument trees aten ops take."""
    if isinstance(a, NODES):
        return fn(a)
    if isinstance(a, tuple):
        return tuple(map_arg(x, fn) for x in a)
    if isinstance(a, list):
        return [map_arg(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: map_arg(v, fn) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(map_arg(a.start, fn), map_arg(a.stop, fn), map_arg(a.step, fn))
    return a


class Facts:
    """What light copies reuse of the joint graph's nodes, each found once: purity (a
    copy's is its source's: copies differ only in which nodes they read), inputs, and
    which of its arguments hold nodes. One per joint graph (``Context.facts``)."""

    def __init__(self) -> None:
        self._impure: dict[tuple[fx.Node, bool], bool] = {}
        self._inputs: dict[fx.Node, list[fx.Node]] = {}
        # node -> (positions of node arguments, None if all; of trees holding nodes; kwargs hold nodes)
        self._slots: dict[fx.Node, tuple[tuple[int, ...] | None, tuple[int, ...], bool]] = {}

    def impure(self, node: fx.Node) -> bool:
        """Whether FX's dead code elimination keeps ``node`` unread (``_compat``'s rule)."""
        # Keyed by the rule too: it depends on whether Dynamo is tracing (asked once a plan).
        key = (node, memo.per_planning("dead code elimination keeps random",
                                       _compat.dead_code_elimination_keeps_random))
        if key not in self._impure:
            self._impure[key] = node.op == "call_function" and _compat.survives_dead_code_elimination(node, key[1])
        return self._impure[key]

    def inputs(self, node: fx.Node) -> list[fx.Node]:
        """``node.all_input_nodes`` (a property FX computes on every read)."""
        if isinstance(node, Node):
            return node.all_input_nodes
        if node not in self._inputs:
            self._inputs[node] = node.all_input_nodes
        return self._inputs[node]

    def copy_args(self, node: fx.Node, fn: Callable[[fx.Node], Node]) -> tuple[tuple, dict]:
        """``node``'s arguments and keyword arguments with each node ``a`` replaced by ``fn(a)``."""
        if isinstance(node, Node):
            return map_arg(node.args, fn), map_arg(node.kwargs, fn)
        slots = self._slots.get(node)
        if slots is None:
            kinds = [1 if isinstance(a, NODES) else 2 if _holds_node(a) else 0 for a in node.args]
            # (None: every argument a node, the common case, mapped in one call)
            nodes = None if all(k == 1 for k in kinds) else tuple(i for i, k in enumerate(kinds) if k == 1)
            slots = self._slots[node] = (nodes, tuple(i for i, k in enumerate(kinds) if k == 2),
                                         _holds_node(node.kwargs))
        nodes, trees, kwargs_hold = slots
        if nodes is None:
            args = tuple(map(fn, node.args))
        else:
            mapped = list(node.args)
            for i in nodes:
                mapped[i] = fn(mapped[i])
            for i in trees:
                mapped[i] = map_arg(mapped[i], fn)
            args = tuple(mapped)
        return args, (map_arg(node.kwargs, fn) if kwargs_hold else node.kwargs)


def _holds_node(a: Any) -> bool:
    found: dict = {}
    _collect(a, found, NODES)
    return bool(found)


class Graph:
    """A light ``torch.fx.Graph``: a list of nodes, unique names, dead code elimination."""

    def __init__(self, facts: Facts | None = None) -> None:
        self.nodes: list[Node] = []
        self._names: set[str] = set()
        self.facts = facts or Facts()

    def _name(self, candidate: str) -> str:
        name, k = candidate, 0
        while name in self._names:  # unique, as FX's are (its numbering differs: names are only keys here)
            k += 1
            name = f"{candidate}_{k}"
        self._names.add(name)
        return name

    def _add(self, name: str, op: str, target: Any, args: tuple, kwargs: dict, meta: dict,
             source: fx.Node | None, inputs: list[Node] | None = None) -> Node:
        node = Node(self, self._name(name), op, target, args, kwargs, meta, source, inputs)
        self.nodes.append(node)
        return node

    def placeholder(self, name: str) -> Node:
        return self._add(name, "placeholder", name, (), {}, {}, None)

    def node_copy(self, node: fx.Node, arg_transform: Callable[[fx.Node], Node] = lambda a: a) -> Node:
        """A copy of the joint-graph ``node`` whose arguments are ``arg_transform`` of its
        arguments (``torch.fx.Graph.node_copy``). The meta dictionary is shared, not copied
        as FX does: light graphs are read, never marked (a copy per node was a third of a
        16-layer transformer's planning memory)."""
        # The copy reads the copies of what ``node`` reads, in the same order (FX's order:
        # first appearance in the arguments), each distinct node to a distinct copy.
        inputs = list(dict.fromkeys(map(arg_transform, self.facts.inputs(node))))
        args, kwargs = self.facts.copy_args(node, arg_transform)
        return self._add(node.name, node.op, node.target, args, kwargs, node.meta,
                         getattr(node, "source", None) or node, inputs)

    def output(self, result: Any) -> Node:
        return self._add("output", "output", "output", (result,), {}, {}, None)

    def call_before_output(self, target: Any, args: tuple, meta: dict) -> Node:
        """A new ``call_function`` node of ``target`` just before the output node (which
        it does not change): ``torch.fx.Graph.call_function`` under ``inserting_before``."""
        output = self.nodes.pop()
        assert output.op == "output", "fxremat bug: a light graph ends with its output"
        node = self._add(getattr(target, "__name__", "call").split(".")[0], "call_function", target, args, {}, meta, None)
        self.nodes.append(output)
        return node

    def set_output(self, result: Any) -> None:
        """Replace what the output node returns (its readers' links follow)."""
        output = self.nodes[-1]
        for a in output.all_input_nodes:
            a.users.pop(output, None)
        found: dict[Node, None] = {}
        _collect(result, found)
        output.args, output.all_input_nodes = (result,), list(found)
        for a in output.all_input_nodes:
            a.users[output] = None

    def find_nodes(self, *, op: str, target: Any = None) -> list[Node]:
        return [n for n in self.nodes if n.op == op and (target is None or n.target is target)]

    def eliminate_dead_code(self) -> None:
        """``torch.fx.Graph.eliminate_dead_code``: unread pure nodes removed, last first."""
        kept: list[Node] = []
        for node in reversed(self.nodes):
            if not node.users and not node.is_impure():
                for a in node.all_input_nodes:
                    a.users.pop(node, None)
                self._names.discard(node.name)
                continue
            kept.append(node)
        kept.reverse()
        self.nodes = kept

    def remove_unread(self, inputs: set[Node]) -> None:
        """Remove the placeholders ``inputs`` and what reads them (extracting the graph
        again without them would not compute it)."""
        gone = set(inputs)
        for node in self.nodes:
            if node not in gone and any(a in gone for a in node.all_input_nodes):
                gone.add(node)
        for node in gone:
            for a in node.all_input_nodes:
                a.users.pop(node, None)
            self._names.discard(node.name)
        self.nodes = [n for n in self.nodes if n not in gone]

    def reorder(self, order: list[Node]) -> None:
        """Put the nodes in ``order`` (a permutation of them)."""
        self.nodes = list(order)

    def lint(self) -> None:
        """Nothing to check: nodes are created only from nodes already in the graph."""


class GraphModule:
    """A light ``torch.fx.GraphModule``: a graph, no code."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def recompile(self) -> None:
        """No code to make."""


def is_light(gm: Any) -> bool:
    return isinstance(gm, GraphModule)


_WAIT_TENSOR = getattr(getattr(torch.ops, "_c10d_functional", None), "wait_tensor", None)
_WAIT_TENSOR = getattr(_WAIT_TENSOR, "default", None)


class Unsupported(Exception):
    """A graph the light extractor does not model (torch's extractor rewrites it): build
    it with torch's."""


def extract(joint: fx.GraphModule, saved_values: list[fx.Node], saved_sym_nodes: list[fx.Node], *,
            num_fwd_outputs: int, backward_template: bool = False,
            facts: Facts | None = None) -> tuple[GraphModule, GraphModule]:
    """``_compat.extract_fwd_bwd_modules`` as light graphs: torch's extractor's algorithm
    (``_extract_fwd_bwd_modules``: the backward extracted first, saved values it does not
    read dropped, then the forward returning the outputs and what is saved). Symbol
    bindings for dynamic sizes are not added (they hold no bytes)."""
    facts = facts or Facts()
    graph = joint.graph
    output = next(iter(graph.find_nodes(op="output")))
    outputs = list(output.args[0])
    fwd_outputs, bwd_outputs = outputs[:num_fwd_outputs], outputs[num_fwd_outputs:]
    placeholders = list(graph.find_nodes(op="placeholder"))
    primals = [n for n in placeholders if _compat.is_primal(n)]
    tangents = [n for n in placeholders if _compat.is_tangent(n)]
    fwd_seeds = [n for n in placeholders if _compat.is_fwd_seed_offset(n)]
    bwd_seeds = [n for n in placeholders if _compat.is_bwd_seed_offset(n)]
    saved_values, saved_sym_nodes = list(saved_values), list(saved_sym_nodes)
    saved_names = {n.name for n in saved_values + saved_sym_nodes}
    if backward_template:
        bwd = Graph(facts)
        for node in saved_sym_nodes + saved_values + tangents + bwd_seeds:
            bwd.placeholder(node.name).meta = node.meta
        bwd.output(())
    else:
        bwd = _extract_graph(graph, saved_sym_nodes + saved_values + tangents + bwd_seeds, bwd_outputs,
                             "backward", facts)
        # As torch's: a saved value the backward only waits on (a collective's dead result) is not read.
        unread = {n for n in bwd.find_nodes(op="placeholder") if n.name in saved_names
                  and (not n.users or all(u.target is _WAIT_TENSOR and not u.users for u in n.users))}
        unread_names = {n.name for n in unread}
        saved_values = [n for n in saved_values if n.name not in unread_names]
        saved_sym_nodes = [n for n in saved_sym_nodes if n.name not in unread_names]
        # Torch extracts the backward again from what is left; that is this graph without
        # the unread inputs (and their dead waits).
        bwd.remove_unread(unread)
    fwd = _extract_graph(graph, primals + fwd_seeds, fwd_outputs + saved_values + saved_sym_nodes, "forward", facts)
    return GraphModule(fwd), GraphModule(bwd)


def _extract_graph(joint: fx.Graph, inputs: list[fx.Node], outputs: list, subgraph: str, facts: Facts) -> Graph:
    """Torch's ``_extract_graph_with_inputs_outputs``: every joint node computable from
    ``inputs`` (and allowed in ``subgraph``) copied in order, then the dead code removed."""
    new = Graph(facts)
    env: dict[fx.Node, Node | None] = {}
    for node in inputs:
        placeholder = new.placeholder(node.name)
        placeholder.meta = node.meta
        env[node] = placeholder
    in_backward, in_forward = _compat.must_be_in_backward, _compat.must_be_in_forward
    for node in joint.nodes:
        if node in env:
            continue
        if (subgraph != "backward" and in_backward(node)) or (subgraph != "forward" and in_forward(node)):
            env[node] = None
        elif node.op == "placeholder":
            env[node] = None
        elif node.op == "call_function":
            if any(env[a] is None for a in facts.inputs(node)):
                env[node] = None
                continue
            env[node] = new.node_copy(node, env.__getitem__)
        elif node.op == "get_attr":
            env[node] = new.node_copy(node, env.__getitem__)
    values = []
    for x in outputs:
        if isinstance(x, fx.Node):
            if env.get(x) is None:
                raise Unsupported(f"output {x.name} is not computable in the {subgraph}")
            values.append(env[x])
        else:
            values.append(x)
    new.output(tuple(values))
    new.eliminate_dead_code()
    return new
