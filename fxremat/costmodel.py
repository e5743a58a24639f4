"""Runtime estimates of FX graphs: roofline per kernel, kernels as Inductor would fuse them.

    profile = costmodel.profile_for("cpu")               # or "cuda", torch.device, a DeviceProfile
    est = costmodel.estimate_graph(gm, profile)          # GraphEstimate(total_s, per_group)
    step = costmodel.estimate_step(fwd_gm, bwd_gm, profile)

**Device profiles** (``DeviceProfile``): peak FLOP/s per dtype class for compute-intensive
ops (matmul, convolution, attention: tensor cores where the device has them), the fp32
elementwise rate for everything else, memory bandwidth, and a per-kernel launch overhead. GPUs
use dense (no-sparsity) vendor datasheet figures; the CPU profile is measured on the
machine (``calibrate_cpu``: matmuls, a large and a cache-sized copy, a tiny op; about a
second) and cached in ``$FXREMAT_CACHE_DIR`` or ``~/.cache/fxremat``, with a
documented default (``DEFAULT_CPU``) when it is not calibrated.

**Per node** (``node_flops``, ``node_bytes_moved``, ``node_time``): FLOPs from torch's flop
counter formulas (``torch.utils.flop_counter.flop_registry``, fed the fake tensors in
``node.meta["val"]``) for the ops it knows, otherwise one FLOP per output element
(``TRANSCENDENTAL_FLOPS`` for exp, log, erf, tanh, ...; per input element for reductions);
bytes are inputs read plus outputs written, views free; time =
``max(flops / peak, bytes / bandwidth) + launch overhead``.

**Per graph** (``kernel_groups``, ``estimate_graph``): fusible ops (``oplib.is_fusible``:
pointwise, reductions, copies) joined to their fusible producers form one kernel, as
Inductor fuses them; compute-intensive and unfusible ops are kernels of their own (library
calls). A kernel moves its external reads (each storage once) plus the values it
materializes (``timeline.Inlining`` says which it never writes; a value another kernel
reads is written), so a chain of pointwise ops moves its bytes once; it costs its roofline
time plus one launch overhead.

**Measured mode** (``OpTimer``): time kernels on the device with random inputs of the
nodes' shapes, strides and dtypes (median of a few runs), cached on disk by (ops, shapes,
strides, dtypes, arguments, device name, torch version) so re-runs are free. Its default
scope times only the library kernels (what Inductor calls as extern kernels: eager timing
is the real cost) and keeps the roofline for fused kernels, which eager execution would not
fuse; ``scope="all"`` times those too (op by op: an upper bound).

Approximations, stated: bandwidth is the last-level cache's for a kernel moving less than
the cache holds (when the profile knows the cache; datasheets give no L2 bandwidth, so GPU
profiles always use HBM bandwidth), otherwise the memory's; whether a kernel's output
buffer is still in cache (Inductor reusing a just-freed buffer, or a cold one) is not
modelled, and on CPU it can change a pointwise kernel's time by 2x (bench/runtime_ranking.py);
kernels do not overlap; the fusion groups follow fxremat's op classes, not Inductor's
scheduler (which may split a group into a few kernels, e.g. reductions over different axes);
matmul efficiency does not depend on shape (``OpTimer`` measures it).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable

import torch
import torch.fx as fx

from . import oplib
from .sizes import _hint, flat_tensors, node_bytes, tensor_bytes
from .timeline import Inlining

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


# --- device profiles ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Peak rates of one device.

    ``matmul_flops``: FLOP/s of compute-intensive ops by dtype class (``"fp64"``, ``"fp32"``,
    ``"tf32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``); a class the device lacks falls back to
    ``"fp32"``. ``vector_flops``: simple fp32 elementwise operations per second for everything
    else (CUDA cores, SIMD units): one per element per op, so half the FMA-counted FP32 peak
    (a fused multiply-add is 2 FLOPs in datasheets and matmul counts, one instruction here).
    ``bandwidth``: main-memory bytes/s. ``cache_bytes``/``cache_bandwidth``: the last-level
    cache, used for kernels that move less than it holds, when both are known.
    ``launch_overhead``: seconds per kernel. ``source``: where the figures come from.
    """

    name: str
    matmul_flops: dict[str, float]
    vector_flops: float
    bandwidth: float
    launch_overhead: float
    cache_bytes: int | None = None
    cache_bandwidth: float | None = None
    source: str = ""

    def peak_flops(self, dtype: torch.dtype, compute_intensive: bool, tf32: bool = False) -> float:
        if not compute_intensive:
            return self.vector_flops
        cls = dtype_class(dtype)
        if cls == "fp32" and tf32 and "tf32" in self.matmul_flops:
            cls = "tf32"
        return self.matmul_flops.get(cls, self.matmul_flops["fp32"])

    def bandwidth_for(self, nbytes: float) -> float:
        if self.cache_bytes and self.cache_bandwidth and nbytes <= self.cache_bytes:
            return self.cache_bandwidth
        return self.bandwidth

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def dtype_class(dtype: torch.dtype) -> str:
    if dtype == torch.float64:
        return "fp64"
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype.is_floating_point and dtype.itemsize == 1:
        return "fp8"
    return "fp32"


