"""The strategies the benchmark frontier (``bench/frontier.py``) compares, and how one is built.

- :func:`strategy_list`: the run's strategies from its arguments (the sweeps of PyTorch's
  memory-budget partitioner, ``checkpoint_sequential`` and fxremat's budgets and solvers; the
  peers of ``--fx-match``; ``fxremat_min``; ``--strategies`` filtering);
- :func:`apply_strategy`: the checkpointing ones (``ckpt_blocks``, ``ckpt_seq_S``, ``sac_mm``)
  wrap a model's blocks in ``torch.utils.checkpoint``;
- :func:`build_strategy`: a model with its strategy applied, compiled as the strategy says
  (eager, ``torch.compile``, PyTorch's ``activation_memory_budget``, ``backend="fxremat"``),
  and its batch: what a measuring process (``bench/frontier_child.py``) and ``bench/ab.py`` run.

The strategies themselves are described in ``bench/frontier.py``'s docstring (its ``--help``).
Top-level imports are the standard library's: torch and fxremat are imported where used.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

ROCKMATE_NOT_RUN = (
    "Rockmate (Zhao et al., ICML 2023) is not run. (1) The PyPI release it depends on, rkgb 2.0.0, "
    "is an sdist without its core/, lowlevel/ and utils/ packages, so `import rkgb` fails; "
    "(2) rockmate hard-codes torch.device('cuda'), so it cannot run on a CPU; (3) its ILP is solved "
    "with PuLP/CBC, another dependency. The --rockmate hook errors with this text on CPU; on a GPU it "
    "tries `import rockmate` and records whatever fails."
)

# fxremat's options under every fxremat strategy, below the user's: every strategy's step keeps
# only the loss (a Hugging Face model's logits die after its loss graph).
FX_OPTIONS_DEFAULT = {"hold_outputs": False}

# The strategies a peer name of the sweeps stands for: pt_budget_<B>, ckpt_seq_<S>.
SWEEPS = (("pt_budget_", "pt_budget", "budget", float), ("ckpt_seq_", "ckpt_seq", "segments", int))


def sweep_strategy(name: str) -> dict | None:
    """The strategy of a sweep's point by its name (``pt_budget_0.5``, ``ckpt_seq_2``), its name
    written as the sweep writes it; None for any other name."""
    for prefix, kind, key, number in SWEEPS:
        value = _number(name[len(prefix):], number) if name.startswith(prefix) else None
        if value is not None:
            return {"name": f"{prefix}{value}", "kind": kind, key: value}
    return None


def strategy_list(args) -> list[dict]:
    pt_budgets, segments = list(args.pt_budgets), list(args.segments)
    peers = []
    for peer in args.fx_match:  # a peer named by --fx-match that its sweep lacks is added to it
        point = sweep_strategy(peer)
        if point is not None:
            sweep = pt_budgets if point["kind"] == "pt_budget" else segments
            value = point.get("budget", point.get("segments"))
            sweep += [value] if value not in sweep else []
            peer = point["name"]
        peers += [peer] if peer not in peers else []
    out = [{"name": "eager", "kind": "eager"}, {"name": "inductor", "kind": "inductor"}]
    out += [{"name": f"pt_budget_{b}", "kind": "pt_budget", "budget": b} for b in pt_budgets]
    out.append({"name": "ckpt_blocks", "kind": "ckpt_blocks"})
    out += [{"name": f"ckpt_seq_{s}", "kind": "ckpt_seq", "segments": s} for s in segments]
    out.append({"name": "sac_mm", "kind": "sac_mm"})
    for solver in args.solvers:
        prefix = "fxremat" if solver == "auto" else f"fxremat_{solver}"
        budgets = args.fx_budgets if solver == "auto" else args.solver_budgets
        out += [{"name": f"{prefix}_{b}", "kind": "fxremat", "budget": b, "solver": solver}
                for b in sorted(budgets, reverse=True)]
    names = [s["name"] for s in out]
    for peer in peers:
        if peer not in names or peer.startswith("fxremat"):
            raise ValueError(f"--fx-match {peer}: not a peer strategy of this run (one of "
                             f"{', '.join(n for n in names if not n.startswith('fxremat'))})")
        out.append({"name": f"fxremat_at_{peer}", "kind": "fxremat", "budget": None, "solver": "auto", "match": peer})
    if args.fx_min:
        out.append({"name": "fxremat_min", "kind": "fxremat", "budget": None, "solver": "auto", "least": True})
    if args.rockmate:
        out.append({"name": "rockmate", "kind": "rockmate"})
    if args.strategies:
        wanted = set(args.strategies)
        kept = [s for s in out if s["name"] in wanted or s["kind"] in wanted or strategy_family(s) in wanted]
        wanted |= {s["match"] for s in kept if s.get("match")}  # a matched strategy brings its peer
        out = [s for s in out if s in kept or s["name"] in wanted]
    return out


def _number(text: str, kind):
    try:
        return kind(text)
    except ValueError:
        return None


def strategy_family(row: dict) -> str:
    """A strategy's (or row's) family: its kind, or ``fxremat_<solver>`` for solvers other than auto."""
    if row["kind"] == "fxremat" and (row.get("solver") or "auto") != "auto":
        return f"fxremat_{row['solver']}"
    return row["kind"]


# =========================================================================================
# Checkpointing strategies: wrappers around a model's blocks
# =========================================================================================


def _ckpt_wrappers():
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    class Delegating(nn.Module):
        """A wrapper that still answers the wrapped block's attributes."""

        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(super().__getattr__("inner"), name)

    class CheckpointBlock(Delegating):
        def __init__(self, inner, context_fn=None):
            super().__init__()
            self.inner = inner
            self.context_fn = context_fn

        def forward(self, *args, **kwargs):
            if self.context_fn is None:
                return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
            return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self.context_fn, **kwargs)

    class CheckpointGroup(Delegating):
        """The first block of a segment: runs the whole segment under one checkpoint."""

        def __init__(self, inner, rest):
            super().__init__()
            self.inner = inner
            self.rest = nn.ModuleList(rest)

        def _run(self, h, *args, **kwargs):
            h = self.inner(h, *args, **kwargs)
            for block in self.rest:
                h = block(h, *args, **kwargs)
            return h

        def forward(self, h, *args, **kwargs):
            return checkpoint(self._run, h, *args, use_reentrant=False, **kwargs)

    class Passthrough(Delegating):
        """A block already run by its segment's CheckpointGroup."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, h, *args, **kwargs):
            return h

    class CheckpointSequential(nn.Module):
        def __init__(self, seq, segments):
            super().__init__()
            self.seq = seq
            self.segments = segments

        def forward(self, x):
            return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)

    return CheckpointBlock, CheckpointGroup, Passthrough, CheckpointSequential


def sac_policy_context():
    """Selective activation checkpointing: save matmul and convolution outputs, recompute the rest."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


