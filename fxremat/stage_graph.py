"""The stages of a linearized joint graph as a rematerialization DAG, for the DAG solvers.

Rotor (``fxremat/chain.py``) sees the stages as a chain: a value that skips stages is
carried in every boundary it crosses. Checkmate and TWRemat (``passes/checkmate.py``,
``passes/twremat.py``) take any DAG, so here each stage's nodes read exactly the
stages whose values they read, skips included, and a solver may free a skipped value
and compute it again later instead of holding it across the stages it spans.

Nodes (``passes.schedule.RematProblem``), listed ``f1 x1 .. fL xL bL .. b1``:

* ``f{s}``: stage ``s``'s forward ops; output: the values it makes that are read after
  the stage (``boundary`` members). Cost ``u_f``, workspace the stage's temporaries.
* ``x{s}`` (``tied=True`` only): what running the stage forward also records for its
  backward (the min-cut saved values not in ``f{s}``), *tied* to ``f{s}``: made only by
  that same run, and while held it keeps the stage's inputs (as saved tensors do).
* ``b{s}``: the stage's backward ops; output: the gradients it makes that other
  backward stages read. Parameter gradients, the tangents, the forward outputs and
  pinned values are outside the problem (constant, as in the Rotor path).

With ``tied=False`` (TWRemat, whose recursion cannot keep a tie) there is no ``x{s}``:
``b{s}`` runs the stage forward again itself (``F_all`` then ``B``; cost ``u_f + u_b``,
the recorded values as workspace), so every stage is checkpointed at its input.

A solver's sequence of computes maps to Rotor's operations (``to_sequence``), which
``emit.emit_backward`` turns into the backward graph: ``f{s} x{s}`` is ``F_all^s``,
``f{s}`` alone ``F_ck^s``, ``b{s}`` is ``B^s`` (``F_all^s B^s`` untied).

Complexity: ``O(V + E)`` of the joint graph.
"""

from __future__ import annotations

import dataclasses

import torch.fx as fx

from . import chain as chain_mod
from .passes import rotor
from .passes.schedule import RematProblem, from_computes
from .sizes import storage_bytes


@dataclasses.dataclass
class StageGraph:
    problem: RematProblem
    tied: bool
    exported: dict[int, list[fx.Node]]  # f{s}'s output values
    recorded: dict[int, list[fx.Node]]  # x{s}'s values (saved for B^s, not exported)
    skips: int  # edges f{t} -> f{s} with t < s - 1: 0 means the stages form a chain


