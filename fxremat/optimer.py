"""Measured mode of the cost model (``costmodel.py``): ``OpTimer``.

    timer = costmodel.OpTimer("cuda")                    # or optimer.OpTimer
    est = costmodel.estimate_graph(gm, profile, timer=timer)

Times kernels on the device with random inputs of the nodes' shapes, strides and dtypes
(median of a few runs), cached on disk by (ops, shapes, strides, dtypes, arguments, device
name, torch version) so re-runs are free. Its default scope times only the library kernels
(what Inductor calls as extern kernels, ``OpTimer.covers``: eager timing is the real cost) and
keeps the roofline for the kernels Inductor generates, which eager execution would not fuse;
``scope="all"`` times those too (op by op: an upper bound). The kernels themselves come from
``costmodel.kernel_groups``; this module does not import ``costmodel`` (``costmodel`` imports it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
from typing import Any, Callable

import torch
import torch.fx as fx

from . import _compat, oplib
from ._compat import real_tensors
from .aliasing import is_alias
from .devices import _cpu_name, _median_time, _read_json, _write_json, cache_dir
from .sizes import _hint


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
                 directory: str | os.PathLike | None = None, preset: dict[str, float] | None = None):
        if scope not in ("extern", "all"):
            raise ValueError(f"scope must be 'extern' or 'all', not {scope!r}")
        self.device = torch.device(device)
        self.scope, self.repeats = scope, repeats
        self.path = (pathlib.Path(directory) if directory is not None else cache_dir()) / "measured_ops.json"
        # preset: another rank's times (``ranks``): answered from, nothing measured or saved.
        self.frozen = preset is not None
        self.cache: dict[str, float] = dict(preset) if self.frozen else _read_json(self.path)
        self.used: dict[str, float] = {}  # the times this timer answered with
        self.hits = self.misses = 0
        self.failed: list[str] = []  # kernels (first node) that would not run on random inputs
        self._dirty = False

    @functools.cached_property
    def device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return f"cpu: {_cpu_name()}, {torch.get_num_threads()} threads"

    def covers(self, kind: str, group: list[fx.Node] = ()) -> bool:
        """Is a kernel of this kind (``costmodel._kind``) timed? Every one with ``scope="all"``;
        else the library calls: compute-intensive ones (convolutions, matmuls, attention), and
        of the other unfusible ops those Inductor calls in ATen (``_compat.inductor_calls_aten``).
        An op Inductor generates code for (a max-pool's prims, an index, a scatter, a copy) runs
        in its own loops, not ATen's: timed eagerly, the U-Net's max-pools took 100-280x their
        roofline (prims run op by op), and ``cost_model="measured"`` planned around them."""
        if self.scope == "all" or kind == "compute":
            return True
        return kind != "fused" and all(_compat.inductor_calls_aten(n.target) for n in group
                                       if n.op == "call_function" and not oplib.is_getitem(n))

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
        if any(oplib.is_collective(n) for n in group):
            return None  # run alone, a collective waits for the other ranks: the roofline stands in
        key = self.key(group)
        if key in self.cache:
            self.hits += 1
            self.used[key] = self.cache[key]
            return self.cache[key]
        self.misses += 1
        if self.frozen:  # not among the times given: the roofline stands in
            return None
        try:
            with real_tensors():  # the partitioner runs under torch.compile's fake mode
                seconds = self._measure(group)
        except Exception:  # an op that random inputs do not satisfy: the roofline stands in
            self.failed.append(group[0].name)
            return None
        self.cache[key] = self.used[key] = seconds
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
        if self._dirty and not self.frozen:
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
            while (is_alias(cur) or oplib.is_getitem(cur)) and cur not in members:
                chain.append(cur)
                cur = cur.args[0]
            if cur in members:
                found.extend(c for c in chain if c not in found)
    return found


def _graph_position(graph: fx.Graph) -> Callable[[fx.Node], int]:
    position = {n: i for i, n in enumerate(graph.nodes)}
    return position.__getitem__


__all__ = ["OpTimer"]
