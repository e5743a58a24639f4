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

from typing import Any, Callable

import torch
import torch.fx as fx

from . import _compat, oplib
from .aliasing import is_alias, readers, storage_node
from .lite import NODES, map_arg
from .memo import per_meta
from .passes.memory import Step, Timeline, simulate
from .workspace import channels_last_scratch_bytes, convolution_scratch_bytes, library_call, strided_scratch_bytes
from .sizes import (_hint, flat_tensors, held_outputs, is_multi_output, incoming_gradient_held, node_bytes, node_bytes_expr, storage_of,
                    strided_bytes, tensor_bytes, tensor_bytes_expr)

_node_bytes, _tensor_bytes = node_bytes, tensor_bytes  # _graph_steps' names for them, when not symbolic


# Library ops whose inputs Inductor lays out with the strides the graph recorded
# (``GraphLowering.run_node``'s ``need_fixed_layout``).
_FIXED_LAYOUT = frozenset({torch.ops.aten.mm.default, torch.ops.aten._int_mm.default,
                           torch.ops.aten.convolution_backward.default})
_RESHAPES = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
                       torch.ops.aten.reshape.default, torch.ops.aten.alias.default})


def _copied_view(view: fx.Node) -> bool:
    """Would Inductor copy this view into a buffer of its own, should its base be inlined?

    Lowering a view with several readers, one of them a library op that needs a fixed
    layout (``mm``), Inductor first hints its base to be written, which it does only when
    the base's inlined body loads more than one tensor with more than one element
    (``StorageBox.realize_hint``), then fixes the view's strides: a view of a value not
    written is copied (``require_stride_order``), and its readers read the copy while the
    base stays inlined in its own readers (checked on torch 2.13: ``v = (a * t).view(-1, d)``
    read by ``v @ w``, ``v.t() @ b`` and ``v.sum(0)``, with ``t`` a 0-d tensor, copies ``v``
    and recomputes ``a * t`` in its other reader; with ``t`` a tensor like ``a``, or with
    ``v`` read by the ``mm`` alone, ``a * t`` is written once). A reshape to the same shape
    is no view to Inductor."""
    if view.op != "call_function" or not oplib.is_view(view) or oplib.is_getitem(view):
        return False
    base = view.args[0] if view.args and isinstance(view.args[0], NODES) else None
    if base is None or len(view.users) < 2 or not any(u.target in _FIXED_LAYOUT for u in view.users):
        return False
    if view.target in _RESHAPES:
        a, b = base.meta.get("val"), view.meta.get("val")
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and tuple(a.shape) == tuple(b.shape):
            return False
    return True


def _inlinable(node: fx.Node, memo: Inlining) -> bool:
    """Could Inductor compute this value inside its readers' kernels? A pointwise value
    (not a reduction, view or multi-output op) all of whose readers are fusible with it
    and in the same graph (graph outputs and inputs of library kernels are written), or
    read it through a view Inductor may copy for them (``_copied_view``). ``memo``: the
    ``Inlining`` whose per-node answers are reused."""
    if node.op != "call_function" or (oplib.is_reduction(node) and _unrolled_elements(node) <= 1):
        return False
    if is_multi_output(node) or oplib.is_getitem(node):
        # A tuple Inductor lowers item by item (a max-pool's values and offsets,
        # ``oplib.lowered_item_by_item``) is no buffer of its own: each item is a pointwise
        # value that is inlined or written as any other. Any other tuple is written whole.
        tuple_op = node if is_multi_output(node) else node.args[0]
        if not (isinstance(tuple_op, NODES) and oplib.lowered_item_by_item(tuple_op)):
            return False
        if is_multi_output(node):
            return True
    if not _pointwise_kernel_body(node, memo):
        return False
    readers = memo.readers(node)
    return len(readers) > 0 and all(r.op == "call_function"
                                    and (memo.fusible(r) or oplib.loads_lazily(r, node) or memo.copied_view(r)
                                         or oplib.copies_unwritten_inputs(r))
                                    for r in readers)


def _pointwise_kernel_body(node: fx.Node, memo: Inlining) -> bool:
    """Is ``node`` a value Inductor may compute inside another kernel, its readers aside?"""
    if not memo.fusible(node) or oplib.is_view(node):
        return False
    if folded_mm(node) is not None:
        return False  # computed as addmm, a library call
    if node.target is _CAT and _compat.inductor_writes_every_cat(_device_type(node)):
        return False  # a concatenation kernel of its own, its inputs computed into its slices
    # Inductor's ``as_strided`` writes the storage it reinterprets
    return not _read_as_strided(node)


_NO_EXTRA = (0, 0)  # loads and ops a body counts beyond its distinct buffers and ops (unrolled reductions)


def _unrolled_elements(node: fx.Node) -> int:
    """How many elements a reduction Inductor unrolls into a pointwise sum reduces over, else 0:
    a single-output reduction over fewer than ``unroll_reductions_threshold`` (8) elements whose
    result has more than one element (on CPU; ``Reduction.create``). A group norm's backward
    sums over each group's channels so, and the values built on those sums load the per-channel
    sums once per channel: Inductor counts those reads (``num_reads``) and writes such a value
    at its reuse where distinct buffers alone would not pass its limit (a small group-norm
    model's ``mul_19``: 11 reads, 4 buffers)."""
    if node.op != "call_function" or not oplib.is_reduction(node) or is_multi_output(node):
        return 0
    val = node.meta.get("val")
    inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    if not isinstance(val, torch.Tensor) or not inputs:
        return 0
    out, inp = _hint(val.numel()), _hint(inputs[0].meta["val"].numel())
    if out <= 1 or out == 0 or inp % out:
        return 0
    elements = inp // out
    from torch._inductor import config as inductor_config

    return elements if elements < inductor_config.unroll_reductions_threshold else 0


def _read_as_strided(node: fx.Node) -> bool:
    """Is ``node`` read through an ``as_strided`` (directly or through other views)? Inductor
    lowers ``as_strided`` as a reinterpretation of a storage: it writes the value under the
    views first (``x.realize()`` in its lowering), whatever its readers. A group norm's
    decomposition reads its per-sample, per-channel scale and shift so: Inductor writes those
    small values and inlines the normalized output into its readers, which then load three
    buffers, not five (the U-Net's GroupNorm + SiLU, measured 2 MiB over a prediction that
    had the scale and shift inlined and the output written)."""
    stack = list(node.users)
    while stack:
        user = stack.pop()
        if user.op != "call_function":
            continue
        if user.target is _AS_STRIDED:
            return True
        if oplib.is_view(user) and not oplib.is_getitem(user):
            stack.extend(user.users)
    return False


# The ops each aten op's Inductor body uses that Inductor may call heavy on CPU
# (``StorageBox.should_realize_on_reuse``: a value using one is written once when several
# ops read it rather than recomputed in each; which ones, ``_compat.inductor_heavy_ops_on_cpu``).
_USES_ON_CPU = {"exp": {"exp"}, "exp2": {"exp2"}, "log": {"log"}, "log10": {"log10"}, "log1p": {"log1p"},
                "log2": {"log2"}, "sigmoid": {"sigmoid"}, "tanh": {"tanh"}, "silu": {"sigmoid"},
                "softplus": {"exp", "log1p"}, "mish": {"exp", "log1p", "tanh"}, "logit": {"log"}}


