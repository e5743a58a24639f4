"""Runtime estimates of FX graphs: roofline per kernel, kernels as Inductor would fuse them.

    profile = costmodel.profile_for("cpu")               # or "cuda", torch.device, a DeviceProfile
    est = costmodel.estimate_graph(gm, profile)          # GraphEstimate(total_s, per_group)
    step = costmodel.estimate_step(fwd_gm, bwd_gm, profile)

**Device profiles** (``DeviceProfile``, in ``devices.py``): peak FLOP/s per dtype class
for compute-intensive ops, the elementwise rate, memory (and cache) bandwidth, a launch
overhead; GPU datasheet figures (``H100_SXM``, ``H200``, ...) or the measured CPU
(``calibrate_cpu``, ``DEFAULT_CPU`` when not calibrated). ``profile_for`` picks one.

**Per node** (``node_flops``, ``node_bytes_moved``, ``node_time``): FLOPs from torch's flop
counter formulas (``torch.utils.flop_counter.flop_registry``, fed the fake tensors in
``node.meta["val"]``) for the ops it knows, otherwise one FLOP per output element
(``TRANSCENDENTAL_FLOPS`` for exp, log, erf, tanh, ...; per input element for reductions);
bytes are inputs read plus outputs written, views free; time =
``max(flops / peak, bytes / bandwidth) + launch overhead``.

**Per graph** (``kernel_groups``, ``estimate_graph``): fusible ops (``oplib.is_fusible``:
pointwise, reductions, copies) joined to their fusible producers form one kernel, as
Inductor fuses them; compute-intensive and unfusible ops are kernels of their own (library
calls). A pointwise value Inductor never writes (``timeline.Inlining``, the timeline's
store-or-inline rule: ``computed_in_readers``) is in no kernel: every kernel that reads it
computes it, paying its work and its inputs' reads (``kernel_bodies``). A kernel moves its
external reads (each storage once a pass) plus the values it materializes, so a chain of
pointwise ops moves its bytes once; it costs its roofline time plus one launch overhead.
(``node_costs``, which prices the joint graph's ops for Rotor's stages, groups without that
rule: which recomputed values a backward inlines depends on the plan.) A reduction over at least ``PASS_REDUCTION_ELEMENTS``
elements per output is a loop of its own: what the kernel computes from its result is a
second pass, which reads the kernel's inputs again (a batch norm's normalized output).

**Measured mode** (``OpTimer``, in ``optimer.py``): time kernels on the device with random
inputs of the nodes' shapes, strides and dtypes, cached on disk; by default only the library
kernels (matmul, convolution, unfusible ops), keeping the roofline for fused kernels;
``scope="all"`` times those too (op by op: an upper bound).

Approximations, stated: bandwidth is the cache's for a kernel touching less than the
cache holds (on a CPU the core's own cache, ``DeviceProfile.cache_bytes``; datasheets give no
L2 bandwidth, so GPU profiles always use HBM bandwidth), otherwise the memory's; whether a kernel's output
buffer is still in cache (Inductor reusing a just-freed buffer, or a cold one) is not
modelled, and on CPU it can change a pointwise kernel's time by 2x (bench/runtime_ranking.py);
kernels do not overlap; the fusion groups follow fxremat's op classes, not Inductor's
scheduler (which may split a group into a few kernels, e.g. reductions over different axes);
matmul efficiency does not depend on shape (``OpTimer`` measures it).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import torch
import torch.fx as fx

from . import memo, oplib
from .aliasing import is_alias, readers, storage_node
from .devices import (A100_80GB, A100_80GB_PCIE, CALIBRATION_VERSION, DEFAULT_CPU, GPU_PROFILES, H100_PCIE, H100_SXM,
                      H200, DeviceProfile, cache_dir, calibrate_cpu, cpu_profile, dtype_class, gpu_profile, profile_for)
from .optimer import OpTimer
from .sizes import _hint, flat_tensors, is_multi_output, node_bytes, tensor_bytes
from .timeline import Inlining
from .lite import NODES

aten = torch.ops.aten

# Cost, in simple elementwise operations, of one element of a transcendental op (exp,
# log, erf, tanh, ...), which vector code evaluates by range reduction and a polynomial.
# Arithmetic, comparisons, selects, sqrt and division count one. Microbenchmark of
# Inductor's C++ code (AMD EPYC, 1 thread, data in cache), per element relative to one
# add or mul: exp ~17, sigmoid ~17, erf ~25, log ~27, tanh ~70; 20 stands for all of them.
TRANSCENDENTAL_FLOPS = 20

_TRANSCENDENTAL = frozenset([
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "erf", "erfc", "erfinv", "tanh", "sigmoid",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "pow",
    "gelu", "gelu_backward", "silu", "silu_backward", "mish", "elu", "softplus", "logit", "lgamma", "digamma",
    "tanh_backward", "sigmoid_backward", "special_erfcx", "logaddexp", "xlogy",
])



# --- per node ---------------------------------------------------------------------------------


def _numel(t: torch.Tensor) -> int:
    return _hint(t.numel())


def _meta(arg):
    """An FX argument with nodes replaced by their fake values."""
    if isinstance(arg, NODES):
        return arg.meta.get("val")
    if isinstance(arg, (list, tuple)):
        return type(arg)(_meta(a) for a in arg)
    if isinstance(arg, dict):
        return {k: _meta(v) for k, v in arg.items()}
    return arg


def _packet(node: fx.Node):
    return node.target.overloadpacket if isinstance(node.target, torch._ops.OpOverload) else None


@functools.cache
def _flop_registry() -> dict:
    """torch's flop formulas, with the CPU's fused attention added where torch has none
    (2.13 counts ``_scaled_dot_product_flash_attention`` but not its ``_for_cpu`` variant,
    whose arguments begin the same way): without it, an attention was priced at one FLOP
    per output element, 40x under its time, and plans recomputed attention freely (issue
    #26's decoder: 6 attentions recomputed twice more than per-block checkpointing)."""
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    registry = dict(flop_registry)
    for cpu_op, same_formula in (
            ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
            ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward")):
        packet, formula = getattr(aten, cpu_op, None), getattr(aten, same_formula, None)
        if packet is not None and packet not in registry and formula in registry:
            registry[packet] = registry[formula]
    return registry


def _producer(node: fx.Node) -> fx.Node:
    """The op that computes ``node``'s data (through views and tuple items)."""
    node = storage_node(node)
    if oplib.is_getitem(node) and isinstance(node.args[0], NODES):
        return node.args[0]
    return node


def _is_kernel(node: fx.Node) -> bool:
    """Does this node run code on the device (not a view, tuple item, placeholder or shape op)?"""
    if node.op != "call_function" or is_alias(node) or oplib.is_getitem(node):
        return False
    return bool(flat_tensors(node.meta.get("val")))


def node_flops(node: fx.Node) -> float:
    """FLOPs of one op: torch's flop-counter formula if it has one, otherwise one per
    output element (``TRANSCENDENTAL_FLOPS`` for transcendental pointwise ops; reductions
    one per input element). Views and non-kernels: 0."""
    return memo.per_meta("flops", node, _node_flops)


def _node_flops(node: fx.Node) -> float:
    if not _is_kernel(node):
        return 0.0
    packet = _packet(node)
    registry = _flop_registry()
    if packet is not None and packet in registry:
        args, kwargs = _meta(node.args), _meta(node.kwargs)
        try:
            return float(_hint(registry[packet](*args, **kwargs, out_val=node.meta.get("val"))))
        except Exception:  # a formula that does not accept this overload's arguments
            warnings.warn(f"fxremat.costmodel: torch's flop formula for {node.target} failed on {node.name}; "
                          "counting one FLOP per output element", stacklevel=2)
    out = sum(_numel(t) for t in flat_tensors(node.meta.get("val")))
    if oplib.is_reduction(node):
        out = max([out] + [sum(_numel(t) for t in flat_tensors(a.meta.get("val"))) for a in node.all_input_nodes])
    weight = TRANSCENDENTAL_FLOPS if packet is not None and packet.__name__ in _TRANSCENDENTAL else 1
    return float(weight * out)


def _read_bytes(arg: fx.Node) -> tuple[fx.Node, int]:
    """(storage node, bytes read) for reading ``arg``: the view's bytes, at most its
    storage's (an expanded bias reads the bias once)."""
    store = storage_node(arg)
    view_bytes = sum(tensor_bytes(t) for t in flat_tensors(arg.meta.get("val")))
    return store, min(view_bytes, node_bytes(store))


def node_bytes_moved(node: fx.Node) -> int:
    """Bytes one op moves on its own: its inputs read (each storage once) plus its outputs
    written. Views and non-kernels move nothing."""
    if not _is_kernel(node):
        return 0
    reads: dict[fx.Node, int] = {}
    for a in node.all_input_nodes:
        if flat_tensors(a.meta.get("val")):
            store, nbytes = _read_bytes(a)
            reads[store] = min(reads.get(store, 0) + nbytes, node_bytes(store))
    return sum(reads.values()) + node_bytes(node)


def _dtype(node: fx.Node) -> torch.dtype:
    vals = flat_tensors(node.meta.get("val"))
    if vals:
        return vals[0].dtype
    return torch.float32


def _default_tf32(profile: DeviceProfile) -> bool:
    return "tf32" in profile.matmul_flops and torch.get_float32_matmul_precision() != "highest"


def roofline(flops: float, nbytes: float, profile: DeviceProfile, dtype: torch.dtype = torch.float32,
             compute_intensive: bool = False, tf32: bool | None = None,
             footprint: float | None = None) -> tuple[float, str]:
    """(seconds without launch overhead, "compute" or "memory"). ``footprint``: the bytes
    the kernel touches, whose size picks the cache's rate or the memory's (default
    ``nbytes``; less when it reads some of them twice)."""
    tf32 = _default_tf32(profile) if tf32 is None else tf32
    compute = flops / profile.peak_flops(dtype, compute_intensive, tf32)
    memory = nbytes / profile.bandwidth_for(nbytes if footprint is None else footprint)
    return (compute, "compute") if compute >= memory else (memory, "memory")


def node_time(node: fx.Node, profile: DeviceProfile, tf32: bool | None = None) -> float:
    """Roofline time of one op run alone (no fusion), plus one launch overhead."""
    if not _is_kernel(node):
        return 0.0
    seconds, _ = roofline(node_flops(node), node_bytes_moved(node), profile, _dtype(node),
                          oplib.is_compute_intensive(node), tf32)
    return seconds + profile.launch_overhead


# --- kernels (fusion groups) --------------------------------------------------------------------


def _fuses(node: fx.Node) -> bool:
    return _is_kernel(node) and oplib.is_fusible(node) and not oplib.is_compute_intensive(node)


def _extern_depth(nodes: list[fx.Node]) -> dict[fx.Node, int]:
    """Most library (non-fused) kernels on any path from the graph's inputs to each node."""
    depth: dict[fx.Node, int] = {}
    for node in nodes:
        depth[node] = max((depth.get(_producer(a), 0) + (not _fuses(_producer(a)) and _is_kernel(_producer(a)))
                           for a in node.all_input_nodes), default=0)
    return depth


def inlined_constants(gm: fx.GraphModule) -> set[fx.Node]:
    """Fusible values computed from no tensor at all (``full``, ``iota``, a causal mask
    built from them) whose readers are all fused kernels: Inductor computes them inside
    each reader, so they are no kernel of their own and are never read from memory."""
    constant: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        producers = [_producer(a) for a in node.all_input_nodes if flat_tensors(a.meta.get("val"))]
        if (_fuses(node) or is_alias(node) or oplib.is_getitem(node)) and all(p in constant for p in producers):
            constant.add(node)
    inlined: set[fx.Node] = set()
    for node in reversed(gm.graph.nodes):  # readers first: a constant read only by inlined ones is inlined too
        if node in constant and _is_kernel(node):
            if all(r.op == "call_function" and ((_fuses(r) and r not in constant) or r in inlined)
                   for r in readers(node)):
                inlined.add(node)
    return inlined


def computed_in_readers(node: fx.Node, inlining: Inlining) -> bool:
    """Is ``node`` a pointwise value Inductor never writes, computing it inside each kernel
    that reads it (``timeline.Inlining``: the timeline's store-or-inline rule), every reader a
    fused kernel? A value a library call or the graph's output reads is written."""
    return (_fuses(node) and not is_multi_output(node) and inlining.fused_away(node)
            and all(r.op == "call_function" and _fuses(r) for r in inlining.readers(node)))


class _Bodies:
    """For one graph: which values Inductor computes in their readers (``computed_in_readers``,
    none without ``inlining``) and, per node, what its code loads and computes inline; each
    answer found once, for ``kernel_groups`` and ``kernel_bodies`` alike."""

    def __init__(self, inlining: Inlining | None, inlined: set[fx.Node]):
        self.inlining, self.inlined = inlining, inlined
        self._away: dict[fx.Node, bool] = {}
        self._of: dict[fx.Node, tuple[set[fx.Node], set[fx.Node]]] = {}

    def away(self, node: fx.Node) -> bool:
        if self.inlining is None:
            return False
        found = self._away.get(node)
        if found is None:
            found = self._away[node] = node not in self.inlined and computed_in_readers(node, self.inlining)
        return found

    def of(self, node: fx.Node) -> tuple[set[fx.Node], set[fx.Node]]:
        """(the written values ``node``'s code loads, the values it computes inline): through
        its inputs computed in their readers, recursively."""
        found = self._of.get(node)
        if found is not None:
            return found
        loads: set[fx.Node] = set()
        computed: set[fx.Node] = set()
        stack, seen = [node], set()
        while stack:
            for a in stack.pop().all_input_nodes:
                producer = _producer(a)
                if producer in seen or producer in self.inlined:
                    continue
                seen.add(producer)
                if _is_kernel(producer) and self.away(producer):
                    computed.add(producer)
                    stack.append(producer)
                else:
                    loads.add(producer)
        found = self._of[node] = (loads, computed)
        return found


def kernel_groups(gm: fx.GraphModule, inlined: set[fx.Node] | None = None,
                  inlining: Inlining | None = None) -> list[list[fx.Node]]:
    """The graph's kernels as Inductor would make them: each fusible op joins the kernel
    of every fusible op it reads (through views) unless a library kernel (matmul,
    convolution, any unfusible op) lies on a path between them, which would make the
    fused kernel both feed and wait for it; other ops run alone. In graph order (a
    kernel sits at its first node), each kernel's nodes in graph order. ``inlined``: the
    graph's ``inlined_constants``, if the caller has them.

    With ``inlining`` (the graph's store-or-inline memo), a value Inductor computes inside
    each kernel that reads it (``computed_in_readers``) is in no kernel: each reader's
    kernel computes it (``kernel_bodies``), and kernels join through it to the written
    values it loads. Without it, such a value joins its readers' kernels into one, computed
    once: a recomputed GELU's ``erf``, shared (after common-subexpression elimination) by
    the GELU a matmul reads and by the GELU's backward, made one kernel of the two, where
    Inductor writes two and computes the ``erf`` in both (issue #21's 4-layer transformer)."""
    inlined = inlined_constants(gm) if inlined is None else inlined
    return _kernel_groups(gm, inlined, _Bodies(inlining, inlined))


def _kernel_groups(gm: fx.GraphModule, inlined: set[fx.Node], bodies: _Bodies) -> list[list[fx.Node]]:
    nodes = [n for n in gm.graph.nodes if _is_kernel(n) and n not in inlined and not bodies.away(n)]
    depth = _extern_depth([n for n in gm.graph.nodes if n.op == "call_function"])
    parent = {n: n for n in nodes}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    position = {n: i for i, n in enumerate(nodes)}
    for node in nodes:
        if not _fuses(node):
            continue
        loads = ({_producer(a) for a in node.all_input_nodes} if bodies.inlining is None
                 else bodies.of(node)[0])
        for producer in sorted(loads, key=lambda p: position.get(p, -1)):
            if producer in parent and _fuses(producer) and depth[producer] == depth[node]:
                ra, rb = find(node), find(producer)
                if ra is not rb:  # the earlier node roots the group: deterministic
                    if position[ra] < position[rb]:
                        parent[rb] = ra
                    else:
                        parent[ra] = rb
    groups: dict[fx.Node, list[fx.Node]] = {}
    for node in nodes:
        groups.setdefault(find(node), []).append(node)
    return sorted(groups.values(), key=lambda g: position[g[0]])


def kernel_bodies(group: list[fx.Node], inlining: Inlining, inlined: set[fx.Node],
                  position: dict[fx.Node, int] | None = None) -> list[fx.Node]:
    """The values ``group``'s kernel computes without writing them (``computed_in_readers``),
    for its members, in graph order: once in this kernel, however many of its members read
    them, and again in every other kernel that reads them. ``position``: each node's index
    in the graph, if the caller has it."""
    return _kernel_bodies(group, _Bodies(inlining, inlined), position)


def _kernel_bodies(group: list[fx.Node], bodies: _Bodies, position: dict[fx.Node, int] | None) -> list[fx.Node]:
    computed: set[fx.Node] = set()
    for node in group:
        if _fuses(node):
            computed |= bodies.of(node)[1]
    if not computed:
        return []
    position = position or {n: i for i, n in enumerate(group[0].graph.nodes)}
    return sorted(computed, key=position.__getitem__)


@dataclasses.dataclass
class KernelEstimate:
    nodes: list[str]
    kind: str  # "fused" (fusible ops), "compute" (matmul, conv, attention), "other" (unfusible library op)
    flops: float
    bytes_read: int
    bytes_written: int
    seconds: float
    bound: str  # "compute", "memory" or "measured"
    computed_inline: list[str] = dataclasses.field(default_factory=list)  # values it computes, never writes

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclasses.dataclass
class GraphEstimate:
    total_s: float
    per_group: list[KernelEstimate]
    profile: str = ""

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.per_group)

    @property
    def bytes_moved(self) -> int:
        return sum(k.bytes_moved for k in self.per_group)

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, float] = {}
        for k in self.per_group:
            by_kind[k.kind] = by_kind.get(k.kind, 0.0) + k.seconds
        return {"total_s": self.total_s, "kernels": len(self.per_group), "flops": self.flops,
                "bytes_moved": self.bytes_moved, "seconds_by_kind": by_kind, "profile": self.profile}

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "per_group": [dataclasses.asdict(k) for k in self.per_group]}


