"""A joint graph saved where it was planned and planned again elsewhere: a GPU's graph on a CPU.

    FXREMAT_SAVE_JOINTS=DIR python train.py          # each joint graph fxremat plans -> DIR/<plan.graph_id>.json
    fwd, bwd, plan = joint_record.replan("DIR/263a4c43b378.json", {"memory_budget": 0.5})   # anywhere, no GPU

What a plan depends on is the joint graph (its ops, their arguments and each node's ``val``,
module stack and recompute tag), the partitioner's keyword arguments, the device's profile (by
its name), the library calls' measured scratch, and two answers of that torch: whether the
compile's dead code elimination drops unread random ops and whether its backward frees
incoming gradients. ``replan`` plans under all of them; ``load`` gives the graph alone. A
plan made on a GPU is a plan of the graph *that* torch, Inductor and model code traced there,
which a CPU cannot trace again (a GPU session found GPT-2's Rotor chain with 5 stages where a
reproduction traced on the CPU had 38; Hugging Face Qwen2's had 5 on an H200 with torch 2.11,
21 in the reproduction). ``save`` writes that graph as JSON: every node's op, target (its
qualified name), arguments and the metadata fxremat reads; ``load`` rebuilds it with fake
tensors on the same devices (a fake CUDA device needs no GPU). Static shapes only: a graph with
symbolic sizes is refused.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
from typing import Any

import torch
import torch.fx as fx
from torch.fx.node import _get_qualified_name

ENV = "FXREMAT_SAVE_JOINTS"
_META_KEYS = ("nn_module_stack", "fwd_nn_module_stack", "recompute", "partitioner_tag", "ac_graph_id")


def save_if_asked(joint: fx.GraphModule, joint_inputs, kwargs: dict) -> str | None:
    """``save`` into ``$FXREMAT_SAVE_JOINTS`` when it is set; the file's path, else None."""
    directory = os.environ.get(ENV)
    if not directory:
        return None
    from .joint import prepare
    from .plans import graph_fingerprint

    # As the planners read it (named as its plan: ``Plan.graph_id``), with dead code removed
    # under this compile's rules: planned again outside a compile, unread random ops would stay.
    joint = prepare(joint)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{graph_fingerprint(joint)}.json")
    save(joint, joint_inputs, kwargs, path)
    return path


def save(joint: fx.GraphModule, joint_inputs, kwargs: dict, path: str) -> None:
    """Write ``joint`` (its nodes, arguments and the metadata planning reads), the shapes of
    ``joint_inputs`` and the partitioner's JSON-able keyword arguments to ``path``.

    Raises ``ValueError`` for a graph with symbolic sizes."""
    nodes = []
    for n in joint.graph.nodes:
        record = {"name": n.name, "op": n.op, "target": _target(n), "args": _encode(n.args),
                  "kwargs": _encode(n.kwargs), "val": _value_spec(n.meta.get("val"))}
        for key in _META_KEYS:
            if key in n.meta:
                record.setdefault("meta", {})[key] = _encode_meta(n.meta[key])
        nodes.append(record)
    plain = {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool, list, tuple, type(None)))}
    from . import _compat

    from torch.utils._pytree import tree_leaves

    devices = {str(t.device) for t in tree_leaves(joint_inputs) if isinstance(t, torch.Tensor)}
    data = {"torch": torch.__version__, "nodes": nodes, "inputs": [_value_spec(t) for t in joint_inputs],
            "kwargs": json.loads(json.dumps(plain)),
            # what else a plan depends on that another machine or torch would answer differently
            "context": {"device_name": (torch.cuda.get_device_name() if any(d.startswith("cuda") for d in devices)
                                        and torch.cuda.is_available() else None),
                        "dead_code_elimination_keeps_random": _compat.dead_code_elimination_keeps_random(),
                        "backward_frees_incoming_gradients": _compat.backward_frees_incoming_gradients()},
            "workspaces": {}}
    with open(path, "w") as f:
        json.dump(data, f)


def record_workspaces(path: str) -> None:
    """Add the library calls' scratch this process measured (``workspace.measured``) to the
    file ``save`` wrote: planning measures it on the device, which another machine cannot."""
    from . import workspace

    with open(path) as f:
        data = json.load(f)
    data["workspaces"] = workspace.measured()
    with open(path, "w") as f:
        json.dump(data, f)


