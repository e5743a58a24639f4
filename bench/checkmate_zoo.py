"""Checkmate's ILP against its two-phase LP rounding on a zoo of abstract training graphs.

    python bench/checkmate_zoo.py [--models vgg resnet ...] [--fractions 0.4 0.7]
                                  [--time-limit 120] [--out-dir bench/results/cpu]

Like the Checkmate paper's evaluation (Jain et al., MLSys 2020, section 6), on abstract
graphs: each model is a forward graph of operations (sizes of activations, FLOPs) and
the backward graph autograd would build for it (one gradient node per forward
operation, reading the gradient of its output and the tensors the operation saves for
backward; a gradient accumulation where a value has several users). Models: VGG-like,
ResNet-like, U-Net-like and MobileNet-like CNNs on small images, a transformer
block, and chains (an MLP, a heterogeneous synthetic chain). Sizes are activation
elements in KiB (fp32 bytes / 4096, at least 1); costs are MFLOPs, a backward
operation costing twice its forward for convolutions and matrix products, once for the
rest. Graph inputs (the image, the tokens) are size 0 and cost 0; parameters and
their gradients are outside the budget.

Each model is solved at budgets a fraction of the way from its working-set lower bound
(:func:`passes.schedule.memory_lower_bound`, below which nothing fits) to its
no-rematerialization peak -- 0.4 and 0.7 by default; a fixed fraction of the peak alone
would be infeasible for some models and loose for others -- with the ILP (HiGHS, under
a time limit; the report says whether it stopped early and its gap) and with two-phase
LP rounding (:func:`passes.checkmate.solve_lp`).
Writes ``checkmate_zoo.json`` and ``checkmate_zoo.md`` to ``--out-dir``. The ratio
is rounding cost / ILP cost (the ILP incumbent when it stopped early); the paper's
deterministic threshold rounding alone (``solve_lp`` without randomized roundings,
repair and local improvement) is reported beside it. Not a test:
it asserts nothing about times.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

import numpy as np
import scipy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import results_io  # noqa: E402
from fxremat.passes import checkmate  # noqa: E402
from fxremat.passes.schedule import RematProblem, memory_lower_bound, no_remat, simulate  # noqa: E402

# ----------------------------------------------------------------------------- graph builder

# Backward cost relative to the forward; which forward values the backward reads.
_BWD_FACTOR = {"conv": 2.0, "conv_act": 2.0, "linear": 2.0, "linear_act": 2.0, "matmul": 2.0}
_SAVES = {  # "in": the operation's inputs, "out": its output
    "conv": ("in",), "conv_act": ("in", "out"), "linear": ("in",), "linear_act": ("in", "out"),
    "matmul": ("in",), "relu": ("out",), "norm": ("in",), "softmax": ("out",),
    "maxpool": ("in", "out"), "avgpool": (), "add": (), "add_act": ("out",), "concat": (),
    "upsample": (), "loss": ("in",), "flatten": (),
}


@dataclasses.dataclass
class _FwdOp:
    name: str
    kind: str
    inputs: list[str]
    size: int
    flops: float


class Graph:
    """A forward graph under construction; :meth:`training_problem` adds the backward.

    Tensors are ``(batch * C, H, W)`` for images and ``(..., features)`` otherwise;
    ``act=True`` fuses the activation into a convolution or linear layer (as Keras
    layers do, the granularity of the Checkmate paper's graphs): its backward then
    reads both the input and the output.
    """

    def __init__(self, batch: int):
        self.batch = batch
        self.ops: list[_FwdOp] = []
        self.shape: dict[str, tuple[int, ...]] = {}

    def _add(self, kind, inputs, shape, flops, name=None) -> str:
        name = name or f"{kind.split('_')[0]}{len(self.ops)}"
        self.ops.append(_FwdOp(name, kind, list(inputs), max(1, round(math.prod(shape) / 1024)), flops / 1e6))
        self.shape[name] = shape
        return name

    def input(self, shape) -> str:
        self.ops.append(_FwdOp("input", "input", [], 0, 0.0))
        self.shape["input"] = shape
        return "input"

    def conv(self, x, cout, k=3, stride=1, depthwise=False, act=True) -> str:
        c, h, w = self.shape[x]
        oh, ow = h // stride, w // stride
        cin = 1 if depthwise else c // self.batch
        return self._add("conv_act" if act else "conv", [x], (cout * self.batch, oh, ow),
                         2 * self.batch * cin * cout * k * k * oh * ow)

    def linear(self, x, dout, act=False) -> str:
        shape = self.shape[x]
        return self._add("linear_act" if act else "linear", [x], shape[:-1] + (dout,),
                         2 * math.prod(shape[:-1]) * shape[-1] * dout)

    def pointwise(self, kind, x) -> str:
        return self._add(kind, [x], self.shape[x], 5 * math.prod(self.shape[x]))

    def maxpool(self, x) -> str:
        c, h, w = self.shape[x]
        return self._add("maxpool", [x], (c, h // 2, w // 2), c * h * w)

    def upsample(self, x) -> str:
        c, h, w = self.shape[x]
        return self._add("upsample", [x], (c, 2 * h, 2 * w), 4 * c * h * w)

    def add(self, a, b, act=False) -> str:
        return self._add("add_act" if act else "add", [a, b], self.shape[a], 2 * math.prod(self.shape[a]))

    def concat(self, a, b) -> str:
        (ca, h, w), (cb, _, _) = self.shape[a], self.shape[b]
        return self._add("concat", [a, b], (ca + cb, h, w), (ca + cb) * h * w)

    def flatten_pool(self, x) -> str:
        """Global average pool to ``(batch, C)``."""
        c, h, w = self.shape[x]
        return self._add("avgpool", [x], (self.batch, c // self.batch), c * h * w)

    def flatten(self, x) -> str:
        return self._add("flatten", [x], (self.batch, math.prod(self.shape[x]) // self.batch), 0)

    def matmul(self, a, b, shape) -> str:
        k = self.shape[a][-1]
        return self._add("matmul", [a, b], shape, 2 * math.prod(shape) * k)

    def loss(self, x) -> str:
        return self._add("loss", [x], (1,), 5 * math.prod(self.shape[x]), name="loss")

    def training_problem(self) -> RematProblem:
        """Forward nodes in order, then per forward op in reverse order: the accumulation
        of its output's gradient (when it has several users) and its backward node
        ``d_<op>``, which reads that gradient and what the op saves, and outputs the
        gradients of its inputs (parameter gradients are outside the budget)."""
        ops = [op for op in self.ops if op.kind != "input"]
        graph_inputs = {op.name for op in self.ops if op.kind == "input"}
        users: dict[str, list[str]] = {op.name: [] for op in self.ops}
        for op in ops:
            for i in op.inputs:
                users[i].append(op.name)
        by_name = {op.name: op for op in self.ops}
        nodes, edges, cost, size = [], [], {}, {}

        def node(name, c, s, reads):
            nodes.append(name)
            cost[name], size[name] = float(c), int(s)
            edges.extend((r, name) for r in dict.fromkeys(reads))

        for op in self.ops:
            node(op.name, op.flops, op.size, op.inputs)
        for op in reversed(ops):
            reads = []
            if op.name != "loss":
                outs = users[op.name]
                if len(outs) == 1:
                    reads.append(f"d_{outs[0]}")
                else:  # gradient accumulation
                    node(f"acc_{op.name}", op.size * len(outs) / 1e3, op.size, [f"d_{u}" for u in outs])
                    reads.append(f"acc_{op.name}")
            saves = _SAVES[op.kind]
            reads += op.inputs if "in" in saves else []
            reads += [op.name] if "out" in saves else []
            grad_size = sum(by_name[i].size for i in op.inputs if i not in graph_inputs)
            node(f"d_{op.name}", op.flops * _BWD_FACTOR.get(op.kind, 1.0), grad_size, reads)
        used = {u for u, _ in edges}
        outputs = {v for v in nodes if v.startswith("d_") and v not in used}
        return RematProblem(nodes=nodes, edges=edges, cost=cost, size=size, outputs=outputs)


# ----------------------------------------------------------------------------- the zoo

def vgg(batch=8) -> RematProblem:
    """VGG-16-like on 3x32x32 images: 13 conv-ReLU layers, 5 max pools, two linear layers."""
    g = Graph(batch)
    x = g.input((3 * batch, 32, 32))
    for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        x = g.maxpool(x) if v == "M" else g.conv(x, v)
    g.loss(g.linear(g.linear(g.flatten(x), 512, act=True), 10))
    return g.training_problem()


def resnet(blocks=2, batch=8) -> RematProblem:
    """ResNet-like (CIFAR): a stem and 3 stages of ``blocks`` basic blocks (16-32-64 channels,
    batch norm folded into the convolutions), strided 1x1 projections, global pool, linear."""
    g = Graph(batch)
    x = g.conv(g.input((3 * batch, 32, 32)), 16)
    for stage, width in enumerate([16, 32, 64]):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = g.conv(g.conv(x, width, stride=stride), width, act=False)
            short = g.conv(x, width, k=1, stride=stride, act=False) if stride > 1 else x
            x = g.add(y, short, act=True)
    g.loss(g.linear(g.flatten_pool(x), 10))
    return g.training_problem()


def unet(batch=4) -> RematProblem:
    """U-Net-like on 3x64x64: 3 levels of two conv-ReLU layers (max pool down; upsample and
    concatenation with the skip up), a bottleneck, a 1x1 head."""
    g = Graph(batch)
    x = g.input((3 * batch, 64, 64))
    skips = []
    for width in (16, 32, 64):
        x = g.conv(g.conv(x, width), width)
        skips.append(x)
        x = g.maxpool(x)
    x = g.conv(x, 128)
    for width, skip in zip((64, 32, 16), reversed(skips)):
        x = g.conv(g.conv(g.concat(g.upsample(x), skip), width), width)
    g.loss(g.conv(x, 2, k=1, act=False))
    return g.training_problem()


def mobilenet(batch=8) -> RematProblem:
    """MobileNetV2-like on 3x32x32: inverted residual blocks (1x1 expansion x6 with ReLU6, 3x3
    depthwise with ReLU6, linear 1x1 projection, a residual add when shapes match)."""
    g = Graph(batch)
    x = g.conv(g.input((3 * batch, 32, 32)), 16, stride=2)
    cin = 16
    for cout, stride in [(16, 1), (24, 2), (24, 1), (32, 2), (32, 1), (64, 1)]:
        y = g.conv(g.conv(x, 6 * cin, k=1), 6 * cin, stride=stride, depthwise=True)
        y = g.conv(y, cout, k=1, act=False)
        x = g.add(y, x) if stride == 1 and cin == cout else y
        cin = cout
    g.loss(g.linear(g.flatten_pool(x), 10))
    return g.training_problem()


def transformer(blocks=1, batch=4, seq=256, dim=256, heads=4) -> RematProblem:
    """Pre-norm transformer block(s): LayerNorm, Q/K/V projections, attention scores, softmax,
    context, output projection, residual; LayerNorm, MLP (4x, GELU fused), residual; a
    LayerNorm and a linear head (vocabulary 512)."""
    g = Graph(batch)
    x = g.input((batch, seq, dim))
    for _ in range(blocks):
        h = g.pointwise("norm", x)
        q, k, v = (g.linear(h, dim) for _ in range(3))
        p = g.pointwise("softmax", g.matmul(q, k, (batch, heads, seq, seq)))
        x = g.add(x, g.linear(g.matmul(p, v, (batch, seq, dim)), dim))
        x = g.add(x, g.linear(g.linear(g.pointwise("norm", x), 4 * dim, act=True), dim))
    g.loss(g.linear(g.pointwise("norm", x), 512))
    return g.training_problem()


def mlp_chain(layers=16, batch=256, width=1024) -> RematProblem:
    """Linear-ReLU layers of equal width: a homogeneous chain."""
    g = Graph(batch)
    x = g.input((batch, width))
    for _ in range(layers):
        x = g.linear(x, width, act=True)
    g.loss(g.linear(x, 10))
    return g.training_problem()


def synthetic_chain(layers=24, seed=0) -> RematProblem:
    """A heterogeneous training chain (seeded): forward f0..fL, backward gL..g1 with g_i
    reading g_{i+1} and f_{i-1}; sizes 1-10, forward costs 1-5, backward twice that."""
    rng = np.random.default_rng(seed)
    fsize = rng.integers(1, 11, layers + 1)
    fcost = rng.integers(1, 6, layers + 1)
    nodes = [f"f{i}" for i in range(layers + 1)] + [f"g{i}" for i in range(layers, 0, -1)]
    edges = [(f"f{i - 1}", f"f{i}") for i in range(1, layers + 1)]
    for i in range(layers, 0, -1):
        edges += [(f"g{i + 1}" if i < layers else f"f{layers}", f"g{i}"), (f"f{i - 1}", f"g{i}")]
    cost = {f"f{i}": float(fcost[i]) for i in range(layers + 1)}
    cost.update({f"g{i}": 2.0 * float(fcost[i]) for i in range(1, layers + 1)})
    size = {f"f{i}": int(fsize[i]) for i in range(layers + 1)}
    size.update({f"g{i}": int(fsize[i - 1]) for i in range(1, layers + 1)})
    return RematProblem(nodes=nodes, edges=edges, cost=cost, size=size, outputs={"g1"})


ZOO = {
    "vgg": vgg, "resnet": resnet, "unet": unet, "mobilenet": mobilenet, "transformer": transformer,
    "mlp_chain": mlp_chain, "synthetic_chain": synthetic_chain,
}


# ----------------------------------------------------------------------------- the benchmark

def solve_model(name: str, fractions, time_limit: float) -> list[dict]:
    problem = ZOO[name]()
    sub = problem.restricted()
    base_cost, peak = simulate(problem, no_remat(problem))
    rows = []
    for fraction in fractions:
        lower = memory_lower_bound(problem)
        budget = math.floor(lower + fraction * (peak - lower))
        row = {"model": name, "nodes": len(sub.nodes), "edges": len(sub.edges), "fraction": fraction,
               "budget": budget, "no_remat_peak": peak, "no_remat_cost": base_cost,
               "lower_bound": lower, "budget_of_peak": budget / peak}
        start = time.perf_counter()
        try:
            ilp = checkmate.solve(problem, budget, time_limit=time_limit, report_min_budget=False)
            row.update(ilp_cost=ilp.cost, ilp_peak=ilp.peak_bytes, ilp_seconds=ilp.solve_seconds,
                       ilp_status=ilp.status, ilp_stopped_early=ilp.stopped_early, ilp_gap=ilp.gap,
                       ilp_bound=ilp.bound)
        except checkmate.NoScheduleFound as err:
            row.update(ilp_cost=None, ilp_status="infeasible" if isinstance(err, checkmate.InfeasibleBudget)
                       else "no incumbent", ilp_error=str(err), ilp_seconds=time.perf_counter() - start)
        try:  # the paper's deterministic threshold rounding alone (this module's solve_lp before its additions)
            plain = checkmate.solve_lp(problem, budget, time_limit=time_limit, random_roundings=0, repair=False,
                                       improve=False, always_scales=1)
            row.update(plain_cost=plain.cost, plain_seconds=plain.solve_seconds)
        except checkmate.NoScheduleFound:
            row.update(plain_cost=None)
        start = time.perf_counter()
        try:
            lp = checkmate.solve_lp(problem, budget, time_limit=time_limit)
            row.update(lp_cost=lp.cost, lp_peak=lp.peak_bytes, lp_seconds=lp.solve_seconds,
                       lp_bound=lp.bound, lp_stopped_early=lp.stopped_early)
        except checkmate.NoScheduleFound as err:
            row.update(lp_cost=None, lp_seconds=time.perf_counter() - start, lp_error=str(err))
        if row.get("ilp_cost") and row.get("lp_cost"):
            row["ratio"] = row["lp_cost"] / row["ilp_cost"]
        if row.get("ilp_cost") and row.get("plain_cost"):
            row["plain_ratio"] = row["plain_cost"] / row["ilp_cost"]
        rows.append(row)
        print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(r) -> str:
    return (f"{r['model']}@{r['fraction']:.0%}: ilp {r.get('ilp_cost')} ({r.get('ilp_status')}, "
            f"{r.get('ilp_seconds', 0):.1f}s) lp {r.get('lp_cost')} ({r.get('lp_seconds', 0):.1f}s) "
            f"ratio {r.get('ratio')}")


def geomean(xs) -> float | None:
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def markdown(rows, meta) -> str:
    command = meta.get("command", "python bench/checkmate_zoo.py --out-dir bench/results/cpu")
    lines = [
        "# Checkmate: ILP vs two-phase LP rounding on the abstract zoo",
        "",
        f"`{command}` ({meta['date']}, {meta['cpus']} CPUs "
        f"shared with other jobs, SciPy {meta['scipy']} / HiGHS, time limit {meta['time_limit']:g} s for the ILP "
        "and for the rounding). Budget: the fraction of the way from the working-set lower bound to the "
        "no-rematerialization peak (and, in brackets, the budget as a share of that peak). Costs are relative "
        "to no rematerialization (1.000: nothing recomputed). Ratio: rounding cost / ILP cost (the ILP's "
        "incumbent where it stopped at the time limit; gap: its relative distance to HiGHS's dual bound).",
        "",
        "| model | nodes | budget | ILP cost | ILP status | ILP gap | ILP (s) | rounding cost | rounding (s) "
        "| ratio | thresholds only: cost | ratio |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        base = r["no_remat_cost"]
        ilp = f"{r['ilp_cost'] / base:.3f}" if r.get("ilp_cost") else "—"
        lp = f"{r['lp_cost'] / base:.3f}" if r.get("lp_cost") else "—"
        gap = f"{r['ilp_gap']:.1%}" if r.get("ilp_stopped_early") else ("0" if r.get("ilp_cost") else "—")
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "—"
        plain = f"{r['plain_cost'] / base:.3f}" if r.get("plain_cost") else "—"
        plain_ratio = f"{r['plain_ratio']:.3f}" if "plain_ratio" in r else "—"
        lines.append(
            f"| {r['model']} | {r['nodes']} | {r['fraction']:.0%} ({r['budget_of_peak']:.0%}) | {ilp} | "
            f"{r.get('ilp_status')} | {gap} | {r.get('ilp_seconds', float('nan')):.1f} | {lp} | "
            f"{r.get('lp_seconds', float('nan')):.1f} | {ratio} | {plain} | {plain_ratio} |")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    proven = [r["ratio"] for r in rows if "ratio" in r and not r.get("ilp_stopped_early")]
    lines.append("")
    if ratios:
        lines.append(f"Geometric mean of the ratio over the {len(ratios)} cases both solved: **{geomean(ratios):.3f}** "
                     f"(max {max(ratios):.3f}, min {min(ratios):.3f}); over the {len(proven)} with a proven ILP "
                     f"optimum: {geomean(proven):.3f}." if proven else "")
    plain = [r["plain_ratio"] for r in rows if "plain_ratio" in r]
    if plain:
        lines.append(f"\nThe paper's deterministic rounding alone (thresholds on the LP at the budget, then at "
                     f"smaller LP budgets until one fits): geometric mean {geomean(plain):.3f} over {len(plain)} "
                     f"cases (max {max(plain):.3f}); it found no schedule in "
                     f"{sum(1 for r in rows if r.get('ilp_cost') and not r.get('plain_cost'))} of the cases the ILP "
                     "solved.")
    failed = [r for r in rows if "ratio" not in r]
    if failed:
        lines += ["", "Not compared: " + "; ".join(
            f"{r['model']} at {r['fraction']:.0%} (ILP: {r.get('ilp_status')}, rounding: "
            f"{'no schedule' if r.get('lp_cost') is None else 'ok'})" for r in failed) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(ZOO))
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.4, 0.7],
                        help="budgets: fractions of the way from the working-set bound to the no-remat peak")
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--out-dir", default=None, help="write checkmate_zoo.{json,md} here")
    args = parser.parse_args()
    rows = []
    for name in args.models:
        rows += solve_model(name, args.fractions, args.time_limit)
    meta = {**results_io.metadata(), "scipy": scipy.__version__, "time_limit": args.time_limit,
            "fractions": args.fractions}  # date, cpus, python, ...
    md = markdown(rows, meta)
    print(md)
    if args.out_dir:
        results_io.write_json(os.path.join(args.out_dir, "checkmate_zoo.json"), {"meta": meta, "rows": rows})
        results_io.write_text(os.path.join(args.out_dir, "checkmate_zoo.md"), md)


if __name__ == "__main__":
    main()