@dataclasses.dataclass
class StepEstimate:
    forward: GraphEstimate
    backward: GraphEstimate

    @property
    def total_s(self) -> float:
        return self.forward.total_s + self.backward.total_s

    def summary(self) -> dict[str, Any]:
        return {"total_s": self.total_s, "forward": self.forward.summary(), "backward": self.backward.summary()}


def written(node: fx.Node, group: list[fx.Node] | set[fx.Node], inlining: Inlining | None = None) -> bool:
    """Does the kernel ``group`` write ``node``'s value to memory? Unless Inductor fuses
    it away (``timeline.Inlining``), or, when the kernel is that one op alone, always;
    and always when a reader lies outside the kernel (it reads it from memory).
    ``inlining``: the graph's memo of those choices (one per graph: each decision walks
    the value's inlined inputs, so a fresh memo per call is quadratic on a long graph)."""
    if len(group) == 1 or not (inlining or Inlining()).fused_away(node):
        return True
    return any(r not in group for r in readers(node))


# A reduction over at least this many elements per output value is a loop of its own inside
# Inductor's kernel (Triton's persistent reductions stop at 1024 elements, ``InductorChoices.
# should_use_persistent_reduction``; the C++ kernels loop over the reduced dimensions): what
# the kernel computes from its result (a batch norm's normalized output, its backward's input
# gradient) is a second pass over the data, which reads the kernel's inputs again.
PASS_REDUCTION_ELEMENTS = 1024


