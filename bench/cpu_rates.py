"""What one CPU thread moves per second, by data size, in ATen's ops and in Inductor's kernels.

    python bench/cpu_rates.py [--out FILE]

The figures behind the CPU profiles' cache and memory rates (``fxremat.devices.DEFAULT_CPU``,
``calibrate_cpu``) and behind the cost model's reduction passes
(``costmodel.PASS_REDUCTION_ELEMENTS``). One thread. Two tables:

1. By size: an eager ``add`` and ``copy_`` over 64 KiB to 256 MiB operands (bytes read and
   written per second; medians of 30 calls).
2. Inductor's generated C++ kernels on activations of the frontier ResNet-50's shapes
   (channels 8 to 128, contiguous and channels-last): a pointwise kernel (two reads, one write),
   a per-channel reduction (``(x * g).sum((0, 2, 3))``), and a batch norm's backward (two
   per-channel reductions, then the input gradient from their results: a second pass over x and
   g). Each kernel's own time from Inductor's kernel profile (``cpp.enable_kernel_profile``,
   nothing of the Python call), the mean of 20 calls; beside it the bytes the cost model counts
   (the backward: x and g in each of its two passes, the gradient written) and the rate they
   imply.

Not a test; numbers vary with the machine's load: compare sizes within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import results_io  # noqa: E402


def _median_s(fn, repeats=30):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def by_size() -> list[dict]:
    import torch
    rows = []
    for kib in (64, 256, 1024, 2048, 4096, 16384, 65536, 262144):
        n = kib * 1024 // 4
        a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
        add = _median_s(lambda: torch.add(a, b, out=c))
        copy = _median_s(lambda: c.copy_(a))
        rows.append({"operand_kib": kib, "add_gb_s": 3 * kib * 1024 / add / 1e9,
                     "copy_gb_s": 2 * kib * 1024 / copy / 1e9})
    return rows


def _batch_norm_backward(x, g, mean, invstd, w):
    xh = (x - mean[None, :, None, None]) * invstd[None, :, None, None]
    sg, sgx = g.sum((0, 2, 3)), (g * xh).sum((0, 2, 3))
    n = x.numel() / x.shape[1]
    return (g - sg[None, :, None, None] / n - xh * sgx[None, :, None, None] / n) * (invstd * w)[None, :, None, None]


def _kernel_us(fn, *args) -> float:
    """Mean time of Inductor's generated kernels in one call of ``fn`` (µs)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn(*args)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            fn(*args)
    total = sum(e.cpu_time_total for e in prof.events() if e.name.startswith("graph_"))
    return total / 20


def inductor_kernels() -> list[dict]:
    import torch
    kernels = {
        "pointwise": (lambda x, g: torch.relu(x) * g + 1.0, 3),
        "reduction": (lambda x, g: (x * g).sum((0, 2, 3)), 2),
        "batch norm backward": (_batch_norm_backward, 5),
    }
    rows = []
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True, "fx_graph_cache": False}):
        for channels, batch, side in ((8, 8, 32), (32, 8, 32), (32, 8, 16), (128, 8, 8), (64, 8, 32)):
            for channels_last in (True, False):
                fmt = torch.channels_last if channels_last else torch.contiguous_format
                x = torch.randn(batch, channels, side, side).to(memory_format=fmt)
                g = torch.randn_like(x)
                extra = (torch.randn(channels), torch.rand(channels) + 0.5, torch.randn(channels))
                nbytes = x.numel() * 4
                for name, (fn, tensors_moved) in kernels.items():
                    torch._dynamo.reset()
                    args = (x, g, *extra) if name == "batch norm backward" else (x, g)
                    us = _kernel_us(torch.compile(fn), *args)
                    rows.append({"kernel": name, "channels": channels, "batch": batch, "side": side,
                                 "channels_last": channels_last, "tensor_bytes": nbytes, "kernel_us": us,
                                 "bytes_counted": tensors_moved * nbytes,
                                 "gb_s": tensors_moved * nbytes / us / 1e3})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    result = {**results_io.metadata(argv), "threads": 1, "load_avg": os.getloadavg(),
              "by_size": by_size(), "inductor_kernels": inductor_kernels()}
    print("| operand | add GB/s | copy GB/s |\n|---:|---:|---:|")
    for r in result["by_size"]:
        print(f"| {r['operand_kib']} KiB | {r['add_gb_s']:.1f} | {r['copy_gb_s']:.1f} |")
    print("\n| kernel | shape (N, C, H=W) | layout | tensor | kernel µs | bytes counted | GB/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in result["inductor_kernels"]:
        print(f"| {r['kernel']} | ({r['batch']}, {r['channels']}, {r['side']}) | "
              f"{'channels-last' if r['channels_last'] else 'contiguous'} | {r['tensor_bytes'] / 2**20:.2f} MiB | "
              f"{r['kernel_us']:.1f} | {r['bytes_counted'] / 2**20:.2f} MiB | {r['gb_s']:.1f} |")
    if args.out:
        results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