def replan(path: str, options: Any) -> tuple[fx.GraphModule, fx.GraphModule, Any]:
    """Plan the saved joint graph again under ``options`` (``fxremat.options.Options`` or a
    user's dict) as it was planned where it was saved: the device's name (its profile), the
    library calls' measured scratch, that compile's dead code rule and whether that torch's
    backward frees its incoming gradients. ``(forward, backward, plan)``, as ``partition``;
    raises its ``BudgetError``."""
    from unittest import mock

    from . import _compat, workspace
    from .options import Options
    from .partition import partition

    joint, inputs, kwargs = load(path)
    with open(path) as f:
        data = json.load(f)
    context = data.get("context", {})
    if not isinstance(options, Options):
        options = Options.from_user(options)
    workspace.adopt(data.get("workspaces", {}))
    frees_incoming = context.get("backward_frees_incoming_gradients", _compat.backward_frees_incoming_gradients())
    patches = [mock.patch.object(_compat, "backward_frees_incoming_gradients", lambda: frees_incoming)]
    if not context.get("dead_code_elimination_keeps_random", True):
        # torch's own dead code elimination drops unread random ops only inside a compile's
        # tracing context (``_compat.dead_code_elimination_keeps_random``): enter one
        from torch.utils._pytree import tree_leaves

        fake_mode = next(t.fake_mode for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))
        patches.append(torch._guards.tracing(torch._guards.TracingContext(fake_mode)))
    if context.get("device_name"):
        name = context["device_name"]
        patches.append(mock.patch.object(torch.cuda, "get_device_name", lambda *a, **k: name))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        return partition(joint, inputs, options=options, num_fwd_outputs=kwargs["num_fwd_outputs"],
                         static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"))


def load(path: str) -> tuple[fx.GraphModule, list, dict]:
    """The joint graph ``save`` wrote, with fake values on their devices, fake inputs like the
    joint inputs, and the partitioner's keyword arguments: ``(joint, inputs, kwargs)``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with open(path) as f:
        data = json.load(f)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    with mode:
        for record in data["nodes"]:
            args = _decode(record["args"], env)
            kwargs = _decode(record["kwargs"], env)
            if record["op"] == "placeholder":
                node = graph.placeholder(record["name"])
            elif record["op"] == "output":
                node = graph.output(args[0])
            elif record["op"] == "call_function":
                node = graph.call_function(_resolve(record["target"]), tuple(args), kwargs)
            else:
                raise ValueError(f"{path}: a {record['op']} node ({record['name']}) cannot be loaded")
            node.name = record["name"]
            env[record["name"]] = node
            if record["val"] is not None:
                node.meta["val"] = _make_value(record["val"])
            for key, value in record.get("meta", {}).items():
                node.meta[key] = _decode_meta(key, value)
        inputs = [_make_value(spec) for spec in data["inputs"]]
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph), inputs, data["kwargs"]


def _target(node: fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    return _get_qualified_name(node.target)


def _resolve(name: str) -> Any:
    if name.startswith("torch.ops."):
        value: Any = torch.ops
        for part in name.split(".")[2:]:
            value = getattr(value, part)
        return value
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _encode(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": {k: _encode(v) for k, v in value.items()}}
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise ValueError(f"a symbolic size ({value}) in the joint graph: only static graphs are saved")
    raise ValueError(f"cannot save an argument of type {type(value).__name__}: {value!r}")


def _decode(value: Any, env: dict[str, fx.Node]) -> Any:
    if not isinstance(value, dict):
        return value
    (kind, inner), = value.items()
    if kind == "node":
        return env[inner]
    if kind in ("list", "tuple"):
        items = [_decode(v, env) for v in inner]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _decode(v, env) for k, v in inner.items()}
    if kind == "float":
        return float(inner) if inner not in ("inf", "-inf", "nan") else {"inf": math.inf, "-inf": -math.inf,
                                                                        "nan": math.nan}[inner]
    if kind == "device":
        return torch.device(inner)
    return getattr(torch, inner)  # dtype, layout, memory_format


def _value_spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())):
            raise ValueError("a tensor of symbolic size in the joint graph: only static graphs are saved")
        return {"shape": list(value.shape), "stride": list(value.stride()), "offset": int(value.storage_offset()),
                "storage": int(value.untyped_storage().nbytes()), "dtype": str(value.dtype).removeprefix("torch."),
                "device": str(value.device)}
    if isinstance(value, (list, tuple)):
        return {"items": [_value_spec(v) for v in value]}
    if isinstance(value, (int, float, bool)) or value is None:
        return {"scalar": value}
    raise ValueError(f"cannot save a value of type {type(value).__name__}")


def _make_value(spec: Any) -> Any:
    if spec is None:
        return None
    if "items" in spec:
        return tuple(_make_value(s) for s in spec["items"])
    if "scalar" in spec:
        return spec["scalar"]
    dtype = getattr(torch, spec["dtype"])
    itemsize = torch.empty((), dtype=dtype).element_size()
    base = torch.empty(max(1, -(-spec["storage"] // itemsize)), dtype=dtype, device=spec["device"])
    tensor = base.as_strided(spec["shape"], spec["stride"], spec["offset"])
    if spec["offset"] == 0 and spec["storage"] == base.untyped_storage().nbytes() and tensor.is_contiguous() and \
            tensor.numel() * itemsize == spec["storage"]:
        tensor = base.view(spec["shape"])  # a tensor of its own, not a view
    return tensor


def _encode_meta(value: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    if isinstance(value, CheckpointPolicy):
        return {"policy": value.name}
    try:
        return json.loads(json.dumps(value, default=repr))
    except (TypeError, ValueError):
        return repr(value)


def _decode_meta(key: str, value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"policy"}:
        from torch.utils.checkpoint import CheckpointPolicy

        return CheckpointPolicy[value["policy"]]
    if key in ("nn_module_stack", "fwd_nn_module_stack") and isinstance(value, dict):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


__all__ = ["ENV", "load", "record_workspaces", "replan", "save", "save_if_asked"]