def _reduced_elements(node: fx.Node) -> int:
    """Input elements per output element of a reduction (the largest input's)."""
    out = max((_numel(t) for t in flat_tensors(node.meta.get("val"))), default=0)
    read = max((_numel(t) for a in node.all_input_nodes for t in flat_tensors(a.meta.get("val"))), default=0)
    return read // max(out, 1)


def _splits_passes(node: fx.Node, members: set[fx.Node]) -> bool:
    """Is ``node`` a reduction whose result the kernel uses, over enough elements to be a loop?"""
    return (oplib.is_reduction(node) and _reduced_elements(node) >= PASS_REDUCTION_ELEMENTS
            and any(r in members for r in readers(node)))


def _read_events(group: list[fx.Node], members: set[fx.Node], inlined: set[fx.Node],
                 splits: set[fx.Node]) -> list[list[tuple[fx.Node, fx.Node]]]:
    """The kernel's reads from outside it, ``(reader, argument)`` each, by pass: one pass
    unless a reduction in ``splits`` (``_splits_passes``) splits it; a value computed in the kernel is
    computed again in each pass that uses it (reading its inputs again), a reduction's result
    is kept from its pass to the next."""
    external: dict[fx.Node, set[tuple[fx.Node, fx.Node]]] = {}  # what computing a node reads
    pass_of: dict[fx.Node, int] = {}
    by_pass: dict[int, set[tuple[fx.Node, fx.Node]]] = {}
    for node in group:  # graph order: a member's producers in the kernel come first
        own: set[tuple[fx.Node, fx.Node]] = set()
        number = 0
        for a in node.all_input_nodes:
            producer = _producer(a)
            if producer in members:
                if producer in splits:
                    number = max(number, pass_of[producer] + 1)
                else:
                    number = max(number, pass_of[producer])
                    own |= external[producer]
            elif flat_tensors(a.meta.get("val")) and producer not in inlined:
                own.add((node, a))
        external[node], pass_of[node] = own, number
        by_pass.setdefault(number, set()).update(own)
    return [sorted(by_pass[k], key=lambda e: (e[0].name, e[1].name)) for k in sorted(by_pass)]


