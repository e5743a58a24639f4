"""Rotor on a joint graph: linearize it into a chain of stages and give the stages Rotor's parameters.

1. ``linearize``: cut the forward where a single new activation carries the data on
   (values already crossing the previous cut, such as U-Net skips, may cross too:
   they are carried across the stages they span and counted in each ``a^s``); merge
   stages to at most ``max_stages`` of similar weight (time; for Rotor, time plus
   allocated bytes); give every backward node (and every forward op the min-cut plan
   recomputes in the backward) the stage whose gradient it computes.
2. ``rotor_chain``: the stages' Rotor parameters: ``u_f``, ``u_b`` (cost model; and
   ``u_f_last``, the cost of the ops ``B^s`` needs, for an ``F_all^s`` whose output no
   later stage reads),
   ``omega_a`` (bytes of ``a^s``), ``omega_abar`` (``a^s`` plus the min-cut saved set
   inside the stage, so the DP stays fusion-aware), ``o_f``, ``o_b`` (temporaries).
3. ``emit.emit_backward`` (fxremat/emit.py): the backward graph for a Rotor sequence: recomputed stages are
   duplicated where the sequence recomputes them, each ``B^s`` is the stage's part of
   the min-cut backward, in the sequence's order, so liveness frees what it frees.

Values that must keep one value for the whole step are *pinned* (kept from the
forward to the end of the backward, counted apart from the chain): outputs of
nondeterministic RNG ops (recomputing them would draw new numbers; Inductor's
seeded ``inductor_random`` is deterministic given its seed, so only the seeds are
pinned), values no gradient flows through that later layers read (the attention
mask a Hugging Face model builds from its token ids: it would cross every cut), and
the rare forward value a backward op reads outside its stage.
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from . import _compat, oplib
from .joint import module_path
from .passes import rotor
from .passes.memory import Step, simulate
from .sizes import incoming_gradient_held, is_multi_output, is_tensor_node, node_bytes, storage_bytes, storage_of


@dataclasses.dataclass
class Stage:
    index: int  # 1-based, as in the paper
    forward: list[fx.Node]  # forward ops of the stage, graph order
    backward: list[fx.Node]  # ops of B^s: backward ops and the min-cut recomputations
    boundary: list[fx.Node]  # a^s: values crossing to later stages
    saved: list[fx.Node]  # min-cut saved values made in the stage (abar^s = a^s + these)


@dataclasses.dataclass
class Linearization:
    stages: list[Stage]
    free: set[fx.Node]  # computable from inputs alone, cheaply: recomputed wherever needed
    pinned: list[fx.Node]  # kept for the whole step
    stage_of: dict[fx.Node, int]
    # Why stages were merged after the cuts were chosen (``_first_violation``), one line a
    # merge: a chain of few stages cannot go low, and this says which value made it so.
    merged: list[str] = dataclasses.field(default_factory=list)


def _is_pinned_rng(node: fx.Node) -> bool:
    """RNG ops whose recomputation would not reproduce their values."""
    if not oplib.is_random(node):
        return False
    deterministic = {"inductor_random", "inductor_randint", "inductor_lookup_seed"}
    return getattr(node.target, "_opname", getattr(node.target, "__name__", "")) not in deterministic


def _must_keep(node: fx.Node) -> bool:
    """A MUST_SAVE value some op reads: the backward (it is saved), or a forward op (a
    recomputed stage would compute it again to rebuild what it reads)."""
    return (_compat.is_must_save(node) and is_tensor_node(node)
            and any(u.op == "call_function" for u in node.users))


def _is_seed_lookup(node: fx.Node) -> bool:
    return getattr(node.target, "_opname", "") == "inductor_lookup_seed"


def _step_constants(nodes: list[fx.Node], forward: set[fx.Node], free: set[fx.Node], pinned: list[fx.Node],
                    differentiable: set[fx.Node] | None) -> list[fx.Node]:
    """Values no gradient flows through that the rest of the forward reads: attention
    masks and position data a model builds from its token ids and reads in every
    layer. They would cross every cut and break the chain, so they are pinned: made
    once, kept for the step, counted apart. Only the frontier is pinned (what
    non-constant ops read); the ops building it are ordinary forward ops.
    ``differentiable``: the step inputs that get a gradient (None: every input)."""
    if differentiable is None:
        return []
    # Values made from pinned random values stay with them, in their stage (a
    # dropout mask is per layer: pinning it too would only add memory).
    varying: set[fx.Node] = set(pinned)
    for n in nodes:
        if n in differentiable or (n.op == "placeholder" and n not in forward) or (
                n.op == "call_function" and (n not in forward or any(a in varying for a in n.all_input_nodes))):
            varying.add(n)
    taken = set(pinned)
    constants = [n for n in nodes if n.op == "call_function" and n in forward and n not in varying
                 and n not in free and n not in taken]
    return [n for n in constants if any(u in varying and u in forward for u in n.users)
            and is_tensor_node(n)]


def linearize(joint: fx.GraphModule, forward: set[fx.Node], required: set[fx.Node], inputs: set[str],
              backward: list[fx.Node], saved: set[fx.Node], cost: dict[fx.Node, float],
              max_stages: int = 64, differentiable: set[fx.Node] | None = None,
              weigh_memory: bool = False) -> Linearization:
    """The stages of the joint graph (see the module docstring). ``weigh_memory``: merge
    into stages of similar time-plus-memory weight rather than time alone (``_weights``);
    the chain solvers ask for it."""
    nodes = [n for n in joint.graph.nodes if n.op != "output"]
    # MUST_SAVE values (a selective checkpoint policy's, or the collectives torch marks) are
    # never computed again: a stage recomputed around one reads the forward's value.
    pinned: list[fx.Node] = [n for n in nodes if n in forward and (_is_pinned_rng(n) or _must_keep(n))]
    # Free: cheap values computable from inputs, constants and pinned values alone (a
    # transposed weight, a causal mask, the seed of one dropout): made where needed.
    free: set[fx.Node] = set()
    for n in nodes:
        if n in forward and n not in pinned and (n.op in ("placeholder", "get_attr") or (
                all(a in free or a in pinned for a in n.all_input_nodes)
                and (oplib.is_fusible(n) or _is_seed_lookup(n)))):
            free.add(n)
    pinned += _step_constants(nodes, forward, free, pinned, differentiable)
    # The forward's ops: those its outputs need, and those the min-cut saves for the
    # backward (a value only the backward reads, computed early because it is small).
    order = [n for n in nodes if n in required and n not in free and n not in pinned]
    # A saved value only the backward reads (the 1/D a layer norm's backward uses) sits
    # late in the joint graph; run it right after its inputs, so it does not keep an
    # early value alive across every later cut.
    # What such a value is computed from that the forward does not otherwise compute comes
    # with it (a square's backward saves 2 * x**1: both are placed, or the backward reads a
    # value no stage makes).
    kept = set(pinned)

    def placed_on_its_own(n: fx.Node) -> bool:  # a forward value no other rule places
        return n in forward and n not in required and n not in free and n not in kept

    extra = {n for n in nodes if n in saved and placed_on_its_own(n)}
    stack = list(extra)
    while stack:
        for a in stack.pop().all_input_nodes:
            if placed_on_its_own(a) and a not in extra:
                extra.add(a)
                stack.append(a)
    for n in nodes:
        if n in extra:
            at = max((i for i, m in enumerate(order) if m in n.all_input_nodes), default=-1)
            while at + 1 < len(order) and order[at + 1] not in required:
                at += 1  # after the saved values already placed there: graph order among them
            order.insert(at + 1, n)
    position = {n: i for i, n in enumerate(order)}
    last_fwd_use: dict[fx.Node, int] = {}
    for n in order:
        for a in n.all_input_nodes:
            if a in position:
                last_fwd_use[a] = max(last_fwd_use.get(a, -1), position[n])
    # Candidate cuts: after position k, one value carries the data on, besides values
    # that were already crossing the last single-value cut (long skips).
    candidates: list[int] = []
    carried: list[int] = []  # bytes crossing each candidate cut
    skips: set[fx.Node] = set()
    live: set[fx.Node] = set()
    for k, n in enumerate(order[:-1]):
        live.add(n)
        live = {v for v in live if last_fwd_use.get(v, -1) > k}
        if len(live) == 1:
            skips = set(live)
        if live and len(live - skips) <= 1 and not any(_compat.is_must_recompute(v) for v in live):
            # (A cut's values are saved when its stage is checkpointed: never a MUST_RECOMPUTE one.)
            # Past views alone, a cut carries the storages of the candidate before it: a stage of
            # views only would put one storage in a^(s-1) and a^s, which the chain counts twice
            # whenever both are alive (Hugging Face GPT-2's MLP input, 1 MiB a layer, cut
            # before and after its reshape: its least plan measured 7.51 MiB, 6.54 MiB without).
            if candidates and all(oplib.is_view(m) for m in order[candidates[-1] + 1:k + 1]):
                continue
            candidates.append(k)
            carried.append(storage_bytes(live, inputs))
    weight = _weights(order, cost, weigh_memory)
    narrow = _narrow_cuts(candidates, carried, [_boundary_depth(order[k], order[k + 1]) for k in candidates]
                          ) if weigh_memory else []
    cuts = _choose_cuts(candidates, narrow, weight, max_stages)
    merged: list[str] = []
    while True:
        lin = _stages(order, cuts, last_fwd_use, backward, saved, free, forward, pinned)
        violation = _first_violation(lin)
        if violation is None:
            lin.merged = merged
            return lin
        lo, hi = violation[:2]  # stages lo..hi become one: drop the cuts between them
        merged.append(merge_said(lin, *violation))
        cuts = [c for i, c in enumerate(cuts, start=1) if not lo <= i < hi]


NARROW = 0.75  # a narrow cut carries at most this fraction of the widest cut on either side of it


def _boundary_depth(before: fx.Node, after: fx.Node) -> int:
    """How deep in the module tree a cut between these two ops lies: the number of module
    names their paths (``joint.module_path``) share. 0 between two top-level modules;
    between a block's last op and the next block's first, the depth of the list holding the
    blocks; inside a block, more."""
    shared = 0
    for a, b in zip(module_path(before).split("."), module_path(after).split(".")):
        if a != b or not a:
            break
        shared += 1
    return shared


def _narrow_cuts(candidates: list[int], carried: list[int], depth: list[int] | None = None) -> list[int]:
    """The candidate cuts that carry markedly fewer bytes than the cuts around them: where
    a block's output alone crosses, between a transformer's attention and its MLP, between
    two residual blocks. They are the cheapest checkpoints a chain solver can keep, and
    per-block checkpointing keeps exactly those; a cut inside a block carries the
    residual stream and a wider activation besides (a 16-layer decoder cut by time
    alone: 2-2.6 MB a cut inside its blocks against 0.5 MB at their boundaries, and no
    cut at a block boundary at all).

    A cut is narrow when it is a local minimum of the carried bytes (of a run of equal
    ones, the first) and carries at most ``NARROW`` of the widest cut on each side of it
    up to the next cut that carries as little (its prominence, as of a valley between
    peaks): a plain CNN's cuts that differ by a batch norm's statistics are not.

    Of a run of equal cuts, the one at the shallowest module boundary (``depth``, per
    candidate: ``_boundary_depth``), the first of those: a bottleneck ResNet's block ends
    with its residual add and a ReLU, and the cut after the add carries as much as the
    cut after the ReLU; the block's end is the latter, and keeping it is per-block
    checkpointing (cut after the add, 14 of the frontier ResNet-50's 48 stages began
    with the ReLU of the block before, recomputed with its batch norm in the backward)."""
    depth = depth or [0] * len(candidates)
    runs: list[tuple[int, int]] = []  # (the run's chosen candidate, bytes)
    chosen_depth = 0
    for k, b, d in zip(candidates, carried, depth):
        if not runs or runs[-1][1] != b:
            runs.append((k, b))
            chosen_depth = d
        elif d < chosen_depth:
            runs[-1], chosen_depth = (k, b), d
    found = []
    for i, (k, b) in enumerate(runs):
        peaks = []
        for side in (runs[i - 1::-1] if i > 0 else [], runs[i + 1:]):
            widest = None
            for _, other in side:
                if other <= b:
                    break
                widest = other if widest is None else max(widest, other)
            if side and widest is None:
                break  # a neighbour carries as little: not a local minimum
            if widest is not None:
                peaks.append(widest)
        else:
            if len(peaks) == 2 and b <= NARROW * min(peaks):  # a valley: wider cuts on both sides
                found.append(k)
    return found


def _choose_cuts(candidates: list[int], narrow: list[int], weight: list[float], max_stages: int) -> list[int]:
    """At most ``max_stages`` stages. Without narrow cuts: the first candidate past each
    1/max_stages of the total weight. With them, as many cuts as that (or every narrow
    one, if more): every narrow cut (when there are too many, those past each 1/max_stages
    of the weight), and the cuts left shared among the spans between them by weight
    (largest remainders), each span cut at the candidates nearest equal shares of its
    weight. Walks the ops in order (lists, so the sums and the cuts are the same on every
    run)."""
    total = sum(weight) or 1.0
    by_weight = _by_weight(weight, set(candidates), total / max_stages)
    if not narrow:
        return by_weight
    if len(narrow) >= max_stages - 1:
        return _by_weight(weight, set(narrow), total / max_stages)
    # No more cuts than by weight alone: a stage boundary keeps what crosses it whenever
    # the stage is stored, so cutting a small graph at every candidate stores more than
    # its min-cut plan saves.
    left = max(len(by_weight) - len(narrow), 0)
    prefix = [0.0]
    for w in weight:
        prefix.append(prefix[-1] + w)
    ends = [-1] + narrow + [len(weight) - 1]
    spans = [(lo, hi, [k for k in candidates if lo < k < hi]) for lo, hi in zip(ends, ends[1:])]
    quota = [(prefix[hi + 1] - prefix[lo + 1]) / total * left for lo, hi, _ in spans]
    extra = [min(int(q), len(inside)) for q, (_, _, inside) in zip(quota, spans)]
    # Largest remainders first; ties to the earlier span.
    for i in sorted(range(len(spans)), key=lambda i: (-(quota[i] - int(quota[i])), i)):
        if sum(extra) >= left:
            break
        if extra[i] < len(spans[i][2]):
            extra[i] += 1
    cuts = set(narrow)
    for (lo, hi, inside), m in zip(spans, extra):
        start, width = prefix[lo + 1], prefix[hi + 1] - prefix[lo + 1]
        for j in range(1, m + 1):
            target = start + width * j / (m + 1)
            free = [k for k in inside if k not in cuts]
            if free:
                cuts.add(min(free, key=lambda k: (abs(prefix[k + 1] - target), k)))
    return sorted(cuts)


def _by_weight(weight: list[float], wanted: set[int], share: float) -> list[int]:
    """Cuts at the first position in ``wanted`` past each ``share`` of the weight since
    the last cut."""
    cuts, acc = [], 0.0
    for k, w in enumerate(weight):
        acc += w
        if k in wanted and acc >= share:
            cuts.append(k)
            acc = 0.0
    return cuts


def _allocates(n: fx.Node) -> int:
    """Bytes of new storage ``n`` makes: none for a view (it shares its base's) or for
    a multi-output op's item (counted with the op)."""
    if oplib.is_view(n) or oplib.is_getitem(n):
        return 0
    return node_bytes(n)


def _weights(order: list[fx.Node], cost: dict[fx.Node, float], weigh_memory: bool) -> list[float]:
    """Each op's weight in the merge: its share of the forward's estimated time, plus,
    with ``weigh_memory``, its share of the bytes the forward allocates.

    Time alone suits the DAG solvers (Checkmate's ILP and TWRemat's decomposition grow
    and change with every stage: coarse stages keep them fast and the U-Net feasible).
    For Rotor's DP, stages are cheap and memory is what they are for; the cost model
    makes a fused batch norm + ReLU nearly free, so by time alone a whole conv + batch
    norm + ReLU block would be one stage (the deep CNN's least-memory plan: 17 stages
    and 2.64 MiB, against 34 and 2.14 MiB with the bytes)."""
    seconds = [cost.get(n, 0.0) for n in order]
    if not weigh_memory:
        return seconds
    allocated = [_allocates(n) for n in order]
    total_seconds, total_bytes = sum(seconds) or 1.0, sum(allocated) or 1
    return [t / total_seconds + b / total_bytes for t, b in zip(seconds, allocated)]


def _items(values: list[fx.Node]) -> list[fx.Node]:
    """``values`` with each multi-output value (a tuple, which the forward cannot save)
    replaced by its items, the ``getitem`` nodes reading it."""
    return [i for v in values for i in ([u for u in v.users if oplib.is_getitem(u)] if is_multi_output(v) else [v])]


def _past_items(order: list[fx.Node], cuts: list[int]) -> list[int]:
    """``cuts`` (after these positions of ``order``) moved past the items of any
    multi-output op they would separate it from: a^s must hold the items, not the
    tuple. Moving a cut onto the next one leaves an empty stage (the stage count
    stays that of ``cuts``, which ``linearize`` merges by index)."""
    last_item: dict[fx.Node, int] = {}
    for k, n in enumerate(order):
        if oplib.is_getitem(n) and isinstance(n.args[0], fx.Node):
            last_item[n.args[0]] = k
    reach, far = [], -1  # reach[k]: the last item of an op at or before position k
    for n in order:
        far = max(far, last_item.get(n, -1))
        reach.append(far)
    moved = []
    for c in cuts:
        while reach[c] > c:
            c = reach[c]
        moved.append(c)
    return moved


def _stages(order, cuts, last_fwd_use, backward, saved, free, forward, pinned) -> Linearization:
    # What a cut carries and what is pinned is what the forward saves: tensors, so a
    # multi-output op's items, never its tuple (torch's extractor would make a tuple a
    # forward output, which Inductor's GraphLowering.output rejects).
    cuts = _past_items(order, cuts)
    pinned_ops = set(pinned)  # a multi-output op's items are pinned in its place
    pinned = _items(pinned)
    kept = set(pinned)
    bounds = [-1] + cuts + [len(order) - 1]
    stage_of: dict[fx.Node, int] = {n: 1 for n in pinned}
    stages: list[Stage] = []
    for s, (lo, hi) in enumerate(zip(bounds, bounds[1:]), start=1):
        members = [n for n in order[lo + 1:hi + 1] if n not in kept]
        stage_of.update((n, s) for n in members)
        boundary = [v for v in order[:hi + 1] if last_fwd_use.get(v, -1) > hi and v not in kept]
        stages.append(Stage(s, members, [], boundary, [n for n in members if n in saved]))
    # Backward ops: the stage of the latest forward value they read, but never later
    # than the ops producing their inputs (gradients flow from stage L down to 1).
    bwd_stage: dict[fx.Node, int] = {}
    # A pinned value is in memory from the forward to the step's end: a B^s reads it, never
    # makes it again. Recomputed there (the min-cut backward makes a Hugging Face model's
    # attention mask again from its position indices, and under CUDA's efficient attention
    # the expanded view of it that the attention reads), it would read its stage-1 inputs
    # from the last stage's B and merge the whole chain into one stage (GPT-2: 5 stages).
    recomputed = [b for b in backward if b in forward and b in stage_of and b not in kept and b not in pinned_ops]
    for b in backward:
        if b in forward and b in stage_of:
            continue
        if b in free:
            # Made on demand where read (``_Emitter.value``). In B^L it would be made
            # first and held through the whole backward: the lean saved set recomputes a
            # layer norm of the step's input that way, an activation held from B^L to B^1.
            continue
        t = max((stage_of[a] for a in b.all_input_nodes if a in stage_of and a not in free), default=len(stages))
        bwd_stage[b] = min([t] + [bwd_stage[a] for a in b.all_input_nodes if a in bwd_stage])
    # Forward ops the min-cut recomputes run in the B^s of their first (latest-stage)
    # reader: B^L runs first. One no B reads is dropped: it made a value that is a stage
    # boundary here (the residual add before a cut; the view of the matmul output it adds),
    # which B reads from memory, and it would only count in u_b and in what B^s reads.
    for r in reversed(recomputed):
        if not any(u in bwd_stage for u in r.users):
            continue
        t = max(bwd_stage[u] for u in r.users if u in bwd_stage)
        if t > 1 and r in stages[t - 2].boundary:
            continue  # it is a^(t-1), in memory when B^t runs: nothing to recompute
        bwd_stage[r] = t
    for b in backward:
        if b in bwd_stage:
            stages[bwd_stage[b] - 1].backward.append(b)
    return Linearization(stages, free, pinned, {**stage_of, **bwd_stage})


def merge_said(lin: Linearization, lo: int, hi: int, reader: fx.Node, value: fx.Node) -> str:
    """One line on a merge ``_first_violation`` asked for: which backward op read which
    forward value, and their stages."""
    def named(n: fx.Node) -> str:
        return f"{n.name} ({oplib.op_name(n.target) if n.op == 'call_function' else n.op})"

    return (f"stages {lo}-{hi} of {len(lin.stages)} merged: backward op {named(reader)} of stage "
            f"{lin.stage_of.get(reader)} reads {named(value)} of stage {lin.stage_of.get(value)}")


def _first_violation(lin: Linearization) -> tuple[int, int, fx.Node, fx.Node] | None:
    """Stages to merge so that every B^s reads only its own stage's forward values,
    ``a^(s-1)``, free or pinned values and backward values, with the backward op and the
    value it reads that ask for it; None when all do."""
    pinned = set(lin.pinned)
    for st in lin.stages:
        own = set(st.forward) | set(lin.stages[st.index - 2].boundary if st.index > 1 else ())
        for b in st.backward:
            for a in b.all_input_nodes:
                home = lin.stage_of.get(a)
                if a in st.backward or a in own or a in lin.free or a in pinned or home is None:
                    continue
                if any(a in other.backward for other in lin.stages if other.index != st.index):
                    continue  # a gradient from an earlier B
                return min(home, st.index), max(home, st.index), b, a
    return None


def _overhead(ops: list[fx.Node], inputs: set[str], inlining=None) -> int:
    """Peak bytes of a segment's temporaries: values it allocates and uses only inside
    (its outputs are counted by the chain as a^s, abar^s or delta^(s-1)). Every op's
    output counts, fused or not (an upper bound), or with ``inlining`` (the joint graph's
    ``timeline.Inlining``: Inductor compiles it) only those Inductor writes, as the timeline
    counts them: an MLP backward's overhead was 2-4x what the fused timeline holds (GPT-2).
    Neither bounds the timeline, which checks every plan the DP returns; Rotor's search
    tries both (``strategies.rotor.search``)."""
    inside = set(ops)

    def escapes(n: fx.Node) -> bool:  # read outside the segment, directly or through a view
        return any(u not in inside or (oplib.is_view(u) and escapes(u)) for u in n.users)

    steps = []
    for n in ops:
        temporary = not escapes(n)
        base = storage_of(n)
        fused = inlining is not None and n.op == "call_function" and inlining.fused_away(n)
        allocates = {n.name: node_bytes(n)} if temporary and not fused and base == n.name and base not in inputs \
            and not isinstance(n.meta.get("val"), (list, tuple)) else {}
        steps.append(Step(n.name, allocates=allocates, reads=[storage_of(a) or "" for a in n.all_input_nodes]))
    return simulate(steps).peak_bytes if steps else 0


def rotor_chain(lin: Linearization, cost: dict[fx.Node, float], inputs: set[str],
                gradients: list[fx.Node] = (), later_graphs: tuple[int, int] = (0, 0),
                incoming: tuple[list[fx.Node], int] = ((), 0), fused: bool = False) -> rotor.Chain:
    """The stages' Rotor parameters; ``gradients`` (backward outputs some stage makes:
    ``gradients_in_chain``) made in a stage's ``B^s`` are its ``w_g^s``, held from then to
    the end of the step; ``later_graphs`` (``Budget.later_graphs`` and ``later_graphs_kept``)
    is needed at the turn from forward to backward, and its kept part from then on (the
    loss stage's ``o_f`` and ``w_g``).

    ``incoming``: the forward's outputs whose gradients the backward is handed, and those
    gradients' bytes (the tangents). Where autograd holds them from the backward's start to
    its end (``_compat.backward_frees_incoming_gradients``), they are the loss stage's kept
    bytes, and a stage output that is one of those outputs has no ``delta`` of its own to
    count (Hugging Face GPT-2's logits, whose 1.65 GB gradient was counted twice near the
    turn, and at the turn while it did not exist yet). Where the backward frees each at its
    last use, the gradients of the last stage's outputs are that stage's ``delta``, freed
    with its ``B``; the others stay kept (an upper bound), as does a scalar's (the loss's
    seed gradient, which ``loss.backward()`` holds)."""
    outputs, tangent_bytes = incoming
    from .timeline import Inlining

    inlining = Inlining() if fused else None
    handed = {storage_of(n) for n in outputs} - {None}
    if lin.stages:
        last = {storage_of(n) for n in lin.stages[-1].boundary if not incoming_gradient_held(n)} & handed
        tangent_bytes = max(tangent_bytes - sum(node_bytes(n) for n in outputs if storage_of(n) in last), 0)
        handed -= last
    u_f, u_b, w_a, w_abar, o_f, o_b = [], [], [], [], [], []
    w_delta = []
    w_g = [0] * len(lin.stages)
    for g in gradients:
        w_g[lin.stage_of[g] - 1] += node_bytes(g)
    u_f_last, w_abar_last = [], []
    for st in lin.stages:
        u_f.append(sum(cost.get(n, 0.0) for n in st.forward))
        # F_all^s with delta^s current: only what B^s reads is made (the emission's dead
        # code elimination drops the rest). Not the stage's saved values that only later
        # stages' B read, which are done: a transformer block's FFN output, saved for the
        # residual add the next block's B recomputes, is then not made, as checkpointing
        # a whole block skips it (counting the saved set charged the matmul anyway).
        # Values B^s recomputes itself (a view, a layer norm's normalized input) are read
        # from B^s's copies.
        members, own = set(st.forward), set(st.backward)
        read = [a for n in st.backward for a in n.all_input_nodes if a in members and a not in own]
        u_f_last.append(sum(cost.get(n, 0.0) for n in needed_ops(st, read)))
        u_b.append(sum(cost.get(n, 0.0) for n in st.backward))
        w_a.append(storage_bytes(st.boundary, inputs))
        w_delta.append(storage_bytes([n for n in st.boundary if storage_of(n) not in handed], inputs))
        w_abar.append(storage_bytes(st.boundary + st.saved, inputs))
        # And, in the view of what Inductor writes, F_all^s with delta^s current holds for B^s
        # only those of abar^s that B^s reads (through views too): a transformer MLP's
        # activation stage keeps its input, not its output (ViT's least plan: 7.82 MiB,
        # 7.56 MiB with it). The every-value view keeps the upper bound, w_abar.
        if fused:
            read_storages = {storage_of(a) for a in read}
            w_abar_last.append(storage_bytes([n for n in st.boundary + st.saved if storage_of(n) in read_storages],
                                             inputs))
        else:
            w_abar_last.append(w_abar[-1])
        o_f.append(_overhead(st.forward, inputs, inlining))
        o_b.append(_overhead(st.backward, inputs, inlining))
    return rotor.Chain(u_f=u_f, u_b=u_b, w_a=w_a, w_abar=w_abar, w_a0=0.0, w_delta=w_delta, o_f=o_f, o_b=o_b,
                       w_g=w_g, u_f_last=u_f_last, w_abar_last=w_abar_last).with_loss(turn=later_graphs[0],
                                                            turn_kept=later_graphs[1] + tangent_bytes)


def gradients_in_chain(lin: Linearization, gradients: list[fx.Node]) -> list[fx.Node]:
    """The gradients some stage's backward makes (the others are counted outside the chain)."""
    backward = {n for st in lin.stages for n in st.backward}
    return [g for g in gradients if g in backward]


def kept_after_forward(lin: Linearization, sequence: list[rotor.Op]) -> list[fx.Node]:
    """What the forward phase (the operations before the first B) leaves in memory."""
    state = {0: rotor.F_CK}
    for op in sequence:
        if op.kind == rotor.B:
            break
        state[op.stage] = op.kind
        if op.kind == rotor.F_NONE and state.get(op.stage - 1) in (rotor.F_CK, rotor.F_NONE):
            state.pop(op.stage - 1, None)
    kept: list[fx.Node] = []
    for s, kind in state.items():
        if 1 <= s <= len(lin.stages):
            st = lin.stages[s - 1]
            kept += st.boundary + (st.saved if kind == rotor.F_ALL else [])
    return kept


def needed_ops(stage: Stage, targets: list[fx.Node]) -> list[fx.Node]:
    """The ops of ``stage``'s forward that computing ``targets`` takes, in stage order."""
    members = set(stage.forward)
    need, stack = set(), [t for t in targets if t in members]
    while stack:
        n = stack.pop()
        if n in need:
            continue
        need.add(n)
        stack.extend(a for a in n.all_input_nodes if a in members)
    # Items of a multi-output op come with it.
    for n in list(need):
        if oplib.is_getitem(n) and n.args[0] in members:
            need.add(n.args[0])
    return [n for n in stage.forward if n in need]
