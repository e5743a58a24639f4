"""Device profiles: the peak rates the cost model (``costmodel.py``) divides by.

    profile = devices.profile_for("cpu")     # or "cuda", torch.device, a DeviceProfile
                                             # (also ``costmodel.profile_for``)

**Device profiles** (``DeviceProfile``): peak FLOP/s per dtype class for compute-intensive
ops (matmul, convolution, attention: tensor cores where the device has them), the fp32
elementwise rate for everything else, memory bandwidth, and a per-kernel launch overhead. GPUs
use dense (no-sparsity) vendor datasheet figures (``H100_SXM``, ``H100_PCIE``, ``H200``,
``A100_80GB``, ``A100_80GB_PCIE``, matched by device name through ``GPU_PROFILES``); the CPU
profile is measured on the machine (``calibrate_cpu``: matmuls, a large copy and one within
the core's own cache, a tiny op; about a second) and cached in ``$FXREMAT_CACHE_DIR`` or
``~/.cache/fxremat``, with a documented default (``DEFAULT_CPU``) when it is not calibrated.
The JSON cache helpers and ``_median_time`` here are shared with the measured mode
(``optimer.py``).
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Peak rates of one device.

    ``matmul_flops``: FLOP/s of compute-intensive ops by dtype class (``"fp64"``, ``"fp32"``,
    ``"tf32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``); a class the device lacks falls back to
    ``"fp32"``. ``vector_flops``: simple fp32 elementwise operations per second for everything
    else (CUDA cores, SIMD units): one per element per op, so half the FMA-counted FP32 peak
    (a fused multiply-add is 2 FLOPs in datasheets and matmul counts, one instruction here).
    ``bandwidth``: main-memory bytes/s. ``cache_bytes``/``cache_bandwidth``: the cache one
    thread streams from at its own rate (on a CPU the core's private cache, not a shared last
    level), used for kernels that touch less than it holds, when both are known.
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
# matmul, so 25e9 elementwise ops/s), 50 GB/s from its own (L2) cache of 2 MiB, 20 GB/s
# beyond it, 5 us per eager op / kernel call. One thread streams at the cache's rate only
# from the cache it does not share: on the project's Intel Xeon (2 MiB L2 a core, 300 MiB of
# L3 shared), an add over 256 KiB operands runs at 54-67 GB/s, over 2-16 MiB at 17-19 GB/s
# (Inductor's generated kernels 13-17 GB/s), like memory (bench/results/cpu/
# cpu_rates_20261129). A fixed size, not this machine's: the default plans are the same on
# every machine (AMD's Zen 4 cores have 1 MiB, Intel's server cores 1.25-2 MiB).
DEFAULT_CPU = DeviceProfile(
    "cpu (default, uncalibrated)", {"fp32": 50e9, "fp64": 25e9, "bf16": 25e9}, vector_flops=25e9,
    bandwidth=20e9, launch_overhead=5e-6, cache_bytes=2 * 2**20, cache_bandwidth=50e9,
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


def _private_cache_bytes() -> int | None:
    """Size of the largest cache Linux reports for the first core that no other core shares
    (its hardware threads may: ``shared_cpu_list`` no wider than ``thread_siblings_list``),
    or None."""
    cpu = pathlib.Path("/sys/devices/system/cpu/cpu0")
    try:
        siblings = (cpu / "topology" / "thread_siblings_list").read_text().strip()
    except OSError:
        siblings = "0"
    sizes = []
    for index in (cpu / "cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        if shared not in ("0", siblings):
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
# 3: the cache is the core's own (L2), not the shared last level.
CALIBRATION_VERSION = 3


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

    Measured: fp32/fp64/bf16 ``mm`` of 512x512 matrices (FLOP/s), a copy of 64 MiB (memory
    bandwidth: bytes read + written per second; beyond a core's share of any cache), a copy
    within the core's own cache (cache bandwidth: source and destination half of it;
    ``DEFAULT_CPU``'s 2 MiB where Linux does not say), and a 4-element add (per-op
    overhead); medians, after a
    short warm-up each. The elementwise rate is half the fp32 matmul rate: both run on the
    same SIMD FMA units, a matmul's FMA counting 2 FLOPs, a pointwise op's instruction one
    (checked against Inductor's C++ for a chain of adds and muls: within 10% on an AMD EPYC)."""
    path = pathlib.Path(directory) if directory is not None else cache_dir()
    path = path / "cpu_profile.json"
    key = _cpu_key()
    cached = _read_json(path)
    if not force and key in cached:
        return _profile_from_json(cached[key])
    private = _private_cache_bytes() or DEFAULT_CPU.cache_bytes
    matmul = {}
    for cls, dtype in (("fp32", torch.float32), ("fp64", torch.float64), ("bf16", torch.bfloat16)):
        a, b = torch.randn(512, 512, dtype=dtype), torch.randn(512, 512, dtype=dtype)
        matmul[cls] = 2 * 512**3 / _median_time(lambda: torch.mm(a, b), 15, warmup_s=0.1)
    big = 64 * 2**20
    src, dst = torch.ones(big // 4), torch.empty(big // 4)
    bandwidth = 2 * big / _median_time(lambda: dst.copy_(src), 7, warmup_s=0.03)
    small = private // 4
    src_c, dst_c = src[: small // 4].clone(), dst[: small // 4]
    cache_bandwidth = 2 * small / _median_time(lambda: dst_c.copy_(src_c), 21, warmup_s=0.02)
    tiny, tiny_out = torch.ones(4), torch.empty(4)
    launch = _median_time(lambda: torch.add(tiny, 1.0, out=tiny_out), 201, warmup_s=0.01)
    profile = DeviceProfile(
        f"cpu: {_cpu_name()}, {torch.get_num_threads()} threads", matmul, vector_flops=matmul["fp32"] / 2,
        bandwidth=bandwidth, launch_overhead=launch, cache_bytes=private, cache_bandwidth=cache_bandwidth,
        source=f"calibrated {time.strftime('%Y-%m-%d')} (fxremat.costmodel.calibrate_cpu), torch {torch.__version__}")
    cached[key] = profile.to_json()
    _write_json(path, cached)
    return profile


def _profile_from_json(data: dict) -> DeviceProfile:
    return DeviceProfile(**data)


def cpu_profile(calibrate: bool = False, *, directory: str | os.PathLike | None = None) -> DeviceProfile:
    """This CPU's calibrated profile if one is cached (or ``calibrate``: measure it now),
    else ``DEFAULT_CPU``."""
    if calibrate:
        return calibrate_cpu(directory=directory)
    path = (pathlib.Path(directory) if directory is not None else cache_dir()) / "cpu_profile.json"
    cached = _read_json(path).get(_cpu_key())
    if cached:
        return _profile_from_json(cached)
    return DEFAULT_CPU


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


__all__ = [
    "DeviceProfile", "H100_SXM", "H100_PCIE", "H200", "A100_80GB", "A100_80GB_PCIE", "DEFAULT_CPU", "GPU_PROFILES",
    "CALIBRATION_VERSION", "cache_dir", "calibrate_cpu", "cpu_profile", "gpu_profile", "profile_for", "dtype_class",
]
