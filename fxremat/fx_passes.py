"""Small passes over the partitioned graphs, each ``GraphModule -> GraphModule`` (or
marking its nodes) and doing one thing."""

from __future__ import annotations

import torch
import torch.fx as fx

from . import _compat, lite, oplib
from .passes.memory import Timeline
from .timeline import Inlining, folded_mm, inputs_relaid_if_returned, products_kept_apart, written_at_reader
from .workspace import library_call


def place_recomputations(bwd: fx.GraphModule, forward_names: set[str]) -> fx.GraphModule:
    """Move each node the backward recomputes to just before its first user, so a
    recomputed value is alive only while it is needed (and Inductor, which keeps
    the order it is given, frees it as early). Linear in the graph's size."""
    graph = bwd.graph
    deferred = {n for n in graph.nodes if n.op == "call_function" and n.name in forward_names and n.users}
    position = {n: i for i, n in enumerate(graph.nodes)}
    order: list[fx.Node] = []
    emitted: set[fx.Node] = set()
    for node in graph.nodes:
        if node in deferred:
            continue
        # Emit the deferred producers this node needs, depth first, then the node.
        # Sibling chains go latest-first: on the GPT demo this keeps fewer recomputed
        # values alive at once than original order (predicted peak 12.7 vs 13.7 MiB).
        stack = [(node, False)]
        while stack:
            current, inputs_done = stack.pop()
            if current in emitted:
                continue
            if inputs_done:
                emitted.add(current)
                order.append(current)
                continue
            stack.append((current, True))
            pending = sorted((a for a in current.all_input_nodes if a not in emitted), key=position.__getitem__)
            stack.extend((a, False) for a in pending)
    if isinstance(graph, lite.Graph):
        graph.reorder(order)
    else:
        for before, after in zip(order, order[1:]):
            before.append(after)
    graph.lint()
    bwd.recompile()
    return bwd


def mark_recomputation_windows(bwd: fx.GraphModule, forward_names: set[str]) -> fx.GraphModule:
    """Number the backward's windows, each a run of recomputed nodes and the backward
    ops after it up to the next such run, on every node (``_compat.SEGMENT_KEY``):
    Inductor then fuses only within a window (``_compat.install_segment_fusion_guard``),
    so a recomputed matmul's softmax is not fused into, and run at, an earlier kernel."""
    window, recomputing = 0, False
    for node in bwd.graph.nodes:
        if node.op != "call_function":
            continue
        recomputed = node.name in forward_names
        if recomputed and not recomputing:
            window += 1
        recomputing = recomputed
        node.meta[_compat.SEGMENT_KEY] = window
    return bwd


def mark_call_windows(gm: fx.GraphModule) -> fx.GraphModule:
    """Number, on every node (``_compat.CALL_WINDOW_KEY``), the library calls (matmuls,
    convolutions, attention, Inductor's ATen fallbacks) up to it: Inductor then fuses
    kernels that read nothing from each other only between the same two calls
    (``_compat.install_segment_fusion_guard``), so each kernel runs where the timeline puts it.
    A value Inductor writes only when it lowers a library reader (``timeline.written_at_reader``,
    ``Inlining.written_at_call``) is numbered as that reader's inputs are: a Hugging Face
    T5's recomputed layer norm, read by a weight gradient's matmul far down the backward,
    was fused with the kernels of the same norm's other readers there, sharing their reads,
    and held across the attention's backward (measured 2.9% over the prediction)."""
    window = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        window += library_call(node)
        node.meta[_compat.CALL_WINDOW_KEY] = window
    inlining = Inlining()
    for node in gm.graph.nodes:
        reader = written_at_reader(node) or inlining.written_at_call(node)
        if reader is not None:
            node.meta[_compat.CALL_WINDOW_KEY] = reader.meta[_compat.CALL_WINDOW_KEY] - 1
    return gm


def mark_predicted_levels(fwd: fx.GraphModule, bwd: fx.GraphModule, timeline: Timeline) -> None:
    """Put on each node of the graphs that run the predicted live bytes while it runs
    and the predicted peak (``_compat.LIVE_BYTES_KEY``): the bound within which
    Inductor may hold a dead buffer for reuse (``_compat.install_planned_reuse_bound``)."""
    level = {(step.phase, step.name): live for step, live in zip(timeline.steps, timeline.live_bytes)}
    for phase, gm in (("forward", fwd), ("backward", bwd)):
        for node in gm.graph.nodes:
            live = level.get((phase, node.name))
            if live is not None:
                node.meta[_compat.LIVE_BYTES_KEY] = (live, timeline.peak_bytes)