class Inlining:
    """Inductor's store-or-inline choice for the values of one graph (memoized).

    Inductor inlines a pointwise value into every kernel that reads it, so it is never
    written to memory and its readers load its inputs instead, unless (its own rule,
    ``_compat.inductor_realize_thresholds``) it has several readers and its inlined body
    loads more than 4 buffers, has many ops or, on CPU, a heavy op (exp, tanh, ...); or
    loads more than 12 buffers (8 on GPU) or has more ops than Inductor's limit, whatever its
    readers, and loads two buffers (ops counted as Inductor counts them: ``counts``). An inlined value keeps
    what it loads alive until its last reader: a batch norm backward's ``where`` (ReLU
    mask of the incoming gradient) is recomputed in both kernels that read it, holding
    the ReLU output and the gradient, where writing it once would hold one buffer
    (measured on the deep CNN's Rotor plans: one activation over the prediction at every
    small budget, when every value with several readers was taken as written). A view of an
    inlined value that a matmul reads is copied to a buffer of its own (``_copied_view``,
    ``copied``)."""

    def __init__(self) -> None:
        # node -> (fused away, names of the buffers its body loads, names of the ops inlined,
        # heavy, names of the loaded buffers with more than one element)
        self._info: dict[fx.Node, tuple[bool, frozenset[str], frozenset[str], bool, frozenset[str]]] = {}
        self._limits: dict[str, dict[str, int]] = {}
        self._inlinable: dict[fx.Node, bool] = {}
        self._copies: set[fx.Node] = set()  # views written as copies of an inlined base
        # Per-node answers the decisions ask many times (a value's, then each reader's).
        self._fusible: dict[fx.Node, bool] = {}
        self._copied_view: dict[fx.Node, bool] = {}
        self._readers: dict[fx.Node, list[fx.Node]] = {}
        self._loop_reuse_apart = _compat.inductor_tells_loop_reuse_apart()
        self._written_at_call: dict[fx.Node, fx.Node | None] = {}
        self._positions: dict[fx.Node, int] | None = None
        # Is this value a buffer laid out channels-last where Inductor lowers a reader (set by
        # the timeline, which knows the graph's layouts; None: not known, and a max-pool
        # backward of Inductor's own is taken as written, ``_realized``)
        self.channels_last_buffer: Callable[[fx.Node], bool] | None = None
        self._op_weights: dict[str, int] = {}  # inlined op name -> its ops to Inductor

    def fusible(self, node: fx.Node) -> bool:
        """``oplib.is_inductor_pointwise``, memoized."""
        found = self._fusible.get(node)
        if found is None:
            found = self._fusible[node] = oplib.is_inductor_pointwise(node)
        return found

    def copied_view(self, node: fx.Node) -> bool:
        """``_copied_view``, memoized."""
        found = self._copied_view.get(node)
        if found is None:
            found = self._copied_view[node] = _copied_view(node)
        return found

    def readers(self, node: fx.Node) -> list[fx.Node]:
        """``aliasing.readers``, not through the views Inductor would copy (``_copied_view``):
        those read ``node`` as one more pointwise reader. Memoized."""
        found = self._readers.get(node)
        if found is None:
            found = self._readers[node] = readers(node, self.copied_view)
        return found

    def fused_away(self, node: fx.Node) -> bool:
        return self._get(node)[0]

    def copied(self, view: fx.Node) -> bool:
        """Is this view written to a buffer of its own (``_copied_view``, base inlined)?"""
        if not self.copied_view(view):
            return False  # (a copied view has a base node: _copied_view)
        self._get(view.args[0])
        return view in self._copies

    def written_at_call(self, node: fx.Node) -> fx.Node | None:
        """The library call at whose lowering Inductor writes ``node``, where it computes
        ``node`` inside its readers lowered before that call; else None (``node`` is written
        where it is computed, or inlined everywhere).

        Inductor decides at each node whether to write it (``GraphLowering.run_node``: its
        thresholds, ``_realized``, or a reader among ``needs_realized_inputs`` with a body
        loading more than one buffer). A pointwise value left unwritten there is inlined into
        each reader lowered while it stays so; a library call reading it writes it then
        (``ExternKernel.realize_input``), and the readers after load that buffer. HF T5's
        softmax backward (``prims.fma``), read by the relative position bias's gradient (a
        sum over the batch, two elements, unrolled) and, through a view, by two ``bmm``: the
        sum is computed from the scores' gradient, the probabilities and their row sums, which
        stay alive until the bias gradient's kernel at the end of the backward (measured 1.1%
        over a prediction that had the ``fma`` written where it is computed)."""
        if node in self._written_at_call:
            return self._written_at_call[node]
        found = None
        if (node.op == "call_function" and not oplib.is_getitem(node) and not is_multi_output(node)
                and not (oplib.is_reduction(node) and _unrolled_elements(node) <= 1)
                and _pointwise_kernel_body(node, self) and not self._candidate(node)):
            readers = self.readers(node)
            calls = [r for r in readers if r.op == "call_function" and library_call(r)
                     and not oplib.copies_unwritten_inputs(r)]
            others = [r for r in readers if r not in calls]
            if calls and others and all(r.op == "call_function" and (self.fusible(r) or oplib.loads_lazily(r, node))
                                        for r in others):
                position = self._position(node)
                first = min(calls, key=position.__getitem__)
                if any(position[r] < position[first] for r in others):
                    for a in node.all_input_nodes:
                        self._get(a)
                    body = self._body(node)
                    hinted = (len(node.users) > 1 and any(library_call(u) for u in node.users)
                              and len(body[3]) > 1)
                    if not hinted and not self._realized(node, body)[0]:
                        found = first
        self._written_at_call[node] = found
        return found

    def _position(self, node: fx.Node) -> dict[fx.Node, int]:
        if self._positions is None:
            self._positions = {n: i for i, n in enumerate(node.graph.nodes)}
        return self._positions

    def _broadcast(self, node: fx.Node) -> bool:
        """Is ``node`` read broadcast to a larger shape, by a pointwise reader or an
        ``expand``?"""
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return False
        size = _hint(val.numel())  # a symbolic size by its hint: planning adds no guard

        def larger(n: fx.Node) -> bool:
            out = n.meta.get("val")
            return isinstance(out, torch.Tensor) and _hint(out.numel()) > size

        # (a pointwise op broadcasts; a gather reads through its index and a concatenation
        # reads each part once: an upsampling's ``_unsafe_index`` marks no reuse, and a SiLU
        # it reads is inlined into it, as is the upsampling into the concatenation)
        return (any(u.target is _EXPAND and larger(u) for u in node.users)
                or any(oplib.is_pointwise(r) and larger(r) for r in self.readers(node)))

    def _hinted_by_attention(self, node: fx.Node) -> bool:
        """Does Inductor hint ``node`` to be written (``realize_hint``) because it, or a view
        of it, has several readers one of which is an attention call? Inductor hints the
        value a node lowers to when one of its several readers needs realized inputs
        (``GraphLowering.run_node``), and a view passes the hint on to its base
        (``BaseView.realize_hint``): a Hugging Face causal mask expanded once over the heads
        and read through that ``expand`` by every layer's attention is written where it is
        made (measured on an H200, torch 2.11: Qwen2, Mistral, Gemma, GPT-NeoX and Phi's
        least plans 4.78 MB over their predictions, the mask computed into each copy)."""
        stack = [node]
        while stack:
            m = stack.pop()
            if len(m.users) > 1 and any(oplib.copies_unwritten_inputs(u) for u in m.users):
                return True
            stack.extend(u for u in m.users if oplib.is_view(u) and not oplib.is_getitem(u) and not self.copied_view(u))
        return False

    def _copied_views(self, node: fx.Node) -> list[fx.Node]:
        """The views of ``node`` that Inductor copies (``_copied_view``): its own, and those
        of its views that are not copied (a ``clone`` reshaped twice before its ``mm``:
        the attention's q, k, v gradients stacked for the input projection)."""
        found, stack = [], list(node.users)
        while stack:
            user = stack.pop()
            if self.copied_view(user):
                found.append(user)
            elif oplib.is_view(user) and not oplib.is_getitem(user):
                stack.extend(user.users)
        return found

    def _get(self, node: fx.Node):
        stack = [(node, False)]
        while stack:  # post-order without recursion: long pointwise chains exist
            n, ready = stack.pop()
            if n in self._info:
                continue
            if not ready:
                stack.append((n, True))
                if self._candidate(n) or (n.op == "call_function" and oplib.is_view(n)):
                    stack.extend((a, False) for a in n.all_input_nodes if a not in self._info)
                continue
            self._info[n] = self._decide(n)
        return self._info[node]

    def _candidate(self, n: fx.Node) -> bool:
        found = self._inlinable.get(n)
        if found is None:
            found = self._inlinable[n] = _inlinable(n, self)
        return found

    def _decide(self, n: fx.Node):
        if n.op == "call_function" and oplib.is_view(n):
            base = n.args[0] if n.args and isinstance(n.args[0], NODES) else None
            if base is not None:
                if n in self._copies:
                    return False, frozenset([n.name]), frozenset(), False, _big(n), _NO_EXTRA
                return (False,) + self._info[base][1:]
        if not self._candidate(n):
            vals = flat_tensors(n.meta.get("val"))
            bias = unfused_bias(n)
            if bias is not None:  # the product is written; each reader loads the bias and adds it
                _, bias_loads, bias_ops, bias_heavy, bias_big, bias_extra = self._get(bias)
                return (False, frozenset([n.name]) | bias_loads, frozenset([n.name + ":bias"]) | bias_ops, bias_heavy,
                        _big(n) | bias_big, bias_extra)
            return False, frozenset([n.name]) if vals else frozenset(), frozenset(), False, _big(n), _NO_EXTRA
        loads, ops, heavy, big_loads, extra = self._body(n)
        if is_multi_output(n):
            return True, loads, ops, heavy, big_loads, extra  # its items decide (``_inlinable``)
        if oplib.is_getitem(n) and n.args[1] == 1 and len(ops) - 2 >= 2:  # (a candidate item: a max-pool's)
            # A max-pool's offsets (its argmax, item 1) over an input inlined into it: Inductor
            # counts the input's body once per window element, with the argmax's compares, and
            # writes the offsets when that passes its op limit (``has_exceeded_max_reads``): a
            # pooled SiLU's (four ops) were written (issue #27's U-Net, Checkmate's least plan:
            # 0.6% over its prediction when taken as inlined), a ReLU's are not. Taken as written
            # from two inlined ops up: at worst a small int8 buffer Inductor does not write.
            return False, frozenset([n.name]), frozenset(), False, _big(n), _NO_EXTRA
        written, copies = self._realized(n, (loads, ops, heavy, big_loads, extra))
        if written:
            return False, frozenset([n.name]), frozenset(), False, _big(n), _NO_EXTRA
        self._copies.update(copies)
        return True, loads, ops, heavy, big_loads, extra

    def _body(self, n: fx.Node):
        """What ``n``'s body would load and compute, inlined: ``(loads, ops, heavy, big loads,
        extra)`` from its inputs' answers (which must be known)."""
        if n.name not in self._op_weights:  # (asked once a node: the key alone is a tree walk)
            self._op_weights[n.name] = inductor_ops(n)
        window = _compat.max_pool_backward_window(n) if oplib.is_generated_max_pool_backward(n) else None
        # (a max-pool backward of Inductor's own loads the gradient and the indices, not the
        # pooled input, whose layout alone it reads)
        infos = ([self._info[a] for a in (n.args[0], n.args[7])] if window is not None
                 else [self._info[a] for a in n.all_input_nodes])
        if len(infos) == 1:  # (most pointwise ops: the input's sets as they are)
            _, loads, ops, heavy, big_loads, extra = infos[0]
            ops = ops | {n.name}
        else:
            loads = frozenset().union(*(i[1] for i in infos))
            ops = frozenset([n.name]).union(*(i[2] for i in infos))
            heavy = any(i[3] for i in infos)
            big_loads = frozenset().union(*(i[4] for i in infos))
            extra = (sum(i[5][0] for i in infos), sum(i[5][1] for i in infos))
        if oplib.is_gather(n) and isinstance(n.args[0], NODES):
            # A gather loads its data at an index of its own: to Inductor's read count
            # (``num_reads``, ``nontrivial_read_count``) another read than any other load of
            # that buffer. GPT-J's causal mask compares the positions gathered at two indices;
            # two reads, so the mask is written where it is made (``realize_hint``, its
            # readers being attention calls), not copied for each (a 256 KiB mask held
            # through the backward, 1.8% over the least plan's prediction at the small scale).
            data = self._info[n.args[0]]
            loads = (loads - data[1]) | {f"{x}@{n.name}" for x in data[1]}
            big_loads = (big_loads - data[4]) | {f"{x}@{n.name}" for x in data[4]}
        unrolled = _unrolled_elements(n) if window is None else window  # (loads at each window position)
        if unrolled > 1:
            # Inductor computes a reduction over so few elements as a pointwise sum of its input
            # at each of them: every load and op of the input's body once per element (loads at
            # other indices are other loads to its op counter).
            counted = self._weight(ops)
            extra = (unrolled * (len(loads) + extra[0]) - len(loads), unrolled * (counted + extra[1]) - counted)
        val = n.meta.get("val")
        device = val.device.type if isinstance(val, torch.Tensor) else "cpu"
        if device == "cpu" and getattr(n.target, "overloadpacket", None) is not None:
            uses = _USES_ON_CPU.get(n.target.overloadpacket.__name__)
            heavy = heavy or (uses is not None and not uses.isdisjoint(_compat.inductor_heavy_ops_on_cpu()))
        return loads, ops, heavy, big_loads, extra

    def counts(self, n: fx.Node, body=None) -> tuple[int, int]:
        """Inductor's read and op counts of ``n`` inlined (its ``body``, ``_body``, its inputs
        decided): ``num_reads``, each load at each index; ``inner_fn_opcount``, each op once
        and each load. Ops are summed per node (``inductor_ops``); where that nears the op
        limit, the body is lowered by Inductor and its own count taken
        (``_compat.inductor_body_op_count``): shared constants, index-independent ops of an
        unrolled sum, counted once (Hugging Face T5's position bias gradient, a sum over four
        elements of an ``fma`` masked by position: 30 ops to Inductor, 60 summed)."""
        if body is None:
            for a in n.all_input_nodes:
                self._get(a)
            body = self._body(n)
        loads, ops, _, _, extra = body
        nreads = len(loads) + extra[0]
        nops = self._weight(ops) + extra[1] + nreads
        limit = self._limit(n)
        if nops > limit["ops"] // 2:
            lowered = self._lowered_ops(n)
            nops = nops if lowered is None else lowered
        return nreads, nops

    def _lowered_ops(self, n: fx.Node) -> int | None:
        """``_compat.inductor_body_op_count`` of ``n`` with what the timeline inlines into it."""
        inside, inputs, stack, seen = [], [], [n], set()
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x is n or (x.op == "call_function" and (
                    (oplib.is_view(x) and not self.copied(x)) or self.fused_away(x))):
                inside.append(x)
                stack.extend(x.all_input_nodes)
            else:
                inputs.append(x)
        position = self._position(n)
        inside.sort(key=position.__getitem__)
        inputs.sort(key=position.__getitem__)
        laid_out = self.channels_last_buffer
        channels_last = {x for x in inputs if laid_out is not None and laid_out(x)}
        return _compat.inductor_body_op_count(inside, inputs, channels_last)

    def _limit(self, n: fx.Node) -> dict[str, int]:
        val = n.meta.get("val")
        device = val.device.type if isinstance(val, torch.Tensor) else "cpu"
        if device not in self._limits:
            self._limits[device] = _compat.inductor_realize_thresholds(device)
        return self._limits[device]

    def _weight(self, ops: frozenset[str]) -> int:
        weights = self._op_weights
        return sum(weights.get(name, 1) for name in ops)

    def _realized(self, n: fx.Node, body) -> tuple[bool, list[fx.Node]]:
        """Would Inductor write ``n`` where it is computed (its own thresholds), given its
        ``body`` (``_body``)? And the views of it that it would copy if not."""
        loads, ops, heavy, big_loads, extra = body
        limit = self._limit(n)
        nreads, nops = self.counts(n, body)
        several = len(self.readers(n)) > 1
        # A reader that broadcasts the value loads each element many times: Inductor's
        # ``expand`` asks the same question as for several readers, its read count
        # aside on a torch that tells loop reuse from graph fan-out (a cross entropy's
        # log-sum-exp, a heavy ``log``, is written before the log-probabilities read it).
        # (asked only where it can change the answer: the readers' shapes are walked)
        broadcast = (not several and (heavy or nops > limit["ops"] or nreads > limit["reads"])
                     and self._broadcast(n))
        fanout = several or (broadcast and not self._loop_reuse_apart)
        copies = self._copied_views(n)
        # A max-pool (a tuple Inductor lowers item by item) loads its input once per window
        # element and asks it to be written first (``realize_hint``): the zoo CNN's batch-norm
        # ReLU before its pool is written (its body loads five buffers).
        # So does Inductor's own max-pool backward for the gradient it loads at each window
        # position (torch 2.11: ``oplib.is_generated_max_pool_backward``).
        pooled = any(oplib.lowered_item_by_item(r) or (oplib.is_generated_max_pool_backward(r) and r.args[0] is n)
                     for r in self.readers(n))
        # Inductor's own max-pool backward asks for its result channels-last, and so writes it,
        # where the pooled input or the gradient is a buffer laid out so (its strides fixed);
        # otherwise it is a pointwise value like any other (torch 2.11: the test CNN's first
        # pool's backward, its input recomputed in the backward, is inlined into its readers).
        relaid = oplib.is_generated_max_pool_backward(n) and (
            self.channels_last_buffer is None or any(self.channels_last_buffer(a) for a in (n.args[0], n.args[1])))
        # With several readers, one an attention call (``oplib.copies_unwritten_inputs``; among
        # Inductor's ``needs_realized_inputs``), it is written where it is computed when its
        # body loads more than one buffer (``realize_hint``), else copied for each such call.
        hinted = self._hinted_by_attention(n)
        # Any value: past the read or op limit, written where its body loads more than one
        # buffer of more than one element (``has_exceeded_max_reads``, then ``realize_hint``);
        # past ``max_ops``, written whatever it loads.
        written = (nops > limit["max_ops"]
                   or ((nreads > limit["acc_reads"] or nops > limit["ops"]) and len(big_loads) > 1)
                   or ((several or broadcast) and (heavy or nops > limit["ops"]))
                   or (fanout and nreads > limit["reads"])
                   or ((copies or pooled or hinted) and len(big_loads) > 1)  # realize_hint: see _copied_view
                   or relaid)
        # A value computed from no buffer (positions from ``iota``, constants) is computed again
        # in each kernel that reads it even where Inductor writes it (``ComputedBuffer.make_loader``
        # inlines a body with no loads), and a buffer nothing loads is not made: HF T5's
        # relative position buckets (a ``log``, five readers) hold nothing.
        return written and bool(loads), copies