def build(lin: chain_mod.Linearization, cost: dict[fx.Node, float], inputs: set[str], *,
          tied: bool = True) -> StageGraph:
    stage_of_fwd = {n: st.index for st in lin.stages for n in st.forward}
    stage_of_bwd = {n: st.index for st in lin.stages for n in st.backward}
    nodes: list[str] = []
    edges: set[tuple[str, str]] = set()
    size: dict[str, int] = {}
    work: dict[str, int] = {}
    price: dict[str, float] = {}
    tie: dict[str, str] = {}
    exported: dict[int, list[fx.Node]] = {}
    recorded: dict[int, list[fx.Node]] = {}
    feeds: dict[int, set[int]] = {}
    skips = 0
    for st in lin.stages:
        s, members = st.index, set(st.forward)
        exported[s] = [v for v in st.boundary if v in members]
        recorded[s] = [v for v in st.saved if v not in set(exported[s])]
        feeds[s] = {stage_of_fwd[a] for n in st.forward for a in n.all_input_nodes
                    if stage_of_fwd.get(a, s) != s}
        skips += sum(1 for t in feeds[s] if t < s - 1)
        u_f = sum(cost.get(n, 0.0) for n in st.forward)
        nodes.append(f"f{s}")
        size[f"f{s}"] = storage_bytes(exported[s], inputs)
        price[f"f{s}"] = u_f
        work[f"f{s}"] = chain_mod._overhead(st.forward, inputs)
        edges.update((f"f{t}", f"f{s}") for t in feeds[s])
        if tied:
            nodes.append(f"x{s}")
            size[f"x{s}"] = storage_bytes(recorded[s], inputs)
            price[f"x{s}"] = 0.0
            work[f"x{s}"] = work[f"f{s}"]
            tie[f"x{s}"] = f"f{s}"
            edges.add((f"f{s}", f"x{s}"))
            edges.update((f"f{t}", f"x{s}") for t in feeds[s])
    for st in reversed(lin.stages):
        s = st.index
        b = f"b{s}"
        nodes.append(b)
        out = [n for n in st.backward if any(stage_of_bwd.get(u, s) != s for u in n.users)]
        size[b] = storage_bytes(out, inputs)
        price[b] = sum(cost.get(n, 0.0) for n in st.backward)
        work[b] = chain_mod._overhead(st.backward, inputs)
        # What B^s reads of the forward: its own stage's values and a^(s-1) (the
        # linearization guarantees no more); with a tie, all of x{s}'s inputs too.
        reads_fwd = {stage_of_fwd[a] for n in st.backward for a in n.all_input_nodes if a in stage_of_fwd}
        reads_bwd = {stage_of_bwd[a] for n in st.backward for a in n.all_input_nodes
                     if stage_of_bwd.get(a, s) != s}
        edges.update((f"b{t}", b) for t in reads_bwd)
        if tied:
            edges.update((f"f{t}", b) for t in reads_fwd | feeds[s] | {s})
            if recorded[s]:
                edges.add((f"x{s}", b))
        else:  # b{s} runs F_all^s itself: it reads the stage's inputs, not its outputs
            edges.update((f"f{t}", b) for t in (reads_fwd - {s}) | feeds[s])
            price[b] += price[f"f{s}"]
            work[b] = max(work[b], work[f"f{s}"]) + storage_bytes(exported[s] + recorded[s], inputs)
    gradient_users = {u for u, v in edges if v.startswith("b") and u.startswith("b")}
    outputs = {n for n in nodes if n.startswith("b") and n not in gradient_users}
    problem = RematProblem(nodes=nodes, edges=sorted(edges), cost=price, size=size, outputs=outputs,
                           workspace=work, tied=tie)
    return StageGraph(problem, tied, exported, recorded, skips)


def to_sequence(graph: StageGraph, computes: list[str]) -> list[rotor.Op]:
    """Rotor operations for a solver's computes (see the module docstring)."""
    sequence: list[rotor.Op] = []
    for i, name in enumerate(computes):
        kind, s = name[0], int(name[1:])
        if kind == "f":
            tied_next = i + 1 < len(computes) and computes[i + 1] == f"x{s}"
            sequence.append(rotor.Op(rotor.F_ALL if tied_next else rotor.F_CK, s))
        elif kind == "b":
            if not graph.tied:
                if sequence and sequence[-1] == rotor.Op(rotor.F_CK, s):
                    sequence[-1] = rotor.Op(rotor.F_ALL, s)  # that run records the state itself
                else:
                    sequence.append(rotor.Op(rotor.F_ALL, s))
            sequence.append(rotor.Op(rotor.B, s))
    return sequence


def kept_after_forward(graph: StageGraph, computes: list[str]) -> list[fx.Node]:
    """The values resident when the first backward node runs (what the forward saves)."""
    resident: set[str] = set()
    for op in from_computes(graph.problem, computes):
        if op.kind == "compute" and op.node.startswith("b"):
            if not graph.tied:  # its F_all^s runs before the first B: in the forward phase
                resident.update((f"f{op.node[1:]}", f"x{op.node[1:]}"))
            break
        (resident.add if op.kind == "compute" else resident.discard)(op.node)
    kept: list[fx.Node] = []
    for name in sorted(resident):
        s = int(name[1:])
        kept += graph.exported[s] if name[0] == "f" else graph.recorded[s]
    return kept