def _group_traffic(group: list[fx.Node], inlined: set[fx.Node] = frozenset(),
                   inlining: Inlining | None = None, body: list[fx.Node] = (),
                   position: dict[fx.Node, int] | None = None) -> tuple[int, int, int]:
    """(bytes read from outside the kernel, each storage once a pass; bytes the kernel
    writes; the bytes it touches, each storage once). Values in ``inlined`` are computed
    inside the kernel: nothing to read; so are those in ``body`` (``kernel_bodies``), which
    read their inputs (``position``: each node's index in the graph, to order them). Passes:
    ``_read_events``."""
    members = set(group)
    nwritten = sum(node_bytes(node) for node in group if written(node, members, inlining))
    if body:
        members |= set(body)
        position = position or {n: i for i, n in enumerate(group[0].graph.nodes)}
        group = sorted(members, key=position.__getitem__)
    splits = {node for node in group if _splits_passes(node, members)}
    if splits:
        passes = _read_events(group, members, inlined, splits)
    else:  # one pass: each read once (the common case, without the per-node sets)
        passes = [[(node, a) for node in group for a in node.all_input_nodes
                   if flat_tensors(a.meta.get("val")) and _producer(a) not in members and _producer(a) not in inlined]]
    read, touched = 0, {}
    for events in passes:
        reads: dict[fx.Node, int] = {}
        for _, a in events:
            store, nbytes = _read_bytes(a)
            reads[store] = min(reads.get(store, 0) + nbytes, node_bytes(store))
        read += sum(reads.values())
        for store, nbytes in reads.items():
            touched[store] = max(touched.get(store, 0), nbytes)
    return read, nwritten, sum(touched.values()) + nwritten