def inductor_ops(node: fx.Node) -> int:
    """The ops Inductor computes for ``node`` in a body it is inlined into, its loads aside
    (``_compat.inductor_op_count``); 1 for a reduction (``Inlining._body`` counts an unrolled
    one per element) or an op it lowers to no pointwise body alone. Remembered per node."""
    return per_meta("inductor ops", node, _inductor_ops)


def _inductor_ops(node: fx.Node) -> int:
    if node.op != "call_function" or oplib.is_reduction(node):
        return 1
    value = lambda a: a.meta.get("val")  # noqa: E731
    counted = _compat.inductor_op_count(node.target, map_arg(node.args, value), map_arg(node.kwargs, value),
                                        node.meta.get("val"))
    return 1 if counted is None else counted


def _big(node: fx.Node) -> frozenset[str]:
    """``{node.name}`` if loading its value is a load Inductor counts as nontrivial (an
    index that varies: more than one element), else nothing."""
    return frozenset([node.name]) if per_meta("not one element", node, _not_one_element) else frozenset()


def _not_one_element(node: fx.Node) -> bool:
    return any(v.numel() != 1 for v in flat_tensors(node.meta.get("val")))


_MM = torch.ops.aten.mm.default
_ADDMM = torch.ops.aten.addmm.default
_ADD = torch.ops.aten.add.Tensor
_EXPAND = torch.ops.aten.expand.default
_AS_STRIDED = torch.ops.aten.as_strided.default


def products_kept_apart(gm: fx.GraphModule) -> list[fx.Node]:
    """The adds of ``gm`` that ``folded_mm`` says Inductor computes as ``addmm`` though
    folding would hold the product's inputs well past their other readers: a tied
    embedding's gradient is the head's ``mm(grad_logits.T, h)`` plus the embedding's own,
    made at the end of the backward, so the fold held the logits' gradient (batch x
    sequence x vocabulary) through the whole backward (2.5 MiB of a 16-layer decoder's
    13.8 MiB least-memory plan). ``fx_passes.keep_products_apart`` rewrites these adds
    so the product is written where it is computed; kept apart when the inputs freed
    earlier outweigh the product, and some op runs between their last other reader and
    the add."""
    folds = [(add, mm) for add in gm.graph.find_nodes(op="call_function", target=_ADD)
             for mm in [folded_mm(add)] if mm is not None]
    if not folds:
        return []
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    found = []
    for add, mm in folds:
        held = 0
        for a in dict.fromkeys(mm.all_input_nodes):
            base = storage_node(a)
            # Until the mm (unfolded) or the last other reader of its storage, whichever is later.
            freed_at = max([position[mm]] + [position[r] for r in readers(base) if r is not mm])
            if position[add] - freed_at > 1:
                held += node_bytes(base)
        if held > node_bytes(mm):
            found.append(add)
    return found


def _expandable(shape, to) -> bool:
    return len(shape) <= len(to) and all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(to)))


def folded_mm(add: fx.Node) -> fx.Node | None:
    """The ``mm`` that Inductor computes as ``addmm`` at this ``add``, if any.

    Inductor's post-grad pattern (``fx_passes/post_grad.py::addmm``) rewrites
    ``add(mm(a, b), c)`` (either operand order) into ``addmm(c, a, b)`` at the add's place
    when the mm has no other reader, ``c`` is a tensor of the operands' dtype that expands
    to the product's shape and (on GPU only) not every reader of the sum is pointwise. The
    product is never written on its own: ``a`` and ``b`` stay alive until the add, and the
    library call writes the sum. Measured on HF BERT (tied decoder and word-embedding
    weights): the decoder weight's gradient ``mm(grad_logits.T, h)`` is added to the
    embedding's gradient at the end of the backward, so the logits' gradient (1 MiB) was
    held through the whole backward where the timeline freed it at the mm."""
    if add.op != "call_function" or add.target is not _ADD or len(add.args) != 2 or add.kwargs:
        return None
    for i in (1, 0):  # the order Inductor tries its two patterns in
        mm, inp = add.args[i], add.args[1 - i]
        if not (isinstance(mm, NODES) and mm.op == "call_function" and mm.target is _MM and len(mm.users) == 1):
            continue
        if not isinstance(inp, NODES) or not isinstance(inp.meta.get("val"), torch.Tensor):
            continue
        vals = [mm.meta.get("val"), inp.meta["val"]] + [a.meta.get("val") for a in mm.args if isinstance(a, NODES)]
        if not all(isinstance(v, torch.Tensor) for v in vals) or len({v.dtype for v in vals[1:]}) != 1:
            continue
        if not _expandable(tuple(inp.meta["val"].shape), tuple(mm.meta["val"].shape)):
            continue
        if inp.meta["val"].device.type != "cpu" and all(oplib.is_pointwise(r) for r in readers(add)):
            continue  # should_prefer_unfused_addmm: kept as mm + a pointwise add on GPU
        return mm
    return None


def unfused_bias(addmm: fx.Node) -> fx.Node | None:
    """The bias of an ``addmm`` that Inductor runs as ``mm`` and a pointwise add fused into
    its readers, if it does: on a GPU where every reader is pointwise (post-grad
    ``unfuse_bias_add_to_pointwise``; half dtypes stay fused where
    ``_compat.inductor_keeps_half_addmm_fused``). Each reader then loads the bias as well,
    which can put its body over Inductor's read limit: measured on an H100, a GPT's residual
    stream after a block's MLP (the stream, the fc2 product and its bias) was written where
    the timeline had it inlined, and the next one inlined where it had it written (8 MiB,
    5.5% of its least-memory plan's peak)."""
    if addmm.op != "call_function" or addmm.target is not _ADDMM or not isinstance(addmm.args[0], NODES):
        return None
    bias = addmm.args[0]
    val = bias.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.device.type == "cpu":
        return None
    if val.dtype in (torch.float16, torch.bfloat16) and _compat.inductor_keeps_half_addmm_fused():
        return None
    found = readers(addmm)
    return bias if found and all(r.op == "call_function" and oplib.is_pointwise(r) for r in found) else None


def _lazy_constant(node: fx.Node) -> bool:
    """A fusible tensor made from no tensor (a constructor: ``full``, ``zeros``, ``iota``)
    that the graph does not return: lowered lazily, written where first needed."""
    return (node.op == "call_function" and oplib.is_fusible(node) and not oplib.is_random(node)
            and isinstance(node.meta.get("val"), torch.Tensor)
            and not any(isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes)
            and all(r.op == "call_function" for r in readers(node)))


_NONE: frozenset[str] = frozenset()
_CONV_BACKWARD = torch.ops.aten.convolution_backward.default
_CONVOLUTIONS = (torch.ops.aten.convolution.default, _CONV_BACKWARD)
_CAT = torch.ops.aten.cat.default


