"""A sequence of stage operations (Rotor's, or a DAG solver's mapped to them) emitted
as the backward graph: recomputed stages are duplicated where the sequence recomputes
them, each ``B^s`` is the stage's part of the min-cut backward, in the sequence's
order, so liveness frees what it frees (``emit_backward``); and what that backward
reads of the forward (``backward_reads``), which the forward must save."""

from __future__ import annotations

import torch.fx as fx

from . import _compat, lite
from .aliasing import is_alias
from .chain import Linearization, needed_ops
from .joint import recomputed_entry
from .passes import rotor


def _made_where_read(node: fx.Node, free: set[fx.Node]) -> bool:
    """Free values and aliases of available values (views, the items of a ``split``) are
    made where a backward op needs them; anything else must be in the backward already (or
    saved by the forward, which saves storages, not aliases)."""
    return node.op != "placeholder" and (node in free or is_alias(node))


def _operations(lin: Linearization, sequence: list[rotor.Op]):
    """(index, joint nodes to emit) for each operation from the sequence's first ``B``: a
    ``B^s`` emits the stage's backward, an ``F^s`` what it keeps (``a^s``, and the saved
    set for ``F_all``). The loss stage has no ops."""
    first_b = next(i for i, op in enumerate(sequence) if op.kind == rotor.B)
    for index, op in enumerate(sequence[first_b:]):
        if op.stage > len(lin.stages):
            yield index, []
            continue
        stage = lin.stages[op.stage - 1]
        if op.kind == rotor.B:
            yield index, stage.backward
        else:
            yield index, needed_ops(stage, stage.boundary + (stage.saved if op.kind == rotor.F_ALL else []))


class _Emitter:
    """Writes joint-graph ops into a new graph, each value's latest copy in ``env``.

    ``only``: emit just these (operation index, node) copies (the ones a first,
    scratch pass found alive); None emits all. ``scratch``: a missing input becomes a
    stand-in placeholder, so a first pass can find out what is really read."""

    def __init__(self, graph: fx.Graph, env: dict[fx.Node, fx.Node], free: set[fx.Node], forward: set[fx.Node],
                 only: set[tuple[int, str]] | None = None, scratch: bool = False):
        self.graph, self.env, self.free, self.forward = graph, env, free, forward
        self.only, self.scratch = only, scratch
        self.recomputed: list[fx.Node] = []  # copies of forward ops
        self.copies: dict[fx.Node, tuple[int, str]] = {}  # copy -> (operation index, joint node)
        self.stand_ins: list[fx.Node] = []
        self.stand_in_of: dict[fx.Node, fx.Node] = {}  # stand-in -> the joint node it stands for
        self.op_index = -1
        # a joint node's inputs: found once for all light copies (``lite.Facts``)
        self.inputs = graph.facts.inputs if isinstance(graph, lite.Graph) else (lambda n: n.all_input_nodes)

    def value(self, node: fx.Node) -> fx.Node:
        if node not in self.env:
            if self.scratch and not _made_where_read(node, self.free):
                self.env[node] = self.graph.placeholder(f"missing_{node.name}")
                self.stand_ins.append(self.env[node])
                self.stand_in_of[self.env[node]] = node
                return self.env[node]
            if not _made_where_read(node, self.free):
                raise KeyError(f"fxremat rotor: {node.name} is not available in the backward")
            self.emit(node, on_demand=True)
        return self.env[node]

    def emit(self, node: fx.Node, on_demand: bool = False) -> None:
        key = (self.op_index, node.name)
        # A value made on demand is read by the op asking for it, which is alive: the
        # first pass may have made it for another reader, under another key.
        if self.only is not None and key not in self.only and not on_demand:
            return
        for a in self.inputs(node):
            self.value(a)
        copy = self.graph.node_copy(node, lambda a: self.env[a])
        # Which operation of the sequence made it: Inductor must not fuse across these
        # (``_compat.install_segment_fusion_guard``). Light copies share their source's
        # meta and are never compiled.
        if not isinstance(copy, lite.Node):
            copy.meta[_compat.SEGMENT_KEY] = self.op_index
        self.env[node] = copy
        self.copies[copy] = key
        if node in self.forward:
            self.recomputed.append(copy)


