"""The benchmark frontier: step time against measured peak memory, per model and strategy.

    python bench/frontier.py                      # every model, every strategy, CPU, small sizes
    python bench/frontier.py --quick              # CI smoke: 2 tiny models, few strategies
    python bench/frontier.py --device cuda --scale gpu
    python bench/frontier.py --summarize bench/results/cpu/frontier/frontier.json   # tables/plots again
    python bench/frontier.py --models gpt2 --fx-match ckpt_blocks,pt_budget_0.1   # fxremat at peers' peaks

For each model (``bench/frontier_models.py``) and strategy, ONE fresh subprocess builds the
model (seed 0), applies the strategy, runs two warm-up steps (each timed: compile time), then
measures one training step (forward + backward, gradients set to ``None`` before it) exactly
as ``fxremat/harness.py`` does: on CPU the peak of bytes allocated above what was live when the
step began, from the PyTorch profiler's allocation events (``fxremat.measure``), and the rise
of the peak RSS over a second such step with glibc's ``MALLOC_MMAP_THRESHOLD_`` pinned; on
CUDA ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` less what was
allocated before the step. Then it sets glibc's thresholds to where they settle in an
unpinned process (``fxremat.harness.release_malloc_pin``: under the pinned 64 KiB threshold
every tensor is freshly mapped and faulted in each step, +20-40% step time) and times
``--steps`` warm steps (median). Inputs
(parameters, buffers, the batch) are not part of the peak: the budget definition of the README.

The measuring processes then stay alive (idle), and once all of a model's strategies are
measured they are timed in ``--rounds`` interleaved rounds (shuffled order each round, one
process at a time, ``--steps`` steps per visit), so that a change of machine load hits all
strategies alike; that median (``step_ms_interleaved``) is the step time of the tables and
plots when present, else the single-process median (``step_ms_isolated``).

``--autocast bfloat16`` runs every strategy's forward under ``torch.autocast`` (parameters stay
``--dtype``), as mixed-precision training does.

Strategies (all compiled ones with TorchInductor):

- ``eager``; ``inductor``: ``torch.compile`` default (PyTorch's min-cut partitioner);
- ``pt_budget_B``: PyTorch's ``activation_memory_budget = B`` (its knapsack partitioner);
- ``ckpt_blocks``: ``torch.utils.checkpoint`` (``use_reentrant=False``) around every block;
- ``ckpt_seq_S``: ``torch.utils.checkpoint.checkpoint_sequential`` with S segments (for an
  ``nn.Sequential`` chain of blocks: torch's function itself; for the Hugging Face models,
  whose blocks take extra arguments, the same segmentation — the first S-1 segments of
  ``n // S`` blocks checkpointed, the rest not — by wrapping block groups); not applicable to
  a U-Net (not a chain);
- ``sac_mm``: selective activation checkpointing per block
  (``create_selective_checkpoint_contexts``): MUST_SAVE the outputs of ``mm``, ``addmm``,
  ``bmm`` and ``convolution``, PREFER_RECOMPUTE everything else;
- ``fxremat_B``: ``backend="fxremat", options={"memory_budget": B}`` (solver "auto"), B a
  fraction (0 the least-memory plan, 1 the unconstrained one); ``fxremat_<solver>_B`` for
  other solvers that ``fxremat.Options`` accepts (``--solvers``; one it rejects is recorded as
  skipped with its message). A fraction applies to each compiled graph on its own: a graph
  with nothing to trade (Hugging Face GPT-2 computes its loss in a second, small graph)
  keeps its unconstrained plan;
- ``fxremat_at_P`` (``--fx-match P,...``, default ``ckpt_blocks``): fxremat (solver "auto") at
  a byte budget equal to peer P's measured peak for the same model (``peak_bytes``: above the
  inputs, what fxremat's budget bounds: the step's, all its graphs together), i.e. at the
  memory of P. It runs once P is measured; if P did not run or failed it is recorded as
  skipped with the reason. A P of the form ``pt_budget_B`` / ``ckpt_seq_S`` missing from its
  sweep is added to it, and ``--strategies`` keeps the peer of every matched strategy it keeps;
- ``fxremat_min`` (``--fx-min``, default on): fxremat (solver "auto") at its least feasible byte
  budget: a first process runs at 1 byte and fails with a ``BudgetError`` naming the least
  feasible budget (``Allowed: a budget of at least N bytes``) of the graph it could not plan; a
  fresh process runs at N (and again at a larger N while a later graph asks for more). The
  failed tries are in the row's ``budget_probes``;
- ``rockmate`` (``--rockmate``): not run, see ROCKMATE_NOT_RUN; on CPU it errors.

Compile time = wall time of the two warm-up steps minus two warm steps' median. Solve time =
the partitioner's own time, as Dynamo times it (``dynamo_timed``: PyTorch's
``min_cut_rematerialization_partition``, or ``FxrematPartitioner`` — all of fxremat's
``partition``: classification, min-cut / Rotor, graph extraction and the predicted timeline;
``fxremat.Plan`` itself records no timing), summed over the compiled graphs.

Byte-budget rows record the budget used (``budget_bytes``; the matched peer in ``match``); a
fraction's bytes per graph are in ``fx_plans``.

Writes ``frontier.csv``, ``frontier.json`` (metadata: machine, torch, date, threads, load
average; every row with its error when it failed), ``summary.md`` and ``<model>.png`` (needs
matplotlib; without it the plots are skipped with a note) into ``--out``
(default ``bench/results/<device>/frontier/``). The summary (``summary.md``; the same numbers in
the JSON's ``summary``, each entry tagged with its ``table``): fxremat against its peers at 50%
and 25% of ``torch.compile`` default's measured peak, and at budget 1.0 (``targets``); per model
at the memory of per-block checkpointing (``at_ckpt_blocks``): ``ckpt_blocks``' measured peak
and step time, ``fxremat_at_ckpt_blocks``' and their ratios, the fastest ``pt_budget`` run
within ``ckpt_blocks``' peak, and ``fxremat_min``'s peak against ``ckpt_blocks``'; and every
``fxremat_at_P`` beside P (``matched``).

Code: this file is the command line (arguments, presets, the run's metadata); the strategies
and how each is built are in ``bench/frontier_strategies.py``, the measuring process in
``bench/frontier_child.py``, running a model's strategies and the timing rounds in
``bench/frontier_run.py``, the CSV, JSON, summary and plots in ``bench/frontier_report.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:  # the frontier's modules, when this file is loaded from elsewhere (the tests)
    sys.path.insert(0, HERE)

import results_io  # noqa: E402
from frontier_child import import_from_this_tree  # noqa: E402
from frontier_report import write_outputs  # noqa: E402
from frontier_run import run_model  # noqa: E402
from frontier_strategies import FX_OPTIONS_DEFAULT, ROCKMATE_NOT_RUN, strategy_list  # noqa: E402

# Also answered here, as before the split (tests/test_frontier_smoke.py loads this file):
from frontier_child import least_budget_bytes  # noqa: E402,F401
from frontier_report import summarize, summary_markdown  # noqa: E402,F401

QUICK = dict(models=["mlp", "gpt2"], scale="tiny", pt_budgets=[0.5], fx_budgets=[1.0, 0.5], solver_budgets=[],
             segments=[2], fx_match=["ckpt_blocks"], fx_min=True, steps=3, rounds=2)
# The default run is sized for a shared 2-core CPU, where compiling dominates (0.5-2 min per
# strategy and model): one point per peer sweep, fxremat's solvers other than "auto" at one
# budget, and resnet101 (ResNet-101-like) left to --models (it compiles about twice as long
# as resnet50). Widen with --pt-budgets, --segments, --fx-budgets, --solver-budgets.
FULL = dict(models=["gpt2", "bert", "llama", "resnet50", "unet", "vit", "mlp"], scale="small",
            pt_budgets=[0.5], fx_budgets=[1.0, 0.5, 0.25], solver_budgets=[0.5], segments=[2], fx_match=["ckpt_blocks"],
            fx_min=True, steps=3, rounds=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI smoke run: tiny sizes, few models/strategies/steps")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--autocast", default=None, choices=["bfloat16", "float16"],
                        help="run every step's forward under torch.autocast with this dtype (parameters stay --dtype)")
    parser.add_argument("--scale", choices=["tiny", "small", "gpu"], default=None,
                        help="model sizes (default: small; --quick: tiny; gpu: the published architectures)")
    parser.add_argument("--models", default=None, help="comma list (default: all; --quick: mlp,gpt2)")
    parser.add_argument("--strategies", default=None,
                        help="comma list of strategy names or kinds (eager, inductor, pt_budget, ckpt_blocks, "
                             "ckpt_seq, sac_mm, fxremat, rockmate; names such as fxremat_1.0, fxremat_at_ckpt_blocks, "
                             "fxremat_min); kind fxremat takes every fxremat strategy; a matched strategy brings "
                             "its peer; default all")
    parser.add_argument("--pt-budgets", default=None, help="PyTorch activation_memory_budget values")
    parser.add_argument("--fx-budgets", default=None, help="fxremat memory_budget fractions")
    parser.add_argument("--fx-match", default=None, metavar="PEERS",
                        help="comma list of peer strategies (ckpt_blocks, pt_budget_B, ...): for each, fxremat_at_PEER "
                             "runs fxremat (solver auto) at a byte budget equal to that peer's measured peak "
                             "(default: ckpt_blocks; 'none': no matched runs)")
    parser.add_argument("--fx-min", action=argparse.BooleanOptionalAction, default=None,
                        help="fxremat_min: fxremat (solver auto) at its least feasible byte budget (default: on; "
                             "--no-fx-min: off)")
    parser.add_argument("--fx-options", default="{}", type=json.loads, metavar="JSON",
                        help="fxremat options for every fxremat strategy, e.g. '{\"cost_model\": \"measured\"}' "
                             "(recorded in the JSON's meta), over the default hold_outputs false: every strategy's step "
                             "keeps only the loss (a Hugging Face model's logits die after its loss graph)")
    parser.add_argument("--sizes", default="{}", type=json.loads, metavar="JSON",
                        help="size overrides per model over the scale's, e.g. '{\"gpt2\": {\"layers\": 12}}' "
                             "(each row records its sizes)")
    parser.add_argument("--solvers", default="auto,checkmate,twremat",
                        help="fxremat solvers; those fxremat.Options rejects are recorded as skipped")
    parser.add_argument("--solver-budgets", default=None,
                        help="budgets for the solvers other than auto (default: 0.5; --quick: none)")
    parser.add_argument("--segments", default=None, help="checkpoint_sequential segment counts")
    parser.add_argument("--rockmate", action="store_true", help="add the rockmate strategy (errors on CPU)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every child (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per measurement / per visit")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds per model (0: none)")
    parser.add_argument("--cache", choices=["shared", "fresh"], default="shared",
                        help="Inductor cache: one fresh directory for the whole run (shared) or per measurement")
    parser.add_argument("--jobs", type=int, default=1,
                        help="measurement processes at a time (default 1; more shortens compiling on a many-core "
                             "machine, and the isolated step times then share the CPU; the interleaved rounds "
                             "always run one process at a time; on a GPU keep 1, the processes would share it)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per child process answer")
    parser.add_argument("--out", default=None, help="output folder (default bench/results/<device>/frontier)")
    parser.add_argument("--summarize", default=None, metavar="JSON",
                        help="only rebuild summary.md and the plots from a frontier.json")
    args = parser.parse_args(argv)
    args.fx_options = {**FX_OPTIONS_DEFAULT, **args.fx_options}

    if args.summarize:
        with open(args.summarize) as f:
            data = json.load(f)
        write_outputs(data, os.path.dirname(os.path.abspath(args.summarize)))
        return

    preset = QUICK if args.quick else FULL
    args.scale = args.scale or preset["scale"]
    args.models = args.models.split(",") if args.models else list(preset["models"])
    args.pt_budgets = [float(b) for b in args.pt_budgets.split(",")] if args.pt_budgets else preset["pt_budgets"]
    args.fx_budgets = [float(b) for b in args.fx_budgets.split(",")] if args.fx_budgets else preset["fx_budgets"]
    args.fx_match = (preset["fx_match"] if args.fx_match is None else
                     [] if args.fx_match.strip().lower() in ("", "none") else args.fx_match.split(","))
    args.fx_min = preset["fx_min"] if args.fx_min is None else args.fx_min
    args.segments = [int(s) for s in args.segments.split(",")] if args.segments else preset["segments"]
    args.solvers = args.solvers.split(",")
    args.solver_budgets = ([float(b) for b in args.solver_budgets.split(",")] if args.solver_budgets
                           else preset["solver_budgets"])
    args.strategies = args.strategies.split(",") if args.strategies else None
    args.steps = args.steps or preset["steps"]
    args.rounds = preset["rounds"] if args.rounds is None else args.rounds
    out_dir = args.out or os.path.join(ROOT, "bench", "results", args.device,
                                       "frontier-quick" if args.quick else "frontier")
    os.makedirs(out_dir, exist_ok=True)

    import torch

    import fxremat

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    started = time.time()
    meta = {
        **results_io.metadata(argv),  # what every results file records; the keys below are the frontier's
        "command": results_io.command(argv, script="frontier.py"),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": args.device, "dtype": args.dtype, "autocast": args.autocast, "scale": args.scale,
        "threads": args.threads,
        "fx_options": args.fx_options,
        "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "cache": args.cache, "jobs": args.jobs,
        "loadavg_start": list(os.getloadavg()), "machine": results_io.machine(),
        "rockmate": ROCKMATE_NOT_RUN,
        "method": {
            "peak": "CPU: profiler allocation events over one forward+backward step, grads set to None before it, "
                    "bytes above what was live at its start (fxremat.measure.measure_peak_bytes); CUDA: "
                    "max_memory_allocated after reset_peak_memory_stats less memory_allocated before. "
                    "Fresh process per measurement, MALLOC_MMAP_THRESHOLD_=65536 for the memory step, "
                    "glibc's settled thresholds (mmap 32 MiB, trim 64 MiB) for timing.",
            "rss": "rise of VmHWM (reset through /proc/self/clear_refs) over a second step, CPU only",
            "step_ms": "median of warm steps: step_ms_interleaved (the measuring processes of a model's strategies "
                       "kept alive and visited in shuffled rounds, one at a time) when present, else "
                       "step_ms_isolated (the measuring process, right after its memory measurement)",
            "compile_s": "wall time of the warm-up steps minus as many warm steps (median)",
            "solve_s": "the partitioner's time per Dynamo's dynamo_timed (min_cut_rematerialization_partition "
                       "or FxrematPartitioner), summed over compiled graphs; fxremat.Plan records no timing",
        },
    }
    try:
        strategies = strategy_list(args)
    except ValueError as err:
        parser.error(str(err))
    data = {"meta": meta, "rows": []}
    shared_cache = tempfile.mkdtemp(prefix="frontier-inductor-cache-")
    print(f"frontier: {len(args.models)} models x {len(strategies)} strategies, scale {args.scale}, "
          f"{args.device}, {args.threads} thread(s) -> {out_dir}", flush=True)
    try:
        for model_name in args.models:
            rows = run_model(model_name, strategies, args, shared_cache)
            data["rows"] += rows
            meta["loadavg_end"] = list(os.getloadavg())
            meta["wall_s"] = round(time.time() - started, 1)
            write_outputs(data, out_dir, plots=False)
    finally:
        shutil.rmtree(shared_cache, ignore_errors=True)
    meta["loadavg_end"] = list(os.getloadavg())
    meta["wall_s"] = round(time.time() - started, 1)
    write_outputs(data, out_dir)
    print(f"done in {meta['wall_s']:.0f} s -> {out_dir}", flush=True)
    del fxremat


if __name__ == "__main__":
    import_from_this_tree()
    main()