def _graph_steps(gm: fx.GraphModule, phase: str, rename: dict[str, str], relaid: set[str] = frozenset(),
                 fusion: bool = False, channels_last: bool = False,
                 workspace: Callable[[fx.Node], int] | None = None, symbolic: bool = False,
                 channels_last_inputs: set[str] = frozenset(), prefers_channels_last: set[fx.Node] | None = None,
                 conv_copied: set[str] = frozenset(),
                 relayouts: bool | None = None) -> tuple[list[Step], dict[str, str | None]]:
    """Steps of one graph, and the storage of each node by name; ``rename`` maps a
    placeholder to the storage it arrives in. Inputs in ``relaid`` are copied to a new
    layout before their first use (Inductor's channels-last convolutions): the copy
    is allocated there, and it is what the graph hands on if the input is saved.
    With ``fusion``, values Inductor fuses away (``Inlining.fused_away``) allocate nothing and
    their readers keep alive what they were computed from instead. ``workspace(node)``: bytes
    the node's kernel allocates beyond its outputs while it runs (``workspace.py``).
    ``symbolic``: bytes as sympy expressions in the graph's size symbols (``sizes.node_bytes_expr``),
    for the peak at every size (``peak_expressions``); a workspace stays its traced size.
    ``channels_last_inputs``: the inputs that arrive laid out channels-last (a backward's saved
    activations that Inductor's layout optimization laid out so in the forward).
    ``prefers_channels_last``: ``_compat.inductor_prefers_channels_last(gm)`` if the caller has it.
    ``conv_copied``: inputs each convolution reading them copies for itself (``conv_copied_inputs``).
    ``relayouts``: ``layout_optimized(gm)`` if the caller has it."""
    node_bytes, tensor_bytes = (node_bytes_expr, tensor_bytes_expr) if symbolic else (_node_bytes, _tensor_bytes)
    storage: dict[fx.Node, str | None] = {}
    needs: dict[fx.Node, frozenset[str]] = {}  # storages that reading the node's value touches
    # of those, the ones it reads out of their order (through a view that permutes, slices,
    # broadcasts or offsets): none of them is written over in place by its reader
    out_of_order: dict[fx.Node, frozenset[str]] = {}
    returned = set(_output_nodes(gm)) if fusion else set()
    steps: list[Step] = []
    pending_copies = [n for n in gm.graph.find_nodes(op="placeholder") if n.name in relaid]
    inlining = Inlining()
    addmms = {n: mm for n in gm.graph.find_nodes(op="call_function", target=_ADD) if fusion
              for mm in [folded_mm(n)] if mm is not None}
    folded = set(addmms.values())
    preallocated: set[fx.Node] = set()
    deferred: dict[str, int] = {}  # constants not yet made: storage -> bytes
    base_of: dict[fx.Node, str | None] = {}  # storage_of of each node seen, which its views share
    relaid_cats: set[fx.Node] = set()  # concatenations Inductor copies for their convolutions (_concatenation_copies)
    conv_copies: dict[fx.Node, list[str]] = {}  # convolution backward -> channels-last copies it reads
    if prefers_channels_last is None:
        prefers_channels_last = _compat.inductor_prefers_channels_last(gm) if fusion and channels_last else set()
    into_cat = _computed_into_concatenation(gm, inlining, prefers_channels_last, addmms) if fusion else {}
    inlining.channels_last_buffer = (channels_last_buffers(inlining, prefers_channels_last, channels_last_inputs)
                                     if channels_last else lambda n: False)
    # Inductor's C++ backend generates one function for all the kernels between two library
    # calls and frees what they read for the last time only after it: all of that stretch's
    # outputs are alive at once with its inputs (HF BERT's least plan: the embeddings'
    # layer-norm backward, their three gradients and the last attention's input gradients in
    # one function at the end of the backward, six 16 KiB buffers over the prediction).
    kernel_groups = fusion and _graph_device_type(gm) == "cpu"
    held: dict[fx.Node, list[Step]] = {}  # library call -> the steps of values written when it is lowered
    owner: dict[str, fx.Node] = {}  # a storage -> the node whose value it holds (its own, or an input's)

    layout_memo: dict[fx.Node, str | None] = {}
    channels_last_memo: dict[fx.Node, bool] = {}  # ``_laid_out_channels_last``'s, one a graph

    def graph_relayouts() -> bool:
        nonlocal relayouts
        if relayouts is None:  # asked once a graph, and only where needed
            relayouts = layout_optimized(gm)
        return relayouts

    # (a backward's inputs arrive channels-last where the forward laid them out so, or as
    # its channels-last copies of a weight, ``relaid``)
    traced = _TracedStrides(lambda n: n.name in channels_last_inputs
                            or str(rename.get(n.name, "")).endswith(":relaid"))

    def operands_relaid() -> bool:
        # Its convolution backwards' operands laid out by the layout optimization (torch 2.13),
        # not handed over in their traced strides (2.11: ``_handed_over_channels_last``)
        return graph_relayouts() and _compat.inductor_orders_convolution_backward_operands()

    def layouts(n: fx.Node) -> str | None:
        if n not in layout_memo:
            layout_memo[n] = _inductor_layout(n, inlining, prefers_channels_last, channels_last_inputs,
                                              operands_relaid, channels_last_memo)
        return layout_memo[n]
    # A value Inductor writes only at a later library call (``Inlining.written_at_call``): its
    # storage -> (that call, what the readers before it load instead)
    written_late: dict[str, tuple[fx.Node, frozenset[str]]] = {}
    for node in gm.graph.nodes:
        base = base_of[node] = _storage_of(node, base_of)
        if node.op == "placeholder":
            storage[node] = f"{phase}:{node.name}:relaid" if node in pending_copies else rename.get(node.name)
            if storage[node] is not None and node not in pending_copies:
                owner.setdefault(storage[node], node)
            needs[node] = frozenset([storage[node]] if storage[node] else [])
            if storage[node] is not None and phase == "backward" and node.name.startswith("tangents"):
                steps.append(Step(node.name, allocates={storage[node]: node_bytes(node)}, phase=phase))
            continue
        if node.op == "output":
            continue
        inputs = node.all_input_nodes
        reads = (needs.get(inputs[0], _NONE) if len(inputs) == 1 else
                 _NONE.union(*[needs.get(a, _NONE) for a in inputs]))
        if written_late:
            for s in [s for s, (call, _) in written_late.items() if call is node]:
                del written_late[s]
            if not reads.isdisjoint(written_late):
                reads = _NONE.union(*[written_late[s][1] if s in written_late else (s,) for s in reads])
        if deferred and fusion and not reads.isdisjoint(deferred) and (
                oplib.is_fusible(node) or oplib.is_index_put(node) or _compat.inductor_scatters_in_aten(node)):
            # A constant not yet made is computed inside every kernel Inductor generates that
            # reads it (a body without loads), and a scatter scatters into a copy of what it
            # is given, made in the scatter's own buffer: neither makes it. Only a library
            # call does (``ExternKernel.realize_input``). So zeros read by scatters and
            # pointwise ops alone are never made: an embedding's gradient's, a max-pool
            # backward's (scattered by ATen), HF T5's relative position bias gradients' (two
            # scatters, each into a copy of its own), HF Falcon's query-key-value gradient's
            # (index_put and slice_scatter into one zeros; 384 KiB the least plan's prediction
            # held at its peak, 4.4% over the measured peak).
            reads = reads.difference(deferred)
        allocates: dict[str, int] = {}
        if fusion and inlining.copied(node):
            # a view Inductor copies to a buffer of its own, its base inlined (_copied_view)
            storage[node] = f"{phase}:{node.name}"
            needs[node] = frozenset([storage[node]])
            allocates = {storage[node]: node_bytes(node)}
        elif base is None or base != node.name:
            # a view (lives in its base's storage) or a non-tensor
            base_node = next((a for a in node.all_input_nodes), None)
            storage[node] = storage.get(base_node) if base is not None and base_node is not None else None
            needs[node] = needs.get(base_node, frozenset()) if base is not None and base_node is not None else frozenset()
            if base is not None and base_node is not None:
                out_of_order[node] = needs[node] if _read_out_of_order(node) else out_of_order.get(base_node, _NONE)
        elif is_multi_output(node) and not (fusion and inlining.fused_away(node)):
            # The op allocates all its outputs while its inputs are alive (a library call:
            # the flash attention backward's three gradients, measured on HF BERT); each
            # item lives in the storage of its getitem, one the graph never reads dies here.
            storage[node] = None
            needs[node] = frozenset()
            items = {u.args[1]: u for u in node.users if oplib.is_getitem(u)}
            for i, val in enumerate(node.meta["val"]):
                if isinstance(val, torch.Tensor):
                    item = items.get(i)
                    if item is not None and storage_of(item) == item.name:
                        preallocated.add(item)
                        allocates[f"{phase}:{item.name}"] = node_bytes(item)
                    elif item is None and not oplib.is_fusible(node):
                        allocates[f"{phase}:{node.name}:{i}"] = tensor_bytes(val)
        elif node in preallocated:
            storage[node] = f"{phase}:{node.name}"
            needs[node] = frozenset([storage[node]])
        elif node in folded:
            storage[node] = None  # computed by the addmm at its add
            needs[node] = reads
            out_of_order[node] = _NONE.union(*[out_of_order.get(a, _NONE) for a in inputs])
        elif fusion and inlining.fused_away(node):
            storage[node] = None
            needs[node] = reads
            out_of_order[node] = _NONE.union(*[out_of_order.get(a, _NONE) for a in inputs])
        elif fusion and _lazy_constant(node):
            # Inductor makes a constant (``full``, ``zeros``) only when a kernel that cannot
            # inline it reads it (an index_put_ into a zeros buffer): at that reader,
            # wherever the graph placed it (AOTAutograd hoists them to the top).
            storage[node] = f"{phase}:{node.name}"
            needs[node] = frozenset([storage[node]])
            deferred[storage[node]] = node_bytes(node)
        elif node in into_cat:
            # computed into its concatenation's slice: the concatenation's buffer is made here
            cat = into_cat[node]
            storage[node] = f"{phase}:{cat.name}"
            needs[node] = frozenset([storage[node]])
            allocates = {storage[node]: node_bytes(cat)}
        else:
            storage[node] = f"{phase}:{node.name}"
            needs[node] = frozenset([storage[node]])
            allocates = {storage[node]: node_bytes(node)}
            if fusion and not symbolic and node in returned and isinstance(node.meta.get("val"), torch.Tensor):
                # Inductor gives a value the graph returns the strides it has in eager mode
                # (``keep_output_stride``) and allocates their span: HF T5's decoder input ids,
                # a copy into a column of a 4 x 128 matrix, returned with the column's strides
                # for the backward, 3,080 bytes where its 4 elements take 32.
                allocates[storage[node]] = strided_bytes(node.meta["val"])
            if fusion and channels_last and len(reads) > 1 and node not in prefers_channels_last:
                # (Inductor realizes such a value where it is computed only when its kernel
                # loads more than one buffer, ``StorageBox.realize_hint``; a ReLU of one
                # convolution's output is written channels-last, in place, and not copied. A
                # value its layout optimization lays out channels-last is not copied either: a
                # recomputed batch norm's ReLU, read by a 1x1 convolution's backward in ResNet-50.)
                for conv in _copied_for_convolution_backward(node):
                    copy = f"{phase}:{node.name}:channels_last"
                    allocates[copy] = node_bytes(node)
                    conv_copies.setdefault(conv, []).append(copy)
            if fusion and channels_last:
                # (whether or not the layout optimization claims it: it lays out channels-last only
                # a value written where it is computed, ``maybe_apply_channels_last_stride_order``)
                for view, conv in _reshaped_for_convolution_backward(node, operands_relaid):
                    copy = f"{phase}:{view.name}:channels_last"
                    allocates[copy] = node_bytes(view)
                    conv_copies.setdefault(conv, []).append(copy)
        if node in conv_copies:
            reads = reads.union(conv_copies.pop(node))
        if deferred and (allocates or is_multi_output(node)):  # a kernel or library call runs here
            for s in reads:
                if s in deferred:
                    allocates[s] = deferred.pop(s)
        if fusion and node.target is _CAT and storage[node] is not None:
            _read_from_concatenation(node, storage[node], needs, inlining, folded)
        concat_copies = 0
        if fusion and channels_last and phase == "backward" and node.target is _CAT:
            concat_copies = _concatenation_copies(node, prefers_channels_last, channels_last_inputs,
                                                  operands_relaid())
        if concat_copies:
            # In a backward (where it is recomputed; a forward's is written once, measured),
            # Inductor writes such a concatenation more than once in one kernel (see
            # ``_concatenation_copies``); with several readers each convolution reading it
            # takes a copy of its own, alive while it runs (issue #27's U-Net: three 14 MB
            # buffers at the measured peak, in the concatenation's kernel).
            if concat_copies > 1:
                relaid_cats.add(node)
            allocates[f"{phase}:{node.name}:concat"] = concat_copies * node_bytes(node)
        if pending_copies:
            # Inductor writes all its channels-last copies of the graph's inputs in its first
            # kernel (one kernel, before the first convolution), not at each one's first reader.
            for a in pending_copies:
                allocates[storage[a]] = node_bytes(a)
            pending_copies = []
        if conv_copied and node.target in _CONVOLUTIONS:
            # Written channels-last by the kernel before the convolution, for it alone
            # (``conv_copied_inputs``): a ViT's image, once per recomputation of its patches.
            # On CPU that kernel is part of the stretch of kernels before the call, one function
            # that frees what it reads last only at its end: a step of its own there, as a
            # scatter's operands (HF ResNet's least plan: the image's copy for the stem's
            # convolution backward, written by the batch-norm backward's kernel while the
            # recomputed stem and the max-pool's gradient were alive, 49,152 B over).
            relaid_here = {f"{phase}:{node.name}:{a.name}:channels_last": node_bytes(a)
                           for a in _conv_activations_and_weight(node)
                           if a.op == "placeholder" and a.name in conv_copied}
            if relaid_here and kernel_groups:
                held.setdefault(node, []).append(Step(f"{node.name}:relaid", allocates=relaid_here, phase=phase,
                                                      frees_late=kernel_groups))
                reads = reads.union(relaid_here)
            else:
                allocates.update(relaid_here)
        weight = node.args[2 if node.target is _CONV_BACKWARD else 1] if node.target in _CONVOLUTIONS else None
        if channels_last and isinstance(weight, NODES) and _device_type(weight) == "cpu":
            # The library (oneDNN on CPU) copies the weight to its own blocked layout, and the
            # backward computes the weight's gradient in that layout before copying it out:
            # temporaries freed when the op returns, one weight-sized buffer in the forward,
            # two in the backward when it computes the weight's gradient (measured on CPU,
            # deep CNN and ResNet-50: the extra allocations inside ``mkldnn_convolution`` and
            # ``convolution_backward`` are weight-sized, plus a scratchpad of ~12 KB not
            # modelled; the incoming gradient arrives channels-last and is not copied).
            copies = 1
            if node.target is _CONV_BACKWARD:
                copies += 1 if _computes_weight_gradient(node) else 0
            # A channel slice (of a concatenation's gradient, say) is not dense in
            # channels-last: the library copies it to a dense buffer first (measured on
            # generated U-Nets: an empty_like the size of the sliced gradient). So is any
            # view whose strides leave gaps: a ViT's patch gradient, its tokens sliced past
            # the class token and permuted to channels (a clone the size of the view).
            activations = node.args[:2] if node.target is _CONV_BACKWARD else node.args[:1]
            copies_bytes = sum(node_bytes(a) for a in activations
                               if _channel_slice(a) or a in relaid_cats or _view_with_gaps(a))
            # oneDNN's own scratchpad comes on top of the weight copies (12–22 KB in a U-Net's
            # convolution backwards, its measured peak): measured as Inductor calls it, with the
            # operands in the layouts it hands them over in where it does not order them itself
            # (the copies oneDNN then makes while it runs are in the measurement).
            handed = _handed_over_channels_last(node, traced)
            ordered = (_ordered_for_convolution_backward(node, traced)
                       if handed is None and node.target is _CONV_BACKWARD and not graph_relayouts() else None)
            measured = (strided_scratch_bytes(node, ordered) if ordered is not None
                        else channels_last_scratch_bytes(node) if handed is None
                        else convolution_scratch_bytes(node, handed))
            scratch = max(copies * node_bytes(weight), measured) if not symbolic else (
                _compat.symbolic_max(copies * node_bytes(weight), _scaled_scratch(node, measured)))
            allocates[f"{phase}:{node.name}:workspace"] = scratch + copies_bytes
        elif workspace is not None:  # op by op; through Inductor, CUDA's library calls (cuDNN's convolutions)
            scratch = workspace(node)
            if scratch and symbolic:
                scratch = _scaled_scratch(node, scratch)
            if scratch:
                allocates[f"{phase}:{node.name}:workspace"] = scratch
        if (fusion and channels_last and library_call(node) and node.target not in _CONVOLUTIONS
                and not _compat.inductor_scatters_in_aten(node)):  # (a scatter's: ``_scatter_operands_copied``)
            # A reshape of a 4-d buffer laid out channels-last that no strides express (a saved
            # activation the forward's layout optimization laid out so, flattened for a matmul)
            # is copied for the call by a kernel right before it, while the buffer is alive:
            # HF ConvNeXt's saved GELU output (4, 8, 8, 64), laid out with its dimension 1
            # innermost, copied for its weight gradient's ``mm`` (one 64 KiB buffer at the
            # measured peak, 5.4% over the prediction without it).
            reshaped = [a for a in dict.fromkeys(inputs) if _unexpressible_view(a, traced)]
            if reshaped:
                copies = {f"{phase}:{node.name}:{a.name}:copy": node_bytes(a) for a in reshaped}
                held.setdefault(node, []).append(Step(
                    f"{node.name}:copies", allocates=copies, phase=phase, frees_late=kernel_groups,
                    reads=_NONE.union(*[needs.get(a, _NONE) for a in reshaped])))
                reads = _NONE.union(copies, *[needs.get(a, _NONE) for a in inputs if a not in reshaped])
        if fusion and oplib.copies_unwritten_inputs(node):
            # Each input not written (inlined, ``Inlining``) is copied for this call alone by a
            # kernel right before it, which reads what the input is computed from
            # (``oplib.copies_unwritten_inputs``): HF GPT-NeoX's recomputed ``v``, a ``clone``
            # of a slice of the QKV projection, copied for the attention and again for its
            # backward, the projection alive in between (measured 4.7% over a prediction
            # that had ``v`` written once, with Inductor's buffer reuse filling the rest).
            unwritten = [a for a in dict.fromkeys(inputs)
                         if storage.get(a) is None and isinstance(a.meta.get("val"), torch.Tensor)
                         and inlining.fused_away(_viewed_value(a))]
            # and a broadcast bias copied dense though written (``oplib.copied_expanded_inputs``)
            unwritten += [a for a in oplib.copied_expanded_inputs(node) if a in inputs and a not in unwritten]
            if unwritten:
                copies = {f"{phase}:{node.name}:{a.name}": node_bytes(a) for a in unwritten}
                held.setdefault(node, []).append(Step(
                    f"{node.name}:copies", allocates=copies, phase=phase, frees_late=kernel_groups,
                    reads=_NONE.union(*[needs.get(a, _NONE) for a in unwritten])))
                reads = _NONE.union(copies, *[needs.get(a, _NONE) for a in inputs if a not in unwritten])
        if fusion and _compat.inductor_scatters_in_aten(node):
            # The scatter's output (a copy of what it scatters into: the zeros of a max-pool's
            # backward) and the copies of its operands (``_scatter_operands_copied``) are
            # written by the kernels before the call, while what those read is alive (on
            # CPU, freed after that stretch): a step of their own right before it.
            made = {f"{phase}:{node.name}:{a.name}": node_bytes(a)
                    for a in (_scatter_operands_copied(node, prefers_channels_last, channels_last_inputs)
                              if channels_last else ())}
            if kernel_groups and storage[node] in allocates:
                made[storage[node]] = allocates.pop(storage[node])
            if made:
                held.setdefault(node, []).append(Step(f"{node.name}:operands", allocates=made, phase=phase,
                                                      frees_late=kernel_groups))
                reads = reads.union(made)
        # Inductor writes in place only from kernels it generates, not library calls, and
        # not from a gather (its loads go through an index, not the place it writes); an
        # index_put scatters into the tensor it is given (an embedding gradient's zeros). Nor
        # from a reduction, which reads more than it writes (``SchedulerNode.can_inplace``: the
        # read's ranges are the write's): a BART's layer-norm weight gradient (32 values) was
        # written over the saved row statistics it read last (2 x 16), the same 128 bytes, which
        # Inductor held to the end of the kernel group (256 B over a prediction 192 B under the
        # budget).
        in_place = (fusion and (oplib.is_fusible(node) or oplib.is_index_put(node)) and node not in addmms
                    and not oplib.is_reduction(node))
        frees_late = kernel_groups and not library_call(node) and node not in addmms
        if storage.get(node) is not None:
            owner.setdefault(storage[node], node)
        donors = None
        if in_place and channels_last and storage[node] in allocates and owner.get(storage[node]) is node:
            # (only where buffers may be laid out channels-last: elsewhere all are contiguous)
            donors = _same_layout_donors(node, reads, owner, layouts)
        if in_place:
            # Inductor writes over a buffer only where it reads it at the index it writes
            # (``SchedulerNode.can_inplace``): not one read through a permutation, a slice or a
            # broadcast. HF GPT-NeoX's query-key-value gradient, the contiguous copy of a
            # permuted concatenation, was written beside it, not over it (0.9% over the
            # prediction once Inductor's buffer reuse filled the slack the prediction left).
            unordered = _NONE.union(*[out_of_order.get(a, _NONE) for a in inputs])
            if not unordered.isdisjoint(reads):
                donors = frozenset(reads if donors is None else donors) - unordered
        # (the set itself: a fused value's reads are its inputs', shared, and their order does
        # not change the timeline)
        step = Step(node.name, allocates=allocates, reads=reads, phase=phase, in_place=in_place,
                    frees_late=frees_late, donors=donors)
        steps.extend(held.pop(node, ()))
        # (a value with its channels-last copy for the call, ``_reshaped_for_convolution_backward``,
        # is written there too)
        reader = (written_at_reader(node) if fusion and storage[node] in allocates
                  and all(s == storage[node] or s.endswith(":channels_last") for s in allocates) else None)
        if fusion and reader is None and storage[node] in allocates and len(allocates) == 1:
            reader = inlining.written_at_call(node)
            if reader is not None:
                written_late[storage[node]] = (reader, reads)
        if reader is not None and reader not in addmms and node not in addmms:
            held.setdefault(reader, []).append(step)
        else:
            steps.append(step)
    return steps, {n.name: s for n, s in storage.items()}