def keep_products_apart(gm: fx.GraphModule) -> fx.GraphModule:
    """Each add of ``timeline.products_kept_apart`` (``c + mm(a, b)``, which Inductor would
    compute as ``addmm`` at the add, holding ``a`` and ``b`` until then) rewritten as
    ``c - (-1) * mm(a, b)``: Inductor's pattern matches ``aten.add`` only, so the product
    is written where it is computed and its inputs are freed after their last other
    reader. Exact: negation and subtracting a negation round as the add does. In place,
    on torch.fx and light graphs alike (the predictions are made after it)."""
    kept_apart = products_kept_apart(gm)
    for add in kept_apart:
        mm = folded_mm(add)
        other = add.args[1] if add.args[0] is mm else add.args[0]
        add.target = torch.ops.aten.sub.Tensor
        add.args = (other, mm)
        add.kwargs = {"alpha": -1}
    if kept_apart and not lite.is_light(gm):
        gm.recompile()
    return gm


def return_inputs_as_given(fwd: fx.GraphModule) -> fx.GraphModule:
    """Each forward input that a convolution reads, that Inductor would copy channels-last,
    and that the forward returns (saved for the backward), returned through two identity
    permutes; a weight only where its convolutions read graph inputs (``_handed_on``).

    Inductor's layout optimization lays out an input it returns channels-last where the input
    is defined, and returns that copy: the copy is held from the forward to the end of the
    step (a ViT's image, 0.39 MB of its 7.9 MB least-memory plan, and its patch weight, 0.1 MB).
    Returned through a view of a view, the input is handed on as it is
    (``GraphLowering.find_nodes_prefer_channels_last`` marks a convolution input's readers,
    not theirs, and stops at the last convolution; one view is marked, and ``aten.alias`` is
    removed as a no-op): each convolution then copies it for itself while it runs, the
    backward's too (``timeline``). In place, on torch.fx and light graphs alike."""
    if not _compat.inductor_hands_on_a_view_of_a_view():
        return fwd
    graph = fwd.graph
    output = next(iter(graph.find_nodes(op="output")))
    returned = list(output.args[0])
    relaid = inputs_relaid_if_returned(fwd)
    handed_on = [i for i, a in enumerate(returned) if isinstance(a, lite.NODES) and a.name in relaid and _handed_on(a)]
    if not handed_on:
        return fwd
    light = isinstance(graph, lite.Graph)
    for i in handed_on:
        view = a = returned[i]
        for _ in range(2):
            args = (view, list(range(a.meta["val"].dim())))
            if light:
                view = graph.call_before_output(_PERMUTE, args, {"val": a.meta["val"]})
            else:
                with graph.inserting_before(output):
                    view = graph.call_function(_PERMUTE, args)
                view.meta["val"] = a.meta["val"]
        returned[i] = view
    if light:
        graph.set_output(tuple(returned))
    else:
        output.args = (tuple(returned),)
        graph.lint()
        fwd.recompile()
    return fwd


_PERMUTE = torch.ops.aten.permute.default
_CONVOLUTION = torch.ops.aten.convolution.default


def _handed_on(node: fx.Node) -> bool:
    """Is a returned input that Inductor would lay out channels-last handed on as given? A
    convolution's input is, and so is the weight of convolutions that each read a graph input
    (a stem, a patch embedding: each copies its input for itself anyway). Other weights are not:
    inside a network a weight that arrives in the backward as given changes the layouts Inductor
    gives the activations around its convolutions there, and it writes some twice (measured
    with every weight handed on: a U-Net at 0.5, whose convolution backwards then take their
    operands in the weight's layout, 3.1 MB over its prediction; ResNet-50's least plan, a
    recomputed activation written both contiguous and channels-last, 2.1 MB over)."""
    convs = [u for u in node.users if u.op == "call_function" and u.target is _CONVOLUTION and u.args[1] is node]
    return all(isinstance(c.args[0], lite.NODES) and c.args[0].op == "placeholder" for c in convs)