class NotApplicable(Exception):
    pass


def apply_strategy(fm, strategy: dict):
    """Wrap ``fm.model``'s blocks for a checkpointing strategy (in place)."""
    CheckpointBlock, CheckpointGroup, Passthrough, CheckpointSequential = _ckpt_wrappers()
    kind = strategy["kind"]
    if kind in ("ckpt_blocks", "sac_mm"):
        context_fn = sac_policy_context() if kind == "sac_mm" else None
        for container in fm.block_lists:
            for i in range(len(container)):
                container[i] = CheckpointBlock(container[i], context_fn)
    elif kind == "ckpt_seq":
        segments = strategy["segments"]
        if fm.chain is None:
            raise NotApplicable("checkpoint_sequential needs a chain of blocks; this model's blocks are not one "
                                "(long skip connections)")
        owner, attr = fm.chain
        container = getattr(owner, attr)
        n = len(container)
        if segments > n:
            raise NotApplicable(f"{segments} segments > {n} blocks")
        if fm.sequential:
            setattr(owner, attr, CheckpointSequential(container, segments))
        else:  # torch's checkpoint_sequential segmentation, on blocks that take extra arguments
            size = n // segments
            for start in range(0, size * (segments - 1), size):
                blocks = [container[i] for i in range(start, start + size)]
                container[start] = CheckpointGroup(blocks[0], blocks[1:])
                for i in range(start + 1, start + size):
                    container[i] = Passthrough(blocks[i - start])