def _read_from_concatenation(cat: fx.Node, cat_storage: str, needs: dict[fx.Node, frozenset[str]],
                             inlining: Inlining, folded: set[fx.Node]) -> None:
    """Inductor computes a pointwise value that a concatenation kernel reads directly (not
    through a view) into the concatenation's slice (``ConcatKernel.realize_into``): from
    then on the value is a buffer, that slice, and the readers lowered after the
    concatenation load it from there. Their reads become the concatenation's storage, kept
    alive to the last of them, instead of what the value was computed from (generated
    attention model, seed 40: a residual sum concatenated with the block's output and read
    again by the next layer norm's recomputation held the 12 KiB concatenation to that
    layer norm's backward, 3.4% over the prediction). Readers lowered before it inline the
    value as before. Views of the value are copied into the slice instead and change
    nothing."""
    if not _compat.inductor_writes_every_cat(_device_type(cat)):
        return
    for part in cat.args[0]:
        if isinstance(part, NODES) and part not in folded and inlining.fused_away(part):
            needs[part] = frozenset([cat_storage])


def _computed_into_concatenation(gm: fx.GraphModule, inlining: Inlining, prefers_channels_last: set[fx.Node],
                                 addmms: dict[fx.Node, fx.Node]) -> dict[fx.Node, fx.Node]:
    """The values Inductor writes straight into a concatenation's slice, each with that
    concatenation: on CPU (every concatenation a kernel of its own), a value its own kernel
    writes (not inlined, not a library call's output) that the concatenation reads directly,
    and whose layout nothing has fixed before it (``ConcatKernel.realize_into`` takes a
    buffer whose layout is still flexible; a library call reading it first, Inductor's
    channels-last layout optimization, or its being a graph output (a saved activation) fixes
    it, and the concatenation copies it instead: generated attention models, seeds 11 and 16,
    measured 2.2% over when a saved residual sum was taken as computed into its slice).
    The value then lives in the concatenation's buffer, made where the value is computed and
    kept to the last reader of either (a U-Net's recomputed skip activation, read again by its
    max-pool's backward, held the whole 14 MB concatenation to there: the knapsack's least
    plan of issue #27's U-Net measured 6.6% over its prediction)."""
    found: dict[fx.Node, fx.Node] = {}
    cats = [n for n in gm.graph.find_nodes(op="call_function", target=_CAT)
            if _compat.inductor_writes_every_cat(_device_type(n))]
    if not cats:
        return found
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    for cat in cats:
        for part in cat.args[0]:
            if (not isinstance(part, NODES) or part.op != "call_function"
                    or oplib.is_view(part) or oplib.is_getitem(part) or is_multi_output(part)
                    or library_call(part) or part in addmms
                    or (part in prefers_channels_last and len(part.users) > 1)
                    or inlining.fused_away(part)
                    or any(u.op == "output" for u in part.users)  # an output's strides are fixed
                    or not isinstance(part.meta.get("val"), torch.Tensor)):
                continue
            cats_reading = [u for u in part.users if u.target is _CAT]
            earlier = [u for u in part.users if position[u] < position[cat]]
            if (cats_reading == [cat] and list(cat.args[0]).count(part) == 1
                    and all(inlining.fusible(u) and not oplib.is_view(u) for u in earlier)):
                found[part] = cat
    return found


def _copied_for_convolution_backward(node: fx.Node) -> list[fx.Node]:
    """The convolution backwards (at most one) that read a channels-last copy of ``node``.

    Inductor realizes a value with several readers, one of them a convolution backward, in
    the strides the traced graph gives it (``GraphLowering.run_node``'s ``need_fixed_layout``:
    contiguous, as eager PyTorch made it); its channels-last convolutions then need their
    gradient and input in channels-last order, so the kernel that writes the value also
    writes a copy for the call, alive until the call returns (a residual stream's gradient in
    a CNN's backward, read by the block's convolution backward and by the skip: measured on
    the generated CNNs of ``tests/test_generated_models.py``, one such copy at each block's
    peak). A value with one reader is written channels-last to begin with."""
    val = node.meta.get("val")
    if (node.target is _CAT or len(node.users) < 2 or not isinstance(val, torch.Tensor) or val.dim() != 4
            or _channels_last_ordered(val)):
        return []
    return [u for u in node.users if u.target is _CONV_BACKWARD and node in u.args[:2]][:1]


def _scaled_scratch(node: fx.Node, traced_bytes: int):
    """A library call's scratch, measured at the traced sizes, as an expression in the size
    symbols: at least what was measured, and growing with the largest tensor the call reads
    or makes (a double convolution's unfolded input, ``slow_conv2d``'s ``finput``, is its
    output's positions times its kernel's: a CNN traced at 16x16 and run at 24x24 measured
    1.30 MB where its scratch kept at the traced size predicted 1.22 MB)."""
    if not traced_bytes:
        return 0
    # (one tensor, not a node's outputs together: a convolution backward's weight gradient, of
    # fixed size, beside its input gradient scaled the scratch by 1.6 where it grew 2.25 times)
    tensors = [t for n in [node, *node.all_input_nodes] for t in flat_tensors(n.meta.get("val"))]
    hints = [_hint(t.numel()) * t.element_size() for t in tensors]
    if not tensors or max(hints) == 0:
        return traced_bytes
    largest = tensors[hints.index(max(hints))]
    return _compat.symbolic_max(traced_bytes, traced_bytes * tensor_bytes_expr(largest) / max(hints))


def _handed_over_channels_last(node: fx.Node, traced: Callable[[fx.Node], Any]) -> frozenset[int] | None:
    """The positional operands (gradient 0, input 1, weight 2) Inductor hands a convolution
    backward laid out channels-last, where it hands them over in the strides its graph traces
    them in (``_compat.inductor_orders_convolution_backward_operands`` false: torch 2.11, a
    fallback under ``constrain_to_fx_strides``; ``traced(n)``: ``n``'s value with those strides,
    ``_TracedStrides``); None where it orders them itself (torch 2.13: each one as the call
    computes, a copy of its own written where a value is laid out otherwise, which the timeline
    counts as that value's layout). What oneDNN then copies while it runs is in the scratch
    measured with these layouts (``workspace.convolution_scratch_bytes``): a group norm's input
    gradient, traced contiguous, before a channels-last convolution (one activation more at the
    call, 17% over the prediction of a two-layer CNN when it was not counted); a CNN's first
    convolution, contiguous input and weight, given a channels-last gradient (two more)."""
    if node.target is not _CONV_BACKWARD or _compat.inductor_orders_convolution_backward_operands():
        return None
    return frozenset(i for i, a in enumerate(node.args[:3]) if isinstance(a, NODES)
                     and isinstance(traced(a), torch.Tensor) and traced(a).dim() == 4
                     and _channels_last_ordered(traced(a)))


def _ordered_for_convolution_backward(node: fx.Node, traced: Callable[[fx.Node], Any]) -> tuple | None:
    """The strides Inductor hands a convolution backward's gradient, input and weight in, where
    it orders them itself (torch 2.13) in a graph without its layout optimization (a backward
    that recomputes no convolution): ``_compat.inductor_convolution_backward_strides`` on the
    operands in the strides Inductor's graph has them (``traced``). None where that cannot be
    found (an operand without a fake value): every operand is then counted channels-last."""
    values = [traced(a) if isinstance(a, NODES) else a for a in node.args]
    fake_mode = next((v.fake_mode for v in values[:3] if getattr(v, "fake_mode", None) is not None), None)
    if fake_mode is None or not all(isinstance(v, torch.Tensor) for v in values[:3]):
        return None
    try:
        with fake_mode:
            return _compat.inductor_convolution_backward_strides(tuple(values))
    except Exception:  # noqa: BLE001 - an op fake tensors cannot rerun: as the layout optimization lays it out
        return None


def _unexpressible_view(node: fx.Node, traced: Callable[[fx.Node], Any]) -> bool:
    """Is this a chain of views of a 4-d buffer laid out channels-last (as Inductor's graph has
    it, ``traced``) that no strides express (a reshape across its scattered dimensions), so
    that a library call reading it is handed a copy?"""
    chain = []
    while isinstance(node, NODES) and node.op == "call_function" and oplib.is_view(node) and not oplib.is_getitem(node):
        chain.append(node)
        node = node.args[0] if node.args else None
    if not chain or not isinstance(node, NODES):
        return False
    base = traced(node)
    if not (isinstance(base, torch.Tensor) and base.dim() == 4 and not base.is_contiguous()
            and _channels_last_ordered(base)):
        return False
    value = torch.empty_strided([_hint(n) for n in base.shape], [_hint(n) for n in base.stride()],
                                dtype=base.dtype, device="meta")
    for view in reversed(chain):
        args, kwargs = map_arg((view.args[1:], view.kwargs), lambda n: _hint(n.meta.get("val")))
        try:
            value = view.target(value, *args, **kwargs)
        except (RuntimeError, ValueError):  # "view size is not compatible" (fake tensors: "Cannot view")
            return True
    return False


