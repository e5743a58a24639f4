"""Side by side with PyTorch's own partitioner, on the same joint graphs.

``saved_bytes(make_model, partitioner)`` compiles one training step with the
given partitioner and returns the saved-activation bytes each graph's forward
hands to its backward, counted the same way for every partitioner: the
storages of the saved tensors, each once, less those owned by the step's
inputs (parameters, buffers, the batch), which saving does not allocate.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.fx as fx

from . import _compat
from .options import Options
from .sizes import storage_bytes


def forward_saved_bytes(fwd: fx.GraphModule, num_fwd_outputs: int) -> int:
    placeholders = {n.name for n in fwd.graph.find_nodes(op="placeholder")}
    out = next(iter(fwd.graph.find_nodes(op="output")))
    saved = [a for a in out.args[0][num_fwd_outputs:] if isinstance(a, fx.Node)]
    return storage_bytes(saved, placeholders)


class _Recording(_compat.CustomPartitionerFn):
    """Wraps a partition function and records each forward's saved bytes."""

    def __init__(self, fn: Callable, name: str):
        self.fn, self.name, self.saved = fn, name, []

    def __call__(self, gm, joint_inputs, **kwargs):
        fwd, bwd = self.fn(gm, joint_inputs, **kwargs)
        self.saved.append(forward_saved_bytes(fwd, kwargs["num_fwd_outputs"]))
        return fwd, bwd

    def uuid(self) -> Any:
        return None  # measuring: always partition, never hand back a cached graph


def _pytorch_default(gm, joint_inputs, **kwargs):
    return _compat.default_partition_fn()(gm, joint_inputs, **{"compiler": "inductor", **kwargs})


def partitioners() -> dict[str, Callable]:
    from .backend import FxrematPartitioner

    return {"pytorch": _pytorch_default, "fxremat": FxrematPartitioner(Options())}


def saved_bytes(make: Callable, partitioner: str, *, inductor: bool = False) -> int:
    """Saved-activation bytes of one training step of ``make()``'s model.

    ``inductor=False`` partitions the joint graph AOTAutograd builds with
    Inductor's decompositions and runs the graphs op by op (fast);
    ``inductor=True`` goes through TorchInductor itself (its joint-graph passes
    included), compiling C++ code.
    """
    torch.manual_seed(0)
    model, batch = make()
    recorder = _Recording(partitioners()[partitioner], partitioner)
    torch._dynamo.reset()
    if inductor:
        backend = lambda gm, inputs: _compat.compile_fx(  # noqa: E731
            gm, inputs, config_patches={"custom_partitioner_fn": recorder})
    else:
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        nop = lambda g, _: make_boxed_func(g.forward)  # noqa: E731
        backend = aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=recorder,
                               decompositions=_compat.inductor_decompositions())
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    compiled(*batch).backward()
    torch._dynamo.reset()
    return sum(recorder.saved)