def _kind(group: list[fx.Node]) -> str:
    if len(group) == 1 and oplib.is_compute_intensive(group[0]):
        return "compute"
    return "fused" if all(_fuses(n) for n in group) else "other"


def estimate_group(group: list[fx.Node], profile: DeviceProfile, tf32: bool | None = None,
                   timer: "OpTimer | None" = None, inlined: set[fx.Node] = frozenset(),
                   inlining: Inlining | None = None, body: list[fx.Node] = (),
                   position: dict[fx.Node, int] | None = None) -> KernelEstimate:
    """One kernel's estimate; ``inlined``: constants it computes itself (``inlined_constants``);
    ``inlining``: the graph's store-or-inline memo (``written``); ``body``: the values it
    computes inline for its members (``kernel_bodies``), whose work and reads it pays for
    (``position``: each node's index in the graph)."""
    kind = _kind(group)
    flops = sum(node_flops(n) for n in group) + sum(node_flops(n) for n in body)
    read, nwritten, footprint = _group_traffic(group, inlined, inlining, body, position)
    if timer is not None and timer.covers(kind, group):
        measured = timer.time_kernel(group)
        if measured is not None:
            return KernelEstimate([n.name for n in group], kind, flops, read, nwritten, measured, "measured",
                                  [n.name for n in body])
    seconds, bound = roofline(flops, read + nwritten, profile, _dtype(group[-1]), kind == "compute", tf32,
                              footprint)
    return KernelEstimate([n.name for n in group], kind, flops, read, nwritten, seconds + profile.launch_overhead,
                          bound, [n.name for n in body])