class _TracedStrides:
    """Each value as Inductor's graph has it: Inductor propagates fake tensors through a graph
    again from its inputs as they arrive (``compile_fx``'s ``fake_tensor_prop``), so a
    backward's values computed from saved activations laid out channels-last in the forward
    have the strides those give them, where the planner's graph was traced contiguous. Asked
    only where the strides decide what is copied (``_handed_over_channels_last``);
    each value found once, and run again (on fake tensors) only where an input's strides
    differ from the planner's. ``arrives_channels_last(placeholder)``: the input arrives so."""

    def __init__(self, arrives_channels_last: Callable[[fx.Node], bool]):
        self._arrives = arrives_channels_last
        self._values: dict[fx.Node, Any] = {}

    def __call__(self, node: fx.Node) -> Any:
        stack = [node]
        while stack:  # post-order without recursion: a backward's chains are long
            n = stack[-1]
            if n in self._values:
                stack.pop()
                continue
            todo = [a for a in n.all_input_nodes if a not in self._values]
            if todo and n.op == "call_function":
                stack.extend(todo)
                continue
            stack.pop()
            self._values[n] = self._value(n)
        return self._values[node]

    def _value(self, n: fx.Node) -> Any:
        val = n.meta.get("val")
        if n.op == "placeholder":
            if (isinstance(val, torch.Tensor) and val.dim() == 4 and not _channels_last_ordered(val)
                    and self._arrives(n) and getattr(val, "fake_mode", None) is not None):
                with val.fake_mode:
                    return torch.empty_like(val, memory_format=torch.channels_last)
            return val
        if n.op != "call_function" or all(self._values.get(a) is a.meta.get("val") for a in n.all_input_nodes):
            return val
        fake_mode = next((v.fake_mode for v in flat_tensors(val) if getattr(v, "fake_mode", None) is not None), None)
        if fake_mode is None:
            return val
        args, kwargs = map_arg((n.args, n.kwargs), self._values.__getitem__)  # (light graphs' nodes too)
        try:
            with fake_mode:
                return n.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op fake tensors cannot rerun: its traced value
            return val


def layout_optimized(gm: fx.GraphModule) -> bool:
    """Does Inductor's layout optimization run on this graph (channels-last convolutions)?
    Its heuristic (``_compat.inductor_relayouts_convolutions``) reads every node; a graph
    without a convolution has none, so it is asked only where there is one."""
    return bool(gm.graph.find_nodes(op="call_function", target=_CONVOLUTIONS[0])
                and _compat.inductor_relayouts_convolutions(gm))


def _concatenation_copies(cat: fx.Node, prefers_channels_last: set[fx.Node],
                          channels_last_inputs: set[str] = frozenset(), relayouts: bool = True) -> int:
    """How many copies of a backward's concatenation, beyond the one the graph reads, its
    kernel writes, for a concatenation that a convolution backward reads and that computes one
    of its parts in its own kernel (a nearest upsampling, an activation; a concatenation of
    realized values is written once). Measured on generated U-Nets and issue #27's:

    - read by several ops, one a convolution backward: Inductor asks for the traced strides
      (``GraphLowering.run_node``'s ``need_fixed_layout``), so the kernel writes the
      channels-last concatenation, the value in the traced strides, and a channels-last copy
      for the convolution: two more;
    - read by the convolution backward alone and laid out channels-last: written once.
      Inductor's layout optimization lays it out so when its parts come from recomputed
      convolutions (``_compat.inductor_prefers_channels_last``; a U-Net's Rotor plans measured
      10-24% under their predictions when counted as three), and so does the concatenation
      itself when one part is a buffer already laid out channels-last (``ConcatKernel.create``):
      a saved activation that arrives so (``channels_last_inputs``) or a convolution's output
      (a U-Net's Rotor plan concatenating a saved skip activation measured one 14 MB buffer
      where one copy more was counted).
      That holds where the backward has Inductor's layout optimization (``relayouts``: it
      recomputes a convolution). Without it, ``constrain_conv_bwd_to_fx_strides`` asks the
      convolution backward for its operands in their traced strides, and a concatenation laid
      out channels-last for such a part but traced otherwise is copied for the call: one more
      (a U-Net's Rotor plan at 0.6 recomputing no convolution: a 3 MB concatenation written
      twice at the measured peak, 2.1 MB over its prediction when counted once);
    - read by it alone otherwise (every part computed in its kernel from values laid out
      otherwise): the concatenation and one copy for the call.
    """
    users = set(cat.users)
    if not any(u.target is _CONV_BACKWARD and cat in u.args[:2] for u in users):
        return 0
    if not any(a.op == "call_function" and not oplib.is_compute_intensive(a) and not oplib.is_getitem(a)
               for a in cat.args[0] if isinstance(a, NODES)):
        return 0
    if len(users) > 1:
        return 2
    if cat in prefers_channels_last:
        return 0
    fixed = any(isinstance(a, NODES) and _fixed_channels_last(a, channels_last_inputs) for a in cat.args[0])
    if fixed and not relayouts:
        return 0 if _channels_last_ordered(cat.meta.get("val")) else 1
    return 0 if fixed else 1


def _fixed_channels_last(node: fx.Node, channels_last_inputs: set[str]) -> bool:
    """Is this value a buffer whose layout is fixed channels-last before any kernel of this
    graph reads it: an input that arrives so, a convolution's output or a convolution
    backward's gradient?"""
    if node.op == "placeholder":
        return node.name in channels_last_inputs
    return node.target is _CONVOLUTIONS[0] or (
        oplib.is_getitem(node) and isinstance(node.args[0], NODES) and node.args[0].target is _CONV_BACKWARD)


def channels_last_buffers(inlining: Inlining, prefers_channels_last: set[fx.Node],
                          channels_last_inputs: set[str]) -> Callable[[fx.Node], bool]:
    """Is a value a buffer laid out channels-last, as a lowering that reads its strides sees
    it (Inductor's max-pool backward: ``Inlining.channels_last_buffer``): fixed so as it
    arrives or is made (``_fixed_channels_last``), or laid out so by the layout optimization
    where it is written (``prefers_channels_last``, not inlined)? A value not yet written has
    no strides."""
    return lambda n: _fixed_channels_last(n, channels_last_inputs) or (
        n in prefers_channels_last and not inlining.fused_away(n))


def _scatter_operands_copied(scatter: fx.Node, prefers_channels_last: set[fx.Node],
                             channels_last_inputs: set[str]) -> list[fx.Node]:
    """The index and source of an ATen scatter (``_compat.inductor_scatters_in_aten``) that
    Inductor copies into buffers of their own for the call: views that flatten a 4-d value
    laid out channels-last (``_laid_out_channels_last``), which no strides can express. A
    max-pool's backward scatters its output's gradient (a convolution backward's output)
    through the indices computed from its offsets, both laid out channels-last: two copies
    beside the indices and the scatter's output, measured on the zoo's CNN (16% over its
    prediction without them) and issue #27's U-Net."""
    memo: dict[fx.Node, bool] = {}
    found = []
    for a in (scatter.args[2], scatter.args[3]) if len(scatter.args) > 3 else ():
        if not (isinstance(a, NODES) and oplib.is_view(a) and isinstance(a.args[0], NODES)):
            continue
        base, val = a.args[0], a.meta.get("val")
        base_val = base.meta.get("val")
        if (isinstance(val, torch.Tensor) and isinstance(base_val, torch.Tensor) and base_val.dim() == 4
                and val.dim() != 4 and _laid_out_channels_last(base, prefers_channels_last, channels_last_inputs, memo)):
            found.append(a)
    return found


def _laid_out_channels_last(node: fx.Node, prefers_channels_last: set[fx.Node], channels_last_inputs: set[str],
                            memo: dict[fx.Node, bool]) -> bool:
    """Is this 4-d value laid out channels-last by Inductor: a convolution's output or its
    gradients, a value its layout optimization claims, an input that arrives so, or a kernel
    of its own over one of those (a pointwise value takes its inputs' layout)?"""
    found = memo.get(node)
    if found is not None:
        return found
    if _fixed_channels_last(node, channels_last_inputs) or node in prefers_channels_last:
        found = True
    elif node.op == "call_function" and oplib.is_inductor_pointwise(node) and not oplib.is_reduction(node):
        # an item of a tuple lowered item by item (a max-pool's offsets) is computed from the op's inputs
        inputs = node.args[0].all_input_nodes if oplib.is_getitem(node) else node.all_input_nodes
        found = any(isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dim() == 4
                    and _laid_out_channels_last(a, prefers_channels_last, channels_last_inputs, memo)
                    for a in inputs)
    else:
        found = False
    memo[node] = found
    return found


# The views Inductor lowers with ``View.create``: a value already written in a layout still
# flexible is frozen contiguous there (``create_reinterpret_view``), whatever its kernel reads.
_VIEWS_FREEZING_CONTIGUOUS = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
                                        torch.ops.aten.reshape.default, torch.ops.aten.unsqueeze.default})


def _inductor_layout(node: fx.Node, inlining: Inlining, prefers_channels_last: set[fx.Node],
                     channels_last_inputs: set[str], relayouts: Callable[[], bool],
                     channels_last_memo: dict[fx.Node, bool] | None = None) -> str | None:
    """How Inductor lays out the buffer of this value, where that is fixed apart from how its
    own kernel reads: ``"channels_last"``, ``"contiguous"``, or None (a layout Inductor picks
    from the order its kernel reads its inputs in, which includes the buffer it would be
    written over; or a shape where the two orders are one). Inductor writes a value in place
    over a buffer only where it reads that buffer at the indices it writes
    (``SchedulerNode.can_inplace``), so two fixed layouts that differ rule it out (a U-Net's
    group-norm backward: the product of a convolution backward's gradient, channels-last, and
    of the recomputed group norm's SiLU derivative, which the backward reshapes to its groups,
    is written contiguous beside that gradient, not over it; counted as written over it, the
    plan at per-block checkpointing's peak measured 1 MiB, 7.6%, over its prediction).

    - a convolution's output or gradient, an input that arrives channels-last: channels-last;
    - a value a convolution backward reads reshaped (through views that are each one's only
      reader), in a graph Inductor lays out channels-last: contiguous (and copied for the call,
      ``_reshaped_for_convolution_backward``);
    - a value the layout optimization claims (``prefers_channels_last``): channels-last;
    - a value a convolution backward reads (directly, or through views that are each one's
      only reader, none a reshape): channels-last where it reads a channels-last value
      (``_laid_out_channels_last``), else left to its kernel;
    - a pointwise value Inductor writes where it is computed (``StorageBox.mark_reuse``: several
      readers) and reshapes (``View.create`` freezes its flexible layout contiguous);
    - another input: the strides it arrives in.

    ``channels_last_memo``: the graph's memo for ``_laid_out_channels_last`` (a fresh one per
    call walks a value's pointwise ancestry again each time)."""
    val = node.meta.get("val")
    if (not isinstance(val, torch.Tensor) or val.dim() != 4
            or val.shape[1] == 1 or val.shape[2] * val.shape[3] == 1):  # one order
        return None
    if node.op == "placeholder":
        if node.name in channels_last_inputs:
            return "channels_last"
        return "contiguous" if val.is_contiguous() else ("channels_last" if _channels_last_ordered(val) else None)
    if _fixed_channels_last(node, channels_last_inputs):
        return "channels_last"
    if node.op != "call_function" or not oplib.is_inductor_pointwise(node) or oplib.is_reduction(node):
        return "channels_last" if node in prefers_channels_last else None
    operand, reader, reshaped = _operand_through_views(node)
    if reader is not None and reader.target is _CONV_BACKWARD and operand in reader.args[:2] and reshaped and (
            relayouts()):
        return "contiguous"  # and copied for the call (``_reshaped_for_convolution_backward``)
    if node in prefers_channels_last:
        return "channels_last"
    if reader is None:
        reader = next((u for u in node.users if u.target is _CONV_BACKWARD and node in u.args[:2]), None)
    if reader is not None and reader.target is _CONV_BACKWARD and operand in reader.args[:2]:
        # (written for the call as its kernel reads, or in the strides the compiled graph
        # traces it in, which follow its inputs' as that does: channels-last after a
        # channels-last input. A small bottleneck ResNet's batch-norm gradient, read by the
        # convolution backward alone in a backward without the layout optimization, is written
        # over the saved convolution output it reads, channels-last.)
        laid_out = _laid_out_channels_last(node, prefers_channels_last, channels_last_inputs,
                                           {} if channels_last_memo is None else channels_last_memo)
        return "channels_last" if laid_out else None
    if len(node.users) > 1 and not inlining.fused_away(node) and any(
            u.target in _VIEWS_FREEZING_CONTIGUOUS and isinstance(u.meta.get("val"), torch.Tensor)
            and tuple(u.meta["val"].shape) != tuple(val.shape) for u in node.users):
        return "contiguous"
    return None