def backward_reads(joint: fx.GraphModule, lin: Linearization, sequence: list[rotor.Op],
                   gradients: list[fx.Node], impure=None, inputs=None) -> tuple[set[fx.Node], set[tuple[int, str]]]:
    """What the backward of ``sequence`` reads that it does not compute (the values the
    forward must save, the tangents) and which (operation, node) copies it keeps
    alive: what a scratch emission (``_emit`` with stand-ins for what is missing) would
    give, found before any graph is extracted, so the forward saves exactly what is read.
    ``impure``, ``inputs``: ``lite.Facts.impure`` and ``inputs``, the joint nodes' purity and
    inputs found once (else asked of each)."""
    # The scratch emission's outcome without building its graph: which copies the dead
    # code elimination keeps (those the outputs or an impure op need) and which missing
    # inputs they read. Building it cost a third of a plan's search (the 12-layer
    # transformer: 70k node copies); tests/test_rotor_plans.py checks both agree.
    by_name = {n.name: n for n in joint.graph.nodes}
    env: dict[fx.Node, int] = {}  # joint node -> its latest copy
    copy_inputs: list[list[int]] = []  # copy -> the copies or stand-ins it reads
    copy_key: list[tuple[int, str] | None] = []  # (operation index, node name); None: a stand-in
    stand_in_of: dict[int, fx.Node] = {}
    roots: list[int] = []  # impure copies, which FX's dead code elimination keeps

    def value(node: fx.Node) -> int:
        if node not in env:
            if not _made_where_read(node, lin.free):
                env[node] = len(copy_key)
                copy_key.append(None)
                copy_inputs.append([])
                stand_in_of[env[node]] = node
                return env[node]
            emit(node)
        return env[node]

    def emit(node: fx.Node) -> None:
        read = [value(a) for a in (inputs(node) if inputs else node.all_input_nodes)]
        env[node] = len(copy_key)
        copy_key.append((op_index, node.name))
        copy_inputs.append(read)
        if node.op == "call_function" and (impure(node) if impure else _compat.survives_dead_code_elimination(node)):
            roots.append(env[node])

    for op_index, nodes in _operations(lin, sequence):
        for n in nodes:
            emit(n)
    op_index = len(sequence)
    roots += [value(by_name[a.name]) for a in gradients if isinstance(a, fx.Node)]
    live, stack = set(), list(roots)
    while stack:
        c = stack.pop()
        if c not in live:
            live.add(c)
            stack.extend(copy_inputs[c])
    alive = {copy_key[c] for c in live if copy_key[c] is not None}
    reads = {stand_in_of[c] for c in live if c in stand_in_of}
    return reads, alive


def emit_backward(template: fx.GraphModule, joint: fx.GraphModule, lin: Linearization,
                  sequence: list[rotor.Op], outputs: list, alive: set[tuple[int, str]] | None = None
                  ) -> tuple[fx.GraphModule, list[dict], set[str]]:
    """A new backward graph: ``template``'s inputs (AOTAutograd's calling convention, from
    torch's extractor) and the joint's backward ``outputs`` (nodes and Nones, in order), with
    the body the Rotor sequence dictates; the forward ops it computes again (name, op); and
    the inputs it reads. ``alive``: from ``backward_reads`` (else found here by a scratch
    emission)."""
    if alive is None:
        scratch, emitter = _emit(template, joint, lin, sequence, None, gradients=outputs)
        alive = {emitter.copies[n] for n in scratch.nodes if n in emitter.copies}
        if any(n.users for n in emitter.stand_ins):
            missing = sorted(n.name for n in emitter.stand_ins if n.users)
            raise KeyError(f"fxremat rotor: the backward reads {missing}, which the forward does not save")
    graph, emitter = _emit(template, joint, lin, sequence, alive, gradients=outputs)
    recomputed = [recomputed_entry(n, emitter.copies[n][1]) for n in emitter.recomputed if n.op == "call_function"]
    reads = {n.name for n in graph.find_nodes(op="placeholder") if n.users}
    module = lite.GraphModule(graph) if lite.is_light(template) else _compat.make_graph_module(template, graph)
    return module, recomputed, reads


def _emit(template, joint, lin, sequence, only, gradients):
    """A backward graph with ``template``'s inputs and ``gradients`` (joint nodes, or None)
    as its outputs; ``template`` None: a scratch emission whose every input is a stand-in."""
    by_name = {n.name: n for n in joint.graph.nodes}
    light = template is not None and lite.is_light(template)
    graph = lite.Graph(template.graph.facts) if light else fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in template.graph.find_nodes(op="placeholder") if template is not None else ():
        env[by_name[node.name]] = graph.node_copy(node)
    forward_ops = {n for st in lin.stages for n in st.forward} | lin.free
    emitter = _Emitter(graph, env, lin.free, forward_ops, only=only, scratch=only is None)
    for index, nodes in _operations(lin, sequence):
        emitter.op_index = index
        for n in nodes:
            emitter.emit(n)
    emitter.op_index = len(sequence)
    outputs = [emitter.value(by_name[a.name]) if isinstance(a, fx.Node) else a for a in gradients]
    graph.output(tuple(outputs))
    graph.eliminate_dead_code()
    if only is not None:
        graph.lint()
    return graph, emitter