# =========================================================================================
# Building a strategy: the model, the compiled step, the batch
# =========================================================================================


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def fxremat_options(spec: dict, strategy: dict, budget) -> dict:
    """The options an fxremat strategy compiles with: the spec's ``fx_options``, its budget, and
    its solver: the strategy's where it names one, else the options' (``bench/ab.py
    --variant-options '{"solver": "rotor"}'`` names none), else "auto".

    >>> fxremat_options({"fx_options": {"solver": "rotor"}}, {"kind": "fxremat"}, 0.5)["solver"]
    'rotor'
    >>> fxremat_options({}, {"kind": "fxremat", "solver": "knapsack"}, 0.5)["solver"]
    'knapsack'
    """
    options = {"solver": "auto", **spec.get("fx_options", {}), "memory_budget": budget}
    if strategy.get("solver") is not None:
        options["solver"] = strategy["solver"]
    return options


def build_strategy(spec: dict, strategy: dict):
    """(model, compiled callable, batch, compile context, device) for one strategy."""
    import torch

    import frontier_models

    torch.manual_seed(spec.get("seed", 0))
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    fm = frontier_models.build(spec["model"], spec["scale"], spec.get("overrides"))
    apply_strategy(fm, strategy)
    model = fm.model.to(device=device, dtype=dtype).train()
    batch = tuple(b.to(device=device, dtype=dtype) if b.is_floating_point() else b.to(device) for b in fm.batch)
    kind = strategy["kind"]
    ctx: Any = contextlib.nullcontext
    if kind == "eager":
        fn = model
    elif kind == "fxremat":
        # bytes (a peer's measured peak, or the least feasible budget) or a fraction
        budget = (int(strategy["budget_bytes"]) if strategy.get("budget_bytes") is not None
                  else float(strategy["budget"]))
        fn = torch.compile(model, backend="fxremat", options=fxremat_options(spec, strategy, budget))
    elif kind == "rockmate":
        raise RuntimeError(rockmate_error(spec["device"]))
    else:
        fn = torch.compile(model)  # inductor, PyTorch's partitioner
        if kind == "pt_budget":
            from fxremat._compat import activation_memory_budget

            ctx = functools.partial(activation_memory_budget, float(strategy["budget"]))
    if spec.get("autocast"):
        fn = _autocast(fn, device, getattr(torch, spec["autocast"]))
    return model, fn, batch, ctx, device


def _autocast(fn, device, dtype):
    """``fn`` with its forward under ``torch.autocast`` (the backward follows the forward's dtypes)."""
    import torch

    def forward(*args):
        with torch.autocast(device.type, dtype=dtype):
            return fn(*args)

    return forward


def rockmate_error(device: str) -> str:
    if device != "cuda":
        return "rockmate on CPU: not supported (it hard-codes torch.device('cuda')). " + ROCKMATE_NOT_RUN
    try:
        import rockmate  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"import rockmate failed: {type(err).__name__}: {err}. " + ROCKMATE_NOT_RUN
    return "rockmate imports, but no runner is written for it yet. " + ROCKMATE_NOT_RUN


def skip_reason(strategy: dict, device: str) -> str | None:
    """Why a strategy is recorded as skipped rather than run: a solver ``fxremat.Options``
    rejects, or rockmate off a GPU; None to run it."""
    if strategy["kind"] == "fxremat" and strategy.get("solver", "auto") != "auto":
        from fxremat import OptionError, Options

        try:
            Options.from_user({"solver": strategy["solver"]})
        except OptionError as err:
            return f"OptionError: {err}"
    if strategy["kind"] == "rockmate" and device != "cuda":
        return rockmate_error(device)
    return None