def _operand_through_views(node: fx.Node) -> tuple[fx.Node, fx.Node | None, bool]:
    """Follow ``node``'s only reader through views each one's only reader: the last view (or
    the node), the reader past them (None where a value or view has several), and whether a
    view on the way is one ``View.create`` lowers with a new shape (a reshape)."""
    operand, reshaped = node, False
    while len(operand.users) == 1:
        (user,) = operand.users
        if not (user.op == "call_function" and oplib.is_view(user)):
            return operand, user, reshaped
        reshaped = reshaped or (user.target in _VIEWS_FREEZING_CONTIGUOUS
                                and isinstance(user.meta.get("val"), torch.Tensor)
                                and tuple(user.meta["val"].shape) != tuple(operand.meta["val"].shape))
        operand = user
    return operand, None, reshaped


def _reshaped_for_convolution_backward(node: fx.Node, relayouts: Callable[[], bool]) -> list[tuple[fx.Node, fx.Node]]:
    """``(view, convolution backward)`` where a convolution backward, in a graph Inductor lays
    out channels-last, reads this written value reshaped: Inductor writes the value itself
    (contiguous: ``View.create`` cannot reindex a value not yet written, and the library call
    realizes it) and then a channels-last copy of the reshaped view for the call, alive until
    the call returns (a U-Net's group-norm backward: the input gradient computed per group,
    ``(N, G, C/G, H*W)``, reshaped to ``(N, C, H, W)`` for the convolution's backward; the plan at
    per-block checkpointing's peak under the calibrated CPU profile measured two 1 MiB buffers
    where one was counted)."""
    operand, reader, reshaped = _operand_through_views(node)
    if (reshaped and reader is not None and reader.target is _CONV_BACKWARD and operand in reader.args[:2]
            and relayouts()):
        return [(operand, reader)]
    return []


def _same_layout_donors(node: fx.Node, reads: frozenset[str], owner: dict[str, fx.Node],
                        layouts: Callable[[fx.Node], str | None]) -> frozenset[str] | None:
    """The storages ``node``'s output may be written over (``Step.donors``), None for all it
    reads: not one whose layout (``_inductor_layout``) is fixed otherwise than the output's,
    nor a channels-last one that a view reshapes (its kernel reads it at more than one index,
    ``single_index_in_fused_node``: a U-Net's recomputed convolution output, read reshaped to
    its groups by the group norm's statistics and whole by the gradient, was not written over
    by that gradient)."""
    mine = layouts(node)
    kept = frozenset(s for s in reads if s not in owner or _may_donate(owner[s], mine, layouts))
    return None if len(kept) == len(reads) else kept


def _may_donate(donor: fx.Node, layout: str | None, layouts: Callable[[fx.Node], str | None]) -> bool:
    theirs = layouts(donor)
    val = donor.meta.get("val")
    if layout == "channels_last" and isinstance(val, torch.Tensor) and val.dim() != 4:
        # A buffer of another rank is laid out row-major, so a view of it in the writer's shape
        # reads it contiguous, not channels-last (a max-pool backward's scatter, made as
        # (channels, pixels), was not written over by the channels-last gradient that read it).
        return False
    if theirs == "channels_last" and any(
            u.op == "call_function" and oplib.is_view(u) and isinstance(u.meta.get("val"), torch.Tensor)
            and tuple(u.meta["val"].shape) != tuple(donor.meta["val"].shape) for u in donor.users):
        return False
    return layout is None or theirs is None or theirs == layout


def _viewed_value(node: fx.Node) -> fx.Node:
    """The node whose value ``node`` is, through views (``node`` itself if no view)."""
    while (node.op == "call_function" and oplib.is_view(node) and not oplib.is_getitem(node)
           and node.args and isinstance(node.args[0], NODES)):
        node = node.args[0]
    return node


def written_at_reader(node: fx.Node) -> fx.Node | None:
    """The library call right before which Inductor computes this value, if that is not where
    the graph puts it: a pointwise value with one reader, through views with one reader each,
    that reader a library call (a clone of an attention's ``v`` for its ``bmm``). Inductor
    writes such a value only when lowering that call (``ExternKernel.realize_input``):
    ``GraphLowering.run_node`` realizes a value at its own node only for several readers,
    an output, or too big a body to inline."""
    if (node.op != "call_function" or not oplib.is_inductor_pointwise(node) or oplib.is_view(node)
            or oplib.is_getitem(node)
            or oplib.is_reduction(node) or is_multi_output(node) or _lazy_constant(node)
            # a concatenation Inductor makes a kernel of its own is written where it is lowered
            # (a U-Net's recomputed skip concatenation, read by its convolution backward alone,
            # was written before the previous block's convolution backward and held to its own:
            # 786 KiB over the least plan's prediction when counted at that reader)
            or (node.target is _CAT and _compat.inductor_writes_every_cat(_device_type(node)))):
        return None
    user = node
    while True:
        users = list(user.users)
        if len(users) != 1 or users[0].op != "call_function":
            return None
        user = users[0]
        if not oplib.is_view(user):
            return user if library_call(user) else None


def _graph_device_type(gm: fx.GraphModule) -> str:
    """The device of the graph's first tensor (its inputs'); "cpu" for a graph without one."""
    for node in gm.graph.nodes:
        if isinstance(node.meta.get("val"), torch.Tensor):
            return node.meta["val"].device.type
    return "cpu"


def _device_type(node: Any) -> str:
    val = node.meta.get("val")
    return val.device.type if isinstance(val, torch.Tensor) else "cpu"


def _view_with_gaps(node: Any) -> bool:
    """Is ``node`` a view whose elements leave gaps in their span (strides of a slice, not
    of a broadcast; dimensions of size 1 ignored), so a library that needs dense memory
    copies it?"""
    if not (isinstance(node, NODES) and is_alias(node)):
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    dims = sorted((_hint(st), _hint(n)) for n, st in zip(val.shape, val.stride()) if _hint(n) != 1)
    if any(stride == 0 for stride, _ in dims):
        return False  # a broadcast (a loss's gradient expanded): read as it is, no copy measured
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return True
        expected *= size
    return False


def _read_out_of_order(view: fx.Node) -> bool:
    """Does reading the view ``view`` element by element, in row-major order, not walk its
    storage from its start (a permutation, a slice, a broadcast, an offset; dimensions of size 1
    ignored)? Inductor's kernels write their outputs in row-major order, so such a read is at
    another index than the write."""
    return per_meta("out_of_order", view, _out_of_order)


def _out_of_order(view: fx.Node) -> bool:
    val = view.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    if _hint(val.storage_offset()) != 0:
        return True
    expected = 1
    for size, stride in reversed(list(zip(val.shape, val.stride()))):
        if _hint(size) == 1:
            continue
        if _hint(stride) != expected:
            return True
        expected *= _hint(size)
    return False


def _channel_slice(node: Any) -> bool:
    """Is ``node`` a proper slice of a 4-d tensor's channels (``x[:, a:b]``)?"""
    if not (isinstance(node, NODES) and node.op == "call_function" and node.target is torch.ops.aten.slice.Tensor):
        return False
    base, val = node.args[0].meta.get("val"), node.meta.get("val")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return (isinstance(val, torch.Tensor) and val.dim() == 4 and dim == 1
            and isinstance(base, torch.Tensor) and val.shape[1] != base.shape[1])


def _storage_of(node: fx.Node, seen: dict[fx.Node, str | None]) -> str | None:
    """``sizes.storage_of(node)``, reading an alias's base off ``seen`` (the storages of
    the nodes before it): one step, not a walk down the chain of views."""
    if node.args and isinstance(node.args[0], NODES) and is_alias(node):
        return seen[node.args[0]] if node.args[0] in seen else storage_of(node)
    return node.name if flat_tensors(node.meta.get("val")) else None  # no alias: its own storage


def _output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(iter(gm.graph.find_nodes(op="output")))
    return [a for a in out.args[0] if isinstance(a, NODES)]


def _channels_last_ordered(val) -> bool:
    """Are the strides of a 4-d tensor in channels-last order, dimensions of size 1 ignored
    (Inductor's ``Layout.is_stride_ordered``, the test of ``require_channels_last``)?"""
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        return False
    strides = [val.stride(d) for d in (1, 3, 2, 0) if val.shape[d] != 1]  # innermost first
    return all(a <= b for a, b in zip(strides, strides[1:]))


def inputs_relaid_if_returned(fwd: fx.GraphModule, *, relayouts: bool | None = None) -> set[str]:
    """Forward inputs that a convolution reads and that Inductor would lay out channels-last
    where they are defined if the forward returned them (``relaid_inputs``), given the
    layout optimization it chooses for the graph.

    An input whose strides already are in channels-last order once its dimensions of size 1
    are ignored is only reinterpreted, not copied: a 1x1 convolution's weight (O, I, 1, 1)
    (measured on the bottleneck ResNet-50: counting a copy of every 1x1 weight, saved for the
    backward, put the backward's start 0.76 MB, 8%, above Inductor's). ``relayouts``:
    Inductor's layout decision for ``fwd`` where the caller has it
    (``_compat.inductor_relayouts_convolutions``)."""
    convs = list(fwd.graph.find_nodes(op="call_function", target=torch.ops.aten.convolution.default))
    if not convs or not (_compat.inductor_relayouts_convolutions(fwd) if relayouts is None else relayouts):
        return set()
    return {a.name for c in convs for a in c.args[:2] if isinstance(a, NODES) and a.op == "placeholder"
            and not _channels_last_ordered(a.meta.get("val"))}


def relaid_inputs(fwd: fx.GraphModule, *, relaid_if_returned: set[str] | None = None) -> set[str]:
    """Forward inputs Inductor copies to channels-last for its convolutions where they are
    defined: those of ``inputs_relaid_if_returned`` that the forward returns as they are. The
    copy is what it returns, so a saved one is held until the backward's last use
    (``GraphLowering.run_node`` gives a returned value the strides of its layout
    optimization); every other convolution input is copied by the convolution that reads it
    (``conv_copied_inputs``). ``relaid_if_returned``: ``inputs_relaid_if_returned(fwd)``
    where the caller has it."""
    maybe = inputs_relaid_if_returned(fwd) if relaid_if_returned is None else relaid_if_returned
    if not maybe:
        return set()
    returned = next(iter(fwd.graph.find_nodes(op="output"))).args[0]
    return {a.name for a in returned if isinstance(a, NODES) and a.name in maybe}


def conv_copied_inputs(gm: fx.GraphModule, arrive_channels_last: set[str] = frozenset(), *,
                       relayouts: bool | None = None, relaid: set[str] | None = None) -> set[str]:
    """Inputs of a graph that its convolutions copy channels-last for themselves, each while
    it runs: those neither in channels-last order nor laid out so where the graph starts
    (``relaid_inputs``, or a backward's saved activations Inductor laid out so in the
    forward), read by a convolution in a graph whose layout optimization is on
    (``kernel/conv.py``'s ``require_channels_last``), or as the input of a convolution
    backward whose weight arrives channels-last (Inductor asks the input for the stride
    order of the weight's gradient). The forward hands its inputs on as given where it
    returns them through views (``fx_passes.return_inputs_as_given``), so the backward's
    recomputed convolutions and its convolution backwards copy them again. ``relayouts``,
    ``relaid``: Inductor's layout decision for ``gm`` and ``relaid_inputs(gm)``, where the
    caller has them (each asks Inductor's heuristic again)."""
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _CONVOLUTIONS]
    if not convs:
        return set()
    if relayouts is None:
        relayouts = _compat.inductor_relayouts_convolutions(gm)
    if relaid is None:
        relaid = relaid_inputs(gm, relaid_if_returned=inputs_relaid_if_returned(gm, relayouts=relayouts))
    laid_out = set(relaid) | set(arrive_channels_last)

    def copied(a: fx.Node) -> bool:
        return (a.op == "placeholder" and a.name not in laid_out
                and not _channels_last_ordered(a.meta.get("val")))

    found = set()
    for c in convs:
        weight = c.args[2] if c.target is _CONV_BACKWARD else c.args[1]
        if relayouts:
            found |= {a.name for a in _conv_activations_and_weight(c) if copied(a)}
        elif (c.target is _CONV_BACKWARD and isinstance(weight, NODES) and weight.name in laid_out
              and c.args[1] in _conv_activations_and_weight(c) and copied(c.args[1])):
            found.add(c.args[1].name)
    return found


def _output_mask(conv_backward: fx.Node) -> tuple[bool, ...]:
    """Which gradients a convolution backward computes: (input, weight, bias)."""
    mask = conv_backward.args[-1]
    return tuple(mask) if isinstance(mask, (list, tuple)) else (True, True, True)


def _computes_weight_gradient(conv_backward: fx.Node) -> bool:
    """Does this convolution backward compute its weight's gradient (reading its input)?"""
    mask = _output_mask(conv_backward)
    return len(mask) > 1 and bool(mask[1])