T = 1e12
# Dense figures (the datasheets' headline tensor-core numbers are "with sparsity": halved here).
# NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5 80GB): FP64 34 TFLOPS, FP32 67 TFLOPS,
# TF32 tensor core 989 TFLOPS sparse (494.5 dense), BF16/FP16 1,979 sparse (989.5 dense),
# FP8 3,958 sparse (1,979 dense); HBM3 3.35 TB/s; L2 50 MB.
H100_SXM = DeviceProfile(
    "NVIDIA H100 SXM", {"fp64": 67 * T, "fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T, "fp16": 989.5 * T,
                        "fp8": 1979 * T}, vector_flops=67 * T / 2, bandwidth=3.35e12, launch_overhead=4e-6,
    cache_bytes=50 * 2**20, source="NVIDIA H100 datasheet, SXM5, dense")
# Same datasheet, H100 PCIe 80GB: FP64 26, FP32 51, TF32 756 sparse, BF16/FP16 1,513 sparse,
# FP8 3,026 sparse; HBM2e 2 TB/s.
H100_PCIE = DeviceProfile(
    "NVIDIA H100 PCIe", {"fp64": 51 * T, "fp32": 51 * T, "tf32": 378 * T, "bf16": 756.5 * T, "fp16": 756.5 * T,
                         "fp8": 1513 * T}, vector_flops=51 * T / 2, bandwidth=2.0e12, launch_overhead=4e-6,
    cache_bytes=50 * 2**20, source="NVIDIA H100 datasheet, PCIe, dense")
# NVIDIA H200 Tensor Core GPU datasheet (H200 SXM 141GB): FP64 34, FP64 tensor core 67,
# FP32 67, TF32 989 sparse, BF16/FP16 1,979 sparse, FP8 3,958 sparse; HBM3e 4.8 TB/s.
H200 = DeviceProfile(
    "NVIDIA H200", {"fp64": 67 * T, "fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T, "fp16": 989.5 * T,
                    "fp8": 1979 * T}, vector_flops=67 * T / 2, bandwidth=4.8e12, launch_overhead=4e-6,
    cache_bytes=50 * 2**20, source="NVIDIA H200 datasheet, SXM, dense")
