"""The ``fxremat`` torch.compile backend: TorchInductor with fxremat's partitioner.

Registered under the entry-point group ``torch_dynamo_backends``, so
``torch.compile(model, backend="fxremat", options={...})`` works with no import.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import warnings
from typing import Any

import torch.fx as fx

from . import _compat, dynamic, inspect, joint_record, ranks, step
from .options import Options
from .partition import partition
from .candidate import log
from .plans import BudgetWarning, Planned, fxremat_error, joint_keeper, planning_only_active
from .sizes import symbolic_dims


@functools.cache
def _source_hash() -> str:
    """Hash of fxremat's own code: a new version must not reuse old cached plans."""
    root = pathlib.Path(__file__).resolve().parent
    files = sorted(root.rglob("*.py"))  # fxremat/, its strategies/ and, installed, passes/
    if not (root / "passes").is_dir():  # source checkout: passes/ lives beside fxremat/
        files += sorted((root.parent / "passes").glob("*.py"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


class FxrematPartitioner(_compat.CustomPartitionerFn):
    """Inductor's partition step, replaced by fxremat's planner."""

    def __init__(self, options: Options, cacheable: bool = True, planning_only: bool = False):
        self.options = options
        self.cacheable = cacheable and not planning_only
        self.planning_only = planning_only  # stop once planned (``plans.planning_only``)

    def __call__(self, gm: fx.GraphModule, joint_inputs, **kwargs: Any):
        keep = joint_keeper()
        if keep is not None:
            keep(_replanner(gm, joint_inputs, kwargs))
        saved = joint_record.save_if_asked(gm, joint_inputs, kwargs)  # (a developer's switch: $FXREMAT_SAVE_JOINTS)
        try:
            fwd, bwd, plan = partition(gm, joint_inputs, options=self.options, **kwargs)
        finally:
            if saved is not None:
                joint_record.record_workspaces(saved)
        if self.planning_only:
            raise Planned(plan)
        folder = inspect.record(plan, self.options.debug_dir)
        if folder is not None:
            _report(plan, folder, self.options.debug_dir)
        return fwd, bwd

    def uuid(self) -> Any:
        # With debug_dir every graph must be partitioned (and write its files), so the
        # compile caches are skipped, as for a dynamic graph under a budget (its plan adds
        # guards to the shape environment: ``fxremat.dynamic``); otherwise the key covers
        # code and every option.
        if self.options.debug_dir is not None or not self.cacheable:
            return None
        return hashlib.sha256((_source_hash() + self.options.cache_key()).encode()).hexdigest()


def _replanner(joint: fx.GraphModule, joint_inputs, kwargs: dict):
    """``replan(options) -> Plan``: the joint graph planned again under ``options``, in the
    contexts of this partition (``_compat.partition_context``), without tracing it again.
    Planning a joint graph twice plans the same: its clean-up (``joint.prepare``) removes dead
    code in place, which a second time finds none, and plans a copy."""
    entered = _compat.partition_context()

    def replan(options: Options):
        with entered():
            return partition(joint, joint_inputs, options=options, **kwargs)[2]

    return replan


def _report(plan, folder: str, debug_dir: str) -> None:
    """Write the graph's report beside its plan files and say where (``fxremat explain``
    writes it again, with a step measured since)."""
    from .report import ExplainError, write_report

    try:
        path = write_report(folder)
    except ExplainError as error:  # matplotlib missing: the plan files are there, the report is not
        log.warning("graph %s: plan files in %s; no report: %s", plan.graph_id, folder, error)
        return
    log.info("graph %s: report in %s (`fxremat explain %s` writes it again with a measured step, and an index)",
             plan.graph_id, path, debug_dir)


def fxremat_backend(gm: fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """``torch.compile`` backend. ``options`` are fxremat's (see the README).

    A ``BudgetError`` or ``OptionError`` reaches the caller as itself (Dynamo would wrap an
    exception the backend raises in ``BackendCompilerFailed``): the compiled function raises
    it when called, and Dynamo keeps that function for these sizes, so calls that meet the
    same refusal get it at once instead of compiling again."""
    try:
        return step.compiled_for_step(gm, example_inputs, Options.from_user(options, mode=mode), _compile)
    except Exception as error:  # noqa: BLE001 - fxremat's own errors become a refusing function
        refusal = fxremat_error(error)
        if refusal is None:
            raise
        dynamic.pin_sizes(example_inputs)  # a dynamic graph refuses at these sizes only
        return _refusing(refusal)


def _refusing(error: BaseException):
    def refused(*args, **kwargs):
        raise error.with_traceback(None)  # a fresh traceback at each call

    return refused


def _compile(gm: fx.GraphModule, example_inputs, opts: Options):
    inspect.compiled()
    # A byte budget's plan depends on what the step's other graphs hold when it is made
    # (fxremat.step), a dynamic graph's adds guards (fxremat.dynamic): neither is cached.
    # With several ranks every rank must plan every graph: planning compares the plan across
    # ranks (fxremat.ranks), so a rank whose local cache hits while another's misses would
    # leave that one waiting in the comparison forever.
    budget = opts.memory_budget
    partitioner = FxrematPartitioner(opts, cacheable=ranks.world_size() == 1 and (
        budget is None or (budget.fraction is not None and not symbolic_dims(example_inputs))),
        planning_only=planning_only_active())
    if opts.compiler == "eager":
        return _eager_compile(gm, example_inputs, partitioner)
    # Inductor's wrapper keeps a dead buffer alive until a later buffer of the same size
    # can take it over ("allow_buffer_reuse") whenever its own peak estimate allows the
    # hold; that estimate is not the plan's (HF Llama, least-memory plan: 10.6% over the
    # prediction). Reuse saves a fresh allocation, on CPU an mmap whose pages fault in
    # each step (0.5 s a step on issue #4's transformer), so it stays on, with fxremat's
    # predicted timeline as the estimate (_compat.install_planned_reuse_bound). On a
    # torch whose Inductor decides reuse otherwise it is off: every buffer is freed after
    # its last use, as the plan assumes.
    planned_reuse = _compat.planned_reuse_supported()
    patches: dict[str, Any] = {"allow_buffer_reuse": planned_reuse}
    # The order fxremat emits is the plan's schedule, the one its timeline predicts.
    # Inductor's peak-memory reordering picks another topological order when its own
    # estimate says so; that estimate is not the plan's (tiny transformer at per-block
    # checkpointing's memory: it took a depth-first order, weight gradients last, and the
    # step measured 22% over the prediction).
    keep_order = _compat.inductor_keeps_node_order()
    patches.update(keep_order)
    if opts.mode != "default":
        patches.update(_compat.inductor_mode_options(opts.mode))
    patches.update(dict(opts.inductor))
    if any(patches.get(key) for key in keep_order) and opts.memory_budget is not None:
        warnings.warn(BudgetWarning(
            f"inductor={dict(opts.inductor)}: Inductor then reorders the plan's nodes by its own peak estimate, "
            "so the measured peak can exceed the plan's prediction and the memory budget; leave it unset to "
            "keep fxremat's order"), stacklevel=2)
    if patches["allow_buffer_reuse"] and not planned_reuse and opts.memory_budget is not None:
        warnings.warn(BudgetWarning(
            "inductor={'allow_buffer_reuse': True}: this torch's Inductor decides buffer reuse with its own "
            "peak estimate, so dead buffers it holds for reuse can put the measured peak above the plan's "
            "prediction and the memory budget; leave it unset to keep fxremat's default (False here)"),
            stacklevel=2)
    if planned_reuse:
        _compat.install_planned_reuse_bound()
    patches["custom_partitioner_fn"] = partitioner
    if opts.debug_dir is not None:
        # Every graph is planned and compiled afresh: Inductor's FX graph cache keys on
        # the graph's code, not on the segment marks its fusion guard reads.
        patches["fx_graph_cache"] = False
    _compat.install_segment_fusion_guard()
    if partitioner.uuid() is None:
        # Inductor puts a partitioner's uuid None into its cache key instead of bypassing
        # the AOTAutograd cache (torch 2.13): a hit would skip planning (a byte budget's step
        # accounting, a dynamic graph's guards, debug_dir's files).
        with _compat.autograd_cache_disabled():
            return _compat.compile_fx(gm, example_inputs, config_patches=patches)
    return _compat.compile_fx(gm, example_inputs, config_patches=patches)


def _eager_compile(gm, example_inputs, partitioner):
    """AOTAutograd with fxremat's partitioner and no code generation: the partitioned
    graphs run op by op. Fast to compile; used by partition-level tests.

    The graphs take their inputs boxed (a list they clear), so each input is freed after
    its last use, as in Inductor's code and the predicted timeline. Called with unboxed
    arguments, a backward held every saved activation to its end: an 8-block MLP measured
    27% over its prediction, 55% at budget 0.5; boxed, within 16 bytes."""
    from torch._dynamo.backends.common import aot_autograd

    run_boxed = _compat.boxed_eager_compiler()
    backend = aot_autograd(
        fw_compiler=run_boxed, bw_compiler=run_boxed, partition_fn=partitioner,
        decompositions=_compat.inductor_decompositions(),
    )
    return backend(gm, example_inputs)