def _conv_activations_and_weight(conv: fx.Node) -> list[fx.Node]:
    """What a convolution (or its backward) needs laid out channels-last: its input and
    weight (the backward: its input when it computes the weight's gradient, its weight when
    it computes the input's)."""
    if conv.target is _CONV_BACKWARD:
        args = ([conv.args[2]] if _output_mask(conv)[0] else []) + (
            [conv.args[1]] if _computes_weight_gradient(conv) else [])
    else:
        args = list(conv.args[:2])
    return [a for a in args if isinstance(a, NODES)]


def predict(fwd: fx.GraphModule, bwd: fx.GraphModule, num_user_outputs: int,
            relaid: set[str] = frozenset(), fusion: bool = False, hold_outputs: bool = True,
            workspace: Callable[[fx.Node], int] | None = None, symbolic: bool = False,
            later_graphs: tuple[int, int] = (0, 0)) -> Timeline:
    """``relaid``: forward inputs the compiler copies to another layout (``relaid_inputs``);
    ``fusion``: model Inductor's fusion (values it never writes to memory); ``hold_outputs``:
    the caller keeps the forward's user outputs to the end of the step, else they are
    released when the forward returns (unless the backward reads them: saved);
    ``workspace(node)``: a library kernel's scratch bytes, alive while it runs
    (``workspace.library_workspace_bytes`` for op-by-op execution); ``symbolic``: live bytes as
    sympy expressions in the size symbols (the timeline then has no peak: ``peak_expressions``);
    ``later_graphs``: the bytes the step's later graphs need between this graph's forward and
    its backward, and the part of them they keep to the step's end (``Budget.later_graphs``,
    ``later_graphs_kept``): a step of their own there, while the forward's outputs (which
    those graphs read) and its saved activations are alive; what they keep stays through
    this graph's backward."""
    # Channels-last convolutions (Inductor's layout optimization), even where no input needs a copy.
    # Inductor's layout heuristic asked once (it reads every node).
    relayouts = fusion and layout_optimized(fwd)
    channels_last = bool(relaid) or relayouts
    relaid_if_returned = inputs_relaid_if_returned(fwd, relayouts=relayouts) if fusion else set()
    fwd_prefers = _compat.inductor_prefers_channels_last(fwd) if fusion and channels_last else set()
    conv_copied = (conv_copied_inputs(fwd, relayouts=relayouts,
                                      relaid=relaid_inputs(fwd, relaid_if_returned=relaid_if_returned))
                   if fusion else set())
    fwd_steps, fwd_storage = _graph_steps(fwd, "forward", {}, relaid, fusion, channels_last=channels_last,
                                          workspace=workspace, symbolic=symbolic, prefers_channels_last=fwd_prefers,
                                          conv_copied=conv_copied)
    # The backward's saved inputs arrive in the storages the forward returned them in.
    fwd_out_args = list(next(iter(fwd.graph.find_nodes(op="output"))).args[0])
    rename = {}
    for node in bwd.graph.find_nodes(op="placeholder"):
        if node.name in fwd_storage:
            rename[node.name] = fwd_storage[node.name]
        elif node.name.startswith("tangents"):
            rename[node.name] = f"backward:{node.name}"
    # Saved activations Inductor laid out channels-last in the forward arrive so in the backward;
    # the inputs a convolution reads arrive so only where the forward returned their copies.
    as_given = relaid_if_returned - set(relaid) if channels_last else set()
    arrive_channels_last = {n.name for n in fwd_prefers if n.name not in as_given}
    bwd_relayouts = fusion and layout_optimized(bwd)
    bwd_steps, bwd_storage = _graph_steps(bwd, "backward", rename, fusion=fusion, channels_last=channels_last,
                                          workspace=workspace, symbolic=symbolic,
                                          channels_last_inputs=arrive_channels_last,
                                          conv_copied=(conv_copied_inputs(bwd, arrive_channels_last,
                                                                          relayouts=bwd_relayouts)
                                                       if fusion else set()),
                                          relayouts=bwd_relayouts)
    bwd_outputs = {bwd_storage[n.name] for n in _output_nodes(bwd) if bwd_storage.get(n.name)}
    user_outputs = {
        s for a in fwd_out_args[:num_user_outputs] if isinstance(a, NODES)
        for s in [fwd_storage.get(a.name)] if s
    }
    # what the caller holds through the backward: every output, or (``hold_outputs=False``)
    # the loss ``loss.backward()`` holds (``sizes.held_outputs``)
    keep = bwd_outputs | {s for a in held_outputs(fwd_out_args[:num_user_outputs], hold_outputs)
                          if isinstance(a, NODES) for s in [fwd_storage.get(a.name)] if s}
    # The incoming gradients live until the backward returns where autograd's engine hands
    # them to the compiled backward in a tuple it holds through the call (torch 2.11). Where
    # it hands them in a list the backward empties (2.13), each is freed at its last use
    # (Hugging Face GPT-2's least plan: its logits gradient, 1 MiB, counted to the end,
    # predicted 14% over the step's measured peak), but for a scalar's: the loss's seed
    # gradient, which ``loss.backward()`` holds until the backward is done.
    keep |= {rename[n.name] for n in bwd.graph.find_nodes(op="placeholder")
             if n.name.startswith("tangents") and n.name in rename and incoming_gradient_held(n)}
    if not hold_outputs:
        # Alive until the forward returns them; the caller drops them after its loss (HF
        # GPT-2 with the loss after a graph break: the logits, 1 MiB, were counted through
        # the whole backward beside their own gradient, 10% over the measured peak), but for
        # the loss itself (kept above).
        fwd_steps.append(Step("return", reads=sorted(user_outputs), phase="forward"))
    need, kept = later_graphs
    if need or kept:
        # Their peak with what they keep counted once: the kept part is a storage of its own.
        allocates = {LATER_GRAPHS_STORAGE: max(need - kept, 0), LATER_GRAPHS_KEPT: kept}
        fwd_steps.append(Step(LATER_GRAPHS, allocates={s: n for s, n in allocates.items() if n},
                              reads=sorted(user_outputs), phase="between"))
        keep = keep | {LATER_GRAPHS_KEPT}
    return simulate(fwd_steps + bwd_steps, keep=keep)


def backward_opening(timeline: Timeline, backward_nodes: set[str], forward_nodes: set[str]
                     ) -> tuple[int, list[Step]]:
    """The least that a plan's first backward steps add to the bytes alive as its backward
    begins (once the incoming gradients have arrived), and those steps: the steps of the
    nodes in ``backward_nodes`` that open the backward, up to the first that reads a storage
    neither alive then nor made by the steps before it. ``forward_nodes``: the forward values
    (by node name) that only these nodes and the forward read.

    What it is for (``StagedProblem.lower_bound``): another plan whose backward opens with the
    same steps reaches at least the bytes alive as its backward begins plus these. The steps
    allocate the same storages in both plans, and free the same of what they make and of the
    incoming gradients and ``forward_nodes``' values (their readers are the same nodes in
    both). Any other storage they read may live on in one plan and not in the other (read
    again by a recomputation), so it is taken as freed after its last read among these steps:
    what they add then is the least that any plan opening with them adds."""
    steps = timeline.steps
    first = _backward_begins(steps)
    alive: dict[str, int] = {}

    def observe(index: int, storage: str, nbytes: int) -> None:
        if index < first:
            if nbytes > 0:
                alive[storage] = nbytes
            else:
                alive.pop(storage, None)

    simulate(steps, keep=timeline.kept, observe=observe)
    made: set[str] = set()
    opening: list[Step] = []
    for step in steps[first:]:
        if step.name not in backward_nodes or any(s not in alive and s not in made for s in step.reads):
            break
        opening.append(step)
        made.update(step.allocates)
    if not opening:
        return 0, []

    def foreign(storage: str) -> bool:
        phase, _, rest = storage.partition(":")
        return storage in alive and not (phase == "backward" and rest.startswith("tangents")
                                         or phase == "forward" and rest.split(":")[0] in forward_nodes)

    read_later = {s for step in steps[first + len(opening):] for s in step.reads}
    least = simulate(opening, live_at_start=alive,
                     keep=set(timeline.kept) | {s for s in read_later if not foreign(s)})
    return max(least.live_bytes) - sum(alive.values()), opening


def opens_with(timeline: Timeline, opening: list[Step]) -> bool:
    """Does the backward of ``timeline`` open with ``opening`` (``backward_opening``'s steps)?"""
    first = _backward_begins(timeline.steps)
    return timeline.steps[first:first + len(opening)] == opening


def _backward_begins(steps: list[Step]) -> int:
    """The index of the first backward step after the incoming gradients arrive."""
    first = next((i for i, s in enumerate(steps) if s.phase == "backward"), len(steps))
    while first < len(steps) and not steps[first].reads and steps[first].allocates and all(
            s.startswith("backward:tangents") for s in steps[first].allocates):
        first += 1
    return first


# The step between a graph's forward and its backward where the step's later graphs run
# (``predict``'s ``later_graphs``), and the storages that stand for what they need: for a
# moment, and to the step's end.
LATER_GRAPHS = "the step's later graphs"
LATER_GRAPHS_STORAGE = "between:later graphs"
LATER_GRAPHS_KEPT = "between:later graphs' gradients"


# The kinds a predicted timeline's bytes are stacked by in reports (``live_by_kind``).
KINDS = ("saved activations", "temporaries", "library workspace", "incoming gradients", "gradients", "outputs",
         "later graphs")


def storage_kind(timeline: Timeline) -> Callable[[str], str]:
    """The kind (``KINDS``) of each storage of a timeline that ``predict`` made, by the
    storage names ``_graph_steps`` gives ("forward:<node>", "backward:tangents_1",
    "<phase>:<node>:workspace"): a forward storage the backward reads is a saved
    activation; what the step keeps to its end is a gradient (made by the backward) or an
    output (by the forward, which the caller holds); the tangents are the incoming
    gradients; the rest are temporaries."""
    first_backward = next((i for i, s in enumerate(timeline.steps) if s.phase == "backward"), len(timeline.steps))
    last_read: dict[str, int] = {}
    for i, step in enumerate(timeline.steps):
        for s in step.reads:
            last_read[s] = i

    def kind(storage: str) -> str:
        phase, _, rest = storage.partition(":")
        if storage.endswith(":workspace"):
            return "library workspace"
        if storage in (LATER_GRAPHS_STORAGE, LATER_GRAPHS_KEPT):
            return "later graphs"
        if storage in timeline.kept:
            return "gradients" if phase == "backward" else "outputs"
        if phase == "backward" and rest.startswith("tangents"):
            return "incoming gradients"
        if phase == "forward" and last_read.get(storage, -1) >= first_backward:
            return "saved activations"
        return "temporaries"

    return kind


def storage_events(timeline: Timeline) -> list[tuple[int, str, int]]:
    """The allocations and frees of a predicted timeline, in order: ``(step index, storage,
    bytes)``, bytes negative for a free (``simulate``'s ``observe``: the same rules)."""
    events: list[tuple[int, str, int]] = []
    again = simulate(timeline.steps, keep=timeline.kept, observe=lambda i, s, n: events.append((i, s, n)))
    if again.live_bytes != timeline.live_bytes:
        raise AssertionError("fxremat bug: the timeline simulated again differs from the prediction")
    return events


def live_by_kind(timeline: Timeline) -> list[dict[str, int]]:
    """For each step of a predicted timeline, its live bytes by kind (``storage_kind``);
    each step's kinds sum to its live bytes."""
    kind = storage_kind(timeline)
    events = storage_events(timeline)
    by_kind: dict[str, int] = {}
    profile: list[dict[str, int]] = []
    k = 0
    for i in range(len(timeline.steps)):
        # While step i runs: its allocations, and the frees of storages it writes over in
        # place (each followed by its taker's allocation); after it: its other frees.
        while k < len(events) and events[k][0] == i and (
                events[k][2] > 0 or (k + 1 < len(events) and events[k + 1][0] == i and events[k + 1][2] > 0)):
            by_kind[kind(events[k][1])] = by_kind.get(kind(events[k][1]), 0) + events[k][2]
            k += 1
        profile.append({name: n for name, n in by_kind.items() if n})
        while k < len(events) and events[k][0] == i:
            by_kind[kind(events[k][1])] += events[k][2]
            k += 1
    return profile


def step_modules(fwd: fx.GraphModule, bwd: fx.GraphModule, timeline: Timeline) -> list[str]:
    """The module path (``joint.module_path``) of each step of the timeline ``predict``
    made of ``fwd`` and ``bwd``; "" for steps no module made (tangents, the loss)."""
    from .joint import module_path

    nodes = {"forward": {n.name: n for n in fwd.graph.nodes}, "backward": {n.name: n for n in bwd.graph.nodes}}
    return [module_path(node) if node is not None else ""
            for step in timeline.steps for node in [nodes.get(step.phase, {}).get(step.name)]]