def estimate_graph(gm: fx.GraphModule, profile: DeviceProfile | str | None = None, *, tf32: bool | None = None,
                   timer: "OpTimer | None" = None) -> GraphEstimate:
    """Estimated run time of ``gm`` compiled by Inductor: the sum over its kernels
    (``kernel_groups`` with the timeline's store-or-inline rule: a value computed in each
    reader is paid for in each) of roofline time plus a launch overhead. ``tf32``: fp32
    matmuls on tensor cores (default: ``torch.get_float32_matmul_precision() != "highest"``).
    ``timer``: measure kernels instead (``OpTimer``)."""
    profile = profile_for(profile)
    inlined, inlining = inlined_constants(gm), Inlining()
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    bodies = _Bodies(inlining, inlined)  # one graph's answers, for its kernels and their bodies
    kernels = [estimate_group(g, profile, tf32, timer, inlined, inlining, _kernel_bodies(g, bodies, position), position)
               for g in _kernel_groups(gm, inlined, bodies)]
    if timer is not None:
        timer.save()
    return GraphEstimate(sum(k.seconds for k in kernels), kernels, profile.name)


def node_costs(gm: fx.GraphModule, profile: DeviceProfile | str | None = None,
               timer: "OpTimer | None" = None) -> dict[fx.Node, float]:
    """Each op's share of ``estimate_graph``'s time: a kernel's time split evenly over
    its ops (a fused pointwise chain costs one pass over memory, not one per op). Used
    on a joint graph to cost Rotor's stages: a stage pays for the kernels it runs.
    ``timer``: measure the kernels it covers (``OpTimer``) instead of the roofline."""
    profile = profile_for(profile)
    inlined, inlining = inlined_constants(gm), Inlining()
    costs: dict[fx.Node, float] = {}
    for group in kernel_groups(gm, inlined):
        seconds = estimate_group(group, profile, timer=timer, inlined=inlined, inlining=inlining).seconds
        costs.update((n, seconds / len(group)) for n in group)
    if timer is not None:
        timer.save()
    return costs


def estimate_step(fwd_gm: fx.GraphModule, bwd_gm: fx.GraphModule, profile: DeviceProfile | str | None = None,
                  **kwargs: Any) -> StepEstimate:
    """Estimated forward + backward time of a partitioned training step."""
    profile = profile_for(profile)
    return StepEstimate(estimate_graph(fwd_gm, profile, **kwargs), estimate_graph(bwd_gm, profile, **kwargs))


__all__ = [
    "DeviceProfile", "H100_SXM", "H100_PCIE", "H200", "A100_80GB", "A100_80GB_PCIE", "DEFAULT_CPU", "GPU_PROFILES",
    "CALIBRATION_VERSION", "TRANSCENDENTAL_FLOPS", "cache_dir", "calibrate_cpu", "cpu_profile", "gpu_profile",
    "profile_for", "dtype_class", "node_flops", "node_bytes_moved", "node_time", "roofline", "kernel_groups",
    "inlined_constants", "computed_in_readers", "kernel_bodies", "KernelEstimate", "GraphEstimate", "StepEstimate", "estimate_group", "estimate_graph",
    "node_costs", "estimate_step", "OpTimer",
]