# NVIDIA A100 Tensor Core GPU datasheet: FP64 9.7 (tensor core 19.5), FP32 19.5, TF32 156
# (312 sparse), BF16/FP16 312 (624 sparse); A100 80GB SXM HBM2e 2,039 GB/s, 80GB PCIe
# 1,935 GB/s; L2 40 MB.
A100_80GB = DeviceProfile(
    "NVIDIA A100 80GB", {"fp64": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
    vector_flops=19.5 * T / 2, bandwidth=2.039e12, launch_overhead=4e-6, cache_bytes=40 * 2**20,
    source="NVIDIA A100 datasheet, 80GB SXM, dense")
A100_80GB_PCIE = dataclasses.replace(A100_80GB, name="NVIDIA A100 80GB PCIe", bandwidth=1.935e12,
                                     source="NVIDIA A100 datasheet, 80GB PCIe, dense")

# Matched against torch.cuda.get_device_name() (lower case), first match wins.
GPU_PROFILES: list[tuple[tuple[str, ...], DeviceProfile]] = [
    (("h200",), H200),
    (("h100", "pcie"), H100_PCIE),
    (("h100",), H100_SXM),
    (("a100", "80gb", "pcie"), A100_80GB_PCIE),
    (("a100", "80gb"), A100_80GB),
]

# Uncalibrated CPU: one modern x86 core with AVX2 FMA per thread (about 50 GFLOP/s fp32
# matmul, so 25e9 elementwise ops/s), 20 GB/s DRAM, 50 GB/s last-level cache, 5 us per
# eager op / kernel call.
DEFAULT_CPU = DeviceProfile(
    "cpu (default, uncalibrated)", {"fp32": 50e9, "fp64": 25e9, "bf16": 25e9}, vector_flops=25e9,
    bandwidth=20e9, launch_overhead=5e-6, cache_bytes=None, cache_bandwidth=50e9,
    source="fxremat default (not measured)")


def cache_dir() -> pathlib.Path:
    """``$FXREMAT_CACHE_DIR``, else ``~/.cache/fxremat``."""
    return pathlib.Path(os.environ.get("FXREMAT_CACHE_DIR") or pathlib.Path.home() / ".cache" / "fxremat")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _llc_bytes() -> int | None:
    """Size of the largest CPU cache Linux reports, or None."""
    sizes = []
    for index in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else None


def _median_time(fn: Callable[[], Any], repeats: int, sync: Callable[[], None] = lambda: None,
                 warmup_s: float = 0.0) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs, after one run and ``warmup_s`` of runs
    (lets clocks and caches settle)."""
    fn()
    sync()
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        fn()
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Bumped whenever what calibrate_cpu measures changes, so older cached entries are not used.
CALIBRATION_VERSION = 2


def _cpu_key() -> str:
    return f"{_cpu_name()}|threads={torch.get_num_threads()}|torch={torch.__version__}|v{CALIBRATION_VERSION}"


def _read_json(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: pathlib.Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def calibrate_cpu(*, force: bool = False, directory: str | os.PathLike | None = None) -> DeviceProfile:
    """Measure this CPU (at the current ``torch.get_num_threads()``) and cache the result
    in ``<cache dir>/cpu_profile.json``, keyed by CPU model, thread count and torch
    version (and ``CALIBRATION_VERSION``); a cached entry is reused unless ``force``. Takes about a second.

    Measured: fp32/fp64/bf16 ``mm`` of 512x512 matrices (FLOP/s), a copy of twice the
    last-level cache (memory bandwidth: bytes read + written per second), a copy of an
    eighth of it (cache bandwidth), and a 4-element add (per-op overhead); medians, after a
    short warm-up each. The elementwise rate is half the fp32 matmul rate: both run on the
    same SIMD FMA units, a matmul's FMA counting 2 FLOPs, a pointwise op's instruction one
    (checked against Inductor's C++ for a chain of adds and muls: within 10% on an AMD EPYC)."""
    path = pathlib.Path(directory) if directory is not None else cache_dir()
    path = path / "cpu_profile.json"
    key = _cpu_key()
    cached = _read_json(path)
    if not force and key in cached:
        return _profile_from_json(cached[key])
    llc = _llc_bytes()
    matmul = {}
    for cls, dtype in (("fp32", torch.float32), ("fp64", torch.float64), ("bf16", torch.bfloat16)):
        a, b = torch.randn(512, 512, dtype=dtype), torch.randn(512, 512, dtype=dtype)
        matmul[cls] = 2 * 512**3 / _median_time(lambda: torch.mm(a, b), 15, warmup_s=0.1)
    big = 2 * (llc or 32 * 2**20)
    src, dst = torch.ones(big // 4), torch.empty(big // 4)
    bandwidth = 2 * big / _median_time(lambda: dst.copy_(src), 7, warmup_s=0.03)
    small = (llc or 32 * 2**20) // 8
    src_c, dst_c = src[: small // 4].clone(), dst[: small // 4]
    cache_bandwidth = 2 * small / _median_time(lambda: dst_c.copy_(src_c), 21, warmup_s=0.02)
    tiny, tiny_out = torch.ones(4), torch.empty(4)
    launch = _median_time(lambda: torch.add(tiny, 1.0, out=tiny_out), 201, warmup_s=0.01)
    profile = DeviceProfile(
        f"cpu: {_cpu_name()}, {torch.get_num_threads()} threads", matmul, vector_flops=matmul["fp32"] / 2,
        bandwidth=bandwidth, launch_overhead=launch, cache_bytes=llc, cache_bandwidth=cache_bandwidth,
        source=f"calibrated {time.strftime('%Y-%m-%d')} (fxremat.costmodel.calibrate_cpu), torch {torch.__version__}")
    cached[key] = profile.to_json()
    _write_json(path, cached)
    return profile


def _profile_from_json(data: dict) -> DeviceProfile:
    return DeviceProfile(**data)


def cpu_profile(calibrate: bool = False, *, directory: str | os.PathLike | None = None) -> DeviceProfile:
    """This CPU's calibrated profile if one is cached (or ``calibrate``: measure it now),
    else ``DEFAULT_CPU`` with this machine's cache size."""
    if calibrate:
        return calibrate_cpu(directory=directory)
    path = (pathlib.Path(directory) if directory is not None else cache_dir()) / "cpu_profile.json"
    cached = _read_json(path).get(_cpu_key())
    if cached:
        return _profile_from_json(cached)
    return dataclasses.replace(DEFAULT_CPU, cache_bytes=_llc_bytes())


def gpu_profile(device_name: str) -> DeviceProfile | None:
    lowered = device_name.lower()
    for words, profile in GPU_PROFILES:
        if all(w in lowered for w in words):
            return profile
    return None


def profile_for(device: str | torch.device | DeviceProfile | None = None, *, calibrate: bool = False) -> DeviceProfile:
    """The profile of ``device``: a CUDA device by its name (H100 SXM/PCIe, H200, A100 80GB;
    an unknown GPU warns and uses the A100 80GB figures), anything else the CPU
    (``cpu_profile``). ``None``: the current CUDA device if there is one, else the CPU."""
    if isinstance(device, DeviceProfile):
        return device
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type != "cuda":
        return cpu_profile(calibrate)
    name = torch.cuda.get_device_name(device)
    found = gpu_profile(name)
    if found is None:
        warnings.warn(f"fxremat.costmodel: no profile for GPU {name!r}; using the A100 80GB datasheet figures "
                      "(pass a DeviceProfile, or use OpTimer for measured times)", stacklevel=2)
        return dataclasses.replace(A100_80GB, name=f"{name} (A100 80GB figures)")
    return found


# --- per node ---------------------------------------------------------------------------------


def _numel(t: torch.Tensor) -> int:
    return _hint(t.numel())


def _meta(arg):
    """An FX argument with nodes replaced by their fake values."""
    if isinstance(arg, fx.Node):
        return arg.meta.get("val")
    if isinstance(arg, (list, tuple)):
        return type(arg)(_meta(a) for a in arg)
    if isinstance(arg, dict):
        return {k: _meta(v) for k, v in arg.items()}
    return arg


def _packet(node: fx.Node):
    return node.target.overloadpacket if isinstance(node.target, torch._ops.OpOverload) else None


def _flop_registry() -> dict:
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def _is_alias(node: fx.Node) -> bool:
    """A view, or an item of a view op's tuple (``split``): no kernel, shares storage."""
    if node.op != "call_function":
        return False
    if oplib.is_view(node):
        return True
    return oplib.is_getitem(node) and isinstance(node.args[0], fx.Node) and oplib.is_view(node.args[0])


def _storage(node: fx.Node) -> fx.Node:
    """The node whose value holds ``node``'s data (through views)."""
    while _is_alias(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _producer(node: fx.Node) -> fx.Node:
    """The op that computes ``node``'s data (through views and tuple items)."""
    node = _storage(node)
    if oplib.is_getitem(node) and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return node


def _is_kernel(node: fx.Node) -> bool:
    """Does this node run code on the device (not a view, tuple item, placeholder or shape op)?"""
    if node.op != "call_function" or _is_alias(node) or oplib.is_getitem(node):
        return False
    return bool(flat_tensors(node.meta.get("val")))


def node_flops(node: fx.Node) -> float:
    """FLOPs of one op: torch's flop-counter formula if it has one, otherwise one per
    output element (``TRANSCENDENTAL_FLOPS`` for transcendental pointwise ops; reductions
    one per input element). Views and non-kernels: 0."""
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
    store = _storage(arg)
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
             compute_intensive: bool = False, tf32: bool | None = None) -> tuple[float, str]:
    """(seconds without launch overhead, "compute" or "memory")."""
    tf32 = _default_tf32(profile) if tf32 is None else tf32
    compute = flops / profile.peak_flops(dtype, compute_intensive, tf32)
    memory = nbytes / profile.bandwidth_for(nbytes)
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
        if (_fuses(node) or _is_alias(node) or oplib.is_getitem(node)) and all(p in constant for p in producers):
            constant.add(node)
    inlined: set[fx.Node] = set()
    for node in reversed(gm.graph.nodes):  # readers first: a constant read only by inlined ones is inlined too
        if node in constant and _is_kernel(node):
            if all(r.op == "call_function" and ((_fuses(r) and r not in constant) or r in inlined)
                   for r in _readers(node)):
                inlined.add(node)
    return inlined


def kernel_groups(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The graph's kernels as Inductor would make them: each fusible op joins the kernel
    of every fusible op it reads (through views) unless a library kernel (matmul,
    convolution, any unfusible op) lies on a path between them, which would make the
    fused kernel both feed and wait for it; other ops run alone. In graph order (a
    kernel sits at its first node), each kernel's nodes in graph order."""
    inlined = inlined_constants(gm)
    nodes = [n for n in gm.graph.nodes if _is_kernel(n) and n not in inlined]
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
        for a in node.all_input_nodes:
            producer = _producer(a)
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


@dataclasses.dataclass
class KernelEstimate:
    nodes: list[str]
    kind: str  # "fused" (fusible ops), "compute" (matmul, conv, attention), "other" (unfusible library op)
    flops: float
    bytes_read: int
    bytes_written: int
    seconds: float
    bound: str  # "compute", "memory" or "measured"

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


def _readers(node: fx.Node) -> list[fx.Node]:
    """The nodes that read ``node``'s data, through views and tuple items."""
    found = []
    for user in node.users:
        found.extend(_readers(user) if user.op == "call_function" and (_is_alias(user) or oplib.is_getitem(user))
                     else [user])
    return found


def written(node: fx.Node, group: list[fx.Node] | set[fx.Node], inlining: Inlining | None = None) -> bool:
    """Does the kernel ``group`` write ``node``'s value to memory? Unless Inductor fuses
    it away (``timeline.Inlining``), or, when the kernel is that one op alone, always;
    and always when a reader lies outside the kernel (it reads it from memory).
    ``inlining``: the graph's memo of those choices (one per graph: each decision walks
    the value's inlined inputs, so a fresh memo per call is quadratic on a long graph)."""
    if len(group) == 1 or not (inlining or Inlining()).fused_away(node):
        return True
    return any(r not in group for r in _readers(node))


def _group_traffic(group: list[fx.Node], inlined: set[fx.Node] = frozenset(),
                   inlining: Inlining | None = None) -> tuple[int, int]:
    """(bytes read from outside the kernel, each storage once; bytes the kernel writes).
    Values in ``inlined`` are computed inside the kernel: nothing to read."""
    members = set(group)
    reads: dict[fx.Node, int] = {}
    nwritten = 0
    for node in group:
        for a in node.all_input_nodes:
            if not flat_tensors(a.meta.get("val")) or _producer(a) in members or _producer(a) in inlined:
                continue
            store, nbytes = _read_bytes(a)
            reads[store] = min(reads.get(store, 0) + nbytes, node_bytes(store))
        if written(node, members, inlining):
            nwritten += node_bytes(node)
    return sum(reads.values()), nwritten


def _kind(group: list[fx.Node]) -> str:
    if len(group) == 1 and oplib.is_compute_intensive(group[0]):
        return "compute"
    return "fused" if all(_fuses(n) for n in group) else "other"


def estimate_group(group: list[fx.Node], profile: DeviceProfile, tf32: bool | None = None,
                   timer: "OpTimer | None" = None, inlined: set[fx.Node] = frozenset(),
                   inlining: Inlining | None = None) -> KernelEstimate:
    """One kernel's estimate; ``inlined``: constants it computes itself (``inlined_constants``);
    ``inlining``: the graph's store-or-inline memo (``written``)."""
    kind = _kind(group)
    flops = sum(node_flops(n) for n in group)
    read, nwritten = _group_traffic(group, inlined, inlining)
    if timer is not None and timer.covers(kind):
        measured = timer.time_kernel(group)
        if measured is not None:
            return KernelEstimate([n.name for n in group], kind, flops, read, nwritten, measured, "measured")
    seconds, bound = roofline(flops, read + nwritten, profile, _dtype(group[-1]), kind == "compute", tf32)
    return KernelEstimate([n.name for n in group], kind, flops, read, nwritten, seconds + profile.launch_overhead,
                          bound)


def estimate_graph(gm: fx.GraphModule, profile: DeviceProfile | str | None = None, *, tf32: bool | None = None,
                   timer: "OpTimer | None" = None) -> GraphEstimate:
    """Estimated run time of ``gm`` compiled by Inductor: the sum over its kernels
    (``kernel_groups``) of roofline time plus a launch overhead. ``tf32``: fp32 matmuls on
    tensor cores (default: ``torch.get_float32_matmul_precision() != "highest"``).
    ``timer``: measure kernels instead (``OpTimer``)."""
    profile = profile_for(profile)
    inlined, inlining = inlined_constants(gm), Inlining()
    kernels = [estimate_group(g, profile, tf32, timer, inlined, inlining) for g in kernel_groups(gm)]
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
    for group in kernel_groups(gm):
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


# --- measured mode ---------------------------------------------------------------------------------


def _spec(value) -> Any:
    if isinstance(value, torch.Tensor):
        return ["T", [_hint(s) for s in value.shape], [_hint(s) for s in value.stride()], str(value.dtype)]
    if isinstance(value, (list, tuple)):
        return [_spec(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _spec(v) for k, v in sorted(value.items())}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _hint(value) if isinstance(value, torch.SymInt) else repr(value)
    return repr(value)


def _random_like(t: torch.Tensor, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Random values in ``t``'s shape, strides and dtype (integers are 0: always valid indices)."""
    shape = [_hint(s) for s in t.shape]
    stride = [_hint(s) for s in t.stride()]
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    if t.dtype.is_floating_point or t.dtype.is_complex:
        flat = torch.randn(extent, generator=generator).to(t.dtype)
    elif t.dtype == torch.bool:
        flat = torch.rand(extent, generator=generator) < 0.5
    else:
        flat = torch.zeros(extent, dtype=t.dtype)
    return flat.to(device).as_strided(shape, stride)


class OpTimer:
    """Measured kernel times on ``device``, cached in ``<cache dir>/measured_ops.json``.

    ``scope="extern"`` (default) measures compute-intensive and unfusible kernels (library
    calls, which Inductor runs as they run eagerly); ``"all"`` also fused kernels, run op
    by op (an upper bound: eager execution does not fuse). A kernel that fails to run on
    random inputs falls back to the roofline (listed in ``failed``). ``hits``/``misses`` count
    cache lookups."""

    def __init__(self, device: str | torch.device = "cpu", *, scope: str = "extern", repeats: int = 5,
                 directory: str | os.PathLike | None = None):
        if scope not in ("extern", "all"):
            raise ValueError(f"scope must be 'extern' or 'all', not {scope!r}")
        self.device = torch.device(device)
        self.scope, self.repeats = scope, repeats
        self.path = (pathlib.Path(directory) if directory is not None else cache_dir()) / "measured_ops.json"
        self.cache: dict[str, float] = _read_json(self.path)
        self.hits = self.misses = 0
        self.failed: list[str] = []  # kernels (first node) that would not run on random inputs
        self._dirty = False

    @functools.cached_property
    def device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return f"cpu: {_cpu_name()}, {torch.get_num_threads()} threads"

    def covers(self, kind: str) -> bool:
        return self.scope == "all" or kind != "fused"

    def key(self, group: list[fx.Node]) -> str:
        index = {n: i for i, n in enumerate(group)}

        def arg(a):
            if isinstance(a, fx.Node):
                return ["N", index[a]] if a in index else _spec(a.meta.get("val"))
            if isinstance(a, (list, tuple)):
                return [arg(x) for x in a]
            if isinstance(a, dict):
                return {str(k): arg(v) for k, v in sorted(a.items())}
            return _spec(a)

        ops = [[str(n.target), arg(n.args), arg(n.kwargs)] for n in group]
        text = json.dumps([ops, self.device_name, torch.__version__], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def time_kernel(self, group: list[fx.Node]) -> float | None:
        key = self.key(group)
        if key in self.cache:
            self.hits += 1
            return self.cache[key]
        self.misses += 1
        try:
            seconds = self._measure(group)
        except Exception:  # an op that random inputs do not satisfy: the roofline stands in
            self.failed.append(group[0].name)
            return None
        self.cache[key] = seconds
        self._dirty = True
        return seconds

    def _measure(self, group: list[fx.Node]) -> float:
        generator = torch.Generator().manual_seed(0)
        members = set(group)
        external: dict[fx.Node, Any] = {}

        def value(a, env):
            if isinstance(a, fx.Node):
                if a in env:
                    return env[a]
                if a not in external:
                    val = a.meta.get("val")
                    if isinstance(val, torch.Tensor):
                        external[a] = _random_like(val, self.device, generator)
                    elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                        external[a] = _hint(val) if isinstance(val, torch.SymInt) else val.node.hint
                    else:
                        external[a] = val
                return external[a]
            if isinstance(a, (list, tuple)):
                return type(a)(value(x, env) for x in a)
            if isinstance(a, dict):
                return {k: value(v, env) for k, v in a.items()}
            return a

        # Views and tuple items the group reads from its own nodes are taken inside the run.
        needed = [n for n in _closure(group) if n not in members]
        order = sorted(set(group) | set(needed), key=_graph_position(group[0].graph))

        def run():
            env: dict[fx.Node, Any] = {}
            for n in order:
                env[n] = n.target(*value(n.args, env), **value(n.kwargs, env))
            return env

        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        return _median_time(run, self.repeats, sync)

    def save(self) -> None:
        if self._dirty:
            on_disk = _read_json(self.path)
            on_disk.update(self.cache)
            _write_json(self.path, on_disk)
            self._dirty = False


def _closure(group: list[fx.Node]) -> list[fx.Node]:
    """Alias nodes (views, getitems) between the group's members and their readers in it."""
    members = set(group)
    found: list[fx.Node] = []
    for node in group:
        for a in node.all_input_nodes:
            chain = []
            cur = a
            while (_is_alias(cur) or oplib.is_getitem(cur)) and cur not in members:
                chain.append(cur)
                cur = cur.args[0]
            if cur in members:
                found.extend(c for c in chain if c not in found)
    return found


def _graph_position(graph: fx.Graph) -> Callable[[fx.Node], int]:
    position = {n: i for i, n in enumerate(graph.nodes)}
    return position.__getitem__


__all__ = [
    "DeviceProfile", "H100_SXM", "H100_PCIE", "H200", "A100_80GB", "A100_80GB_PCIE", "DEFAULT_CPU", "GPU_PROFILES",
    "TRANSCENDENTAL_FLOPS", "cache_dir", "calibrate_cpu", "cpu_profile", "gpu_profile", "profile_for",
    "dtype_class", "node_flops", "node_bytes_moved", "node_time", "roofline", "kernel_groups", "KernelEstimate",
    "GraphEstimate", "StepEstimate", "estimate_group", "estimate_graph", "estimate_step", "OpTimer",
]
