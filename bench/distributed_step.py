"""DDP and FSDP2 training steps compiled with fxremat, on ranks (issue #22): each rank's
gradients against single-process eager PyTorch, the plans of every rank, and each rank's
measured step peak beside the budget.

    python bench/distributed_step.py --device cuda --world 1 --out DIR            # NCCL, one rank on one GPU
    python bench/distributed_step.py --device cpu --world 2 --quick --out /tmp/x  # gloo, 2 ranks (smoke)

One job per (model, wrapper, budget), each its own process group (``--jobs`` at a time). The
wrappers are those of ``tests/test_distributed.py``: DDP then ``torch.compile`` with
DDPOptimizer's bucket splits and without, ``torch.compile`` then DDP, FSDP2 (``fully_shard`` on
each block and the model) with the model compiled or each block compiled. Budgets: fractions,
bytes, and ``least``: a 1-byte budget's ``BudgetError`` names the step's least feasible budget,
which a second job then runs.

Each rank runs ``--steps`` steps (the first compiles; a later one may plan again, as a step's
budget does) in float64. The peak of each step after the first is measured above what was
allocated before it: on CUDA the caching allocator's history (``fxremat.measure.cuda_peak_bytes``,
checked against ``torch.cuda.max_memory_allocated``, written as ``max_memory_allocated``), on a
CPU the profiler's memory events (``fxremat.measure.measure_peak_bytes``). What a budget counts
per rank (``docs/distributed.md``): not what FSDP2 allocates itself (the parameters it
all-gathers, the graph's inputs; its reduce-scatter buffers and sharded gradients) nor DDP's
buckets. On a CPU the profiler tells FSDP2's allocations apart by their scopes
(``measure.FSDP2_OWN``), on CUDA by the files of their stacks (``measure.FSDP2_OWN_FILES``):
``peaks`` leaves them out, ``all_peaks`` counts everything (``parameter_bytes`` is written
beside them). Writes ``DIR/distributed_step.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's fxremat and bench modules first

WRAPPERS = ("ddp_then_compile+split", "ddp_then_compile", "compile_then_ddp", "fsdp2_compile_model",
            "fsdp2_compile_blocks")
MODELS = {  # name: (builder, its kwargs at the CUDA size, at the quick size)
    "transformer": ("make_transformer", dict(batch=8, seq=256, dim=256, layers=4), dict(batch=4, seq=16, dim=64, layers=4)),
    "cnn": ("make_deep_cnn", dict(batch=32, size=64, depth=6, width=32), dict(batch=4, size=16, depth=4, width=8)),
}


def _build(model: str, quick: bool, rank: int):
    import torch

    from fxremat import models

    name, full, small = MODELS[model]
    torch.manual_seed(0)
    net, _ = getattr(models, name)(**(small if quick else full))
    torch.manual_seed(100 + rank)  # each rank its own batch, the same in every run
    _, batch = getattr(models, name)(**(small if quick else full))
    return net.double(), [b.double() if b.is_floating_point() else b for b in batch]


def _parameters(step):
    module = getattr(step, "_orig_mod", step)
    module = getattr(module, "module", module)
    return list(getattr(module, "_orig_mod", module).parameters())


def _rank(rank: int, world: int, port: int, folder: str, spec: dict) -> None:
    import torch
    import torch.distributed as dist

    import fxremat
    from fxremat.measure import FSDP2_OWN, FSDP2_OWN_FILES, cuda_peak_bytes, measure_peak_bytes
    from plan_records import least_budget

    device = spec["device"]
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["collective_timeout_s"]))
    row = {"rank": rank}
    try:
        # eager reference: the mean of every rank's loss, as both wrappers average gradients
        reference, _ = _build(spec["model"], spec["quick"], 0)
        reference = reference.to(device)
        loss = sum(reference(*[b.to(device) for b in _build(spec["model"], spec["quick"], r)[1]])
                   for r in range(world)) / world
        loss.backward()
        expected = [p.grad for p in reference.parameters()]
        model, batch = _build(spec["model"], spec["quick"], rank)
        model, batch = model.to(device), [b.to(device) for b in batch]
        row["parameter_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        wrapper = spec["wrapper"]
        torch._dynamo.config.optimize_ddp = wrapper.endswith("+split")
        options = {"memory_budget": spec["budget"], **spec["options"]}
        if wrapper.startswith("fsdp2"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device, (world,))
            for block in getattr(model, "blocks", []):
                fully_shard(block, mesh=mesh)
                if wrapper == "fsdp2_compile_blocks":
                    block.compile(backend="fxremat", options=options)
            fully_shard(model, mesh=mesh)
            step = model if wrapper == "fsdp2_compile_blocks" else torch.compile(model, backend="fxremat",
                                                                                 options=options)
        elif wrapper.startswith("ddp_then_compile"):
            step = torch.compile(torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1),
                                 backend="fxremat", options=options)
        else:
            step = torch.nn.parallel.DistributedDataParallel(
                torch.compile(model, backend="fxremat", options=options), bucket_cap_mb=1)

        def one_step():
            step(*batch).backward()

        row["peaks"], row["all_peaks"] = [], []
        for i in range(spec["steps"]):
            for p in _parameters(step):
                p.grad = None
            if device == "cuda" and i == 0:
                one_step()
                peak = every = None
            elif device == "cuda":  # FSDP2's own allocations told apart by their stacks
                measured = cuda_peak_bytes(one_step, FSDP2_OWN_FILES)
                peak, every = measured["peak_bytes"], measured["all_peak_bytes"]
                row.setdefault("max_memory_allocated", []).append(measured["max_memory_allocated_bytes"])
            elif i == 0:  # the profiler around Dynamo's first compile can crash
                one_step()
                peak = every = None
            else:
                measured = measure_peak_bytes(one_step, FSDP2_OWN)
                peak, every = measured["peak_bytes"], measured["all_peak_bytes"]
            if i:
                row["peaks"].append(peak)
                row["all_peaks"].append(every)
        grads = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in (p.grad for p in _parameters(step))]
        row["grad_max_rel_error"] = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()
                                        for a, b in zip(grads, expected))
    except Exception as error:  # a BudgetError, raised as such or wrapped by Dynamo's backend call
        text = str(error)
        at = text.find("fxremat: ")
        row["error"] = f"{type(error).__name__}: " + (text[at:] if at >= 0 else text).splitlines()[0][:600]
        least = least_budget(text)
        row["least_bytes"] = least.bytes if least else None
    plans = fxremat.inspect.plans()
    row["plans"] = [{"graph_id": p.graph_id, "solver": p.solver, "budget_bytes": p.budget_bytes,
                     "predicted_peak_bytes": p.predicted_peak_bytes,
                     "saved_activation_bytes": p.saved_activation_bytes,
                     "saved": [d["name"] for d in p.saved], "sequence": p.sequence,
                     "step": p.notes.get("step"), "replanned": p.notes.get("ranks")} for p in plans]
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(row, f)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(spec: dict, world: int, timeout_s: float) -> dict:
    """One process group of ``world`` ranks running ``spec``; each rank's row, or why none came back."""
    import torch.multiprocessing as mp

    folder = tempfile.mkdtemp(prefix="fxremat-ranks-")
    started = time.perf_counter()
    context = mp.start_processes(_rank, args=(world, _free_port(), folder, spec), nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout_s
    failed = None
    try:
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                failed = f"timed out after {timeout_s:.0f} s"
                break
    except Exception as error:  # a rank raised: its traceback, shortened
        failed = f"{type(error).__name__}: {str(error)[-1500:]}"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    ranks = []
    for r in range(world):
        path = os.path.join(folder, f"rank{r}.json")
        ranks.append(json.load(open(path)) if os.path.exists(path) else None)
    return {**spec, "world": world, "wall_s": round(time.perf_counter() - started, 1), "failed": failed,
            "ranks": ranks}


def summarize(job: dict) -> dict:
    """The job's figures in one line: plans equal across ranks, worst gradient error, last peak."""
    ranks = [r for r in job["ranks"] if r]
    keys = [[(p["solver"], p["saved"], p["sequence"], p["predicted_peak_bytes"], p["budget_bytes"])
             for p in r["plans"]] for r in ranks]
    budget = job["budget"]
    last = [r["peaks"][-1] for r in ranks if r.get("peaks")]  # FSDP2's own allocations left out
    last_all = [r["all_peaks"][-1] for r in ranks if r.get("all_peaks")]
    # each graph's last plan: its predicted peak with what the earlier graphs hold beside it
    last_plans = {p["graph_id"]: p for p in ranks[0]["plans"]}.values() if ranks else []
    step_predicted = max(((p["step"] or {}).get("held_by_earlier_graphs_bytes", 0) + p["predicted_peak_bytes"]
                          for p in last_plans), default=None)
    return {"model": job["model"], "wrapper": job["wrapper"], "budget": budget, "world": job["world"],
            "failed": job["failed"], "error": next((r.get("error") for r in ranks if r.get("error")), None),
            "plans_equal": len(keys) == job["world"] and all(k == keys[0] for k in keys),
            "graphs": len({p["graph_id"] for p in ranks[0]["plans"]}) if ranks else 0,
            "grad_max_rel_error": max((r.get("grad_max_rel_error", float("nan")) for r in ranks), default=None),
            "measured_peak_bytes": max(last) if last else None,
            "measured_all_peak_bytes": max(last_all) if last_all else None,
            "max_memory_allocated_bytes": max((r["max_memory_allocated"][-1] for r in ranks if r.get("max_memory_allocated")),
                                              default=None),
            "predicted_step_peak_bytes": step_predicted,
            "within_budget": (max(last) <= budget) if last and isinstance(budget, int) else None,
            "parameter_bytes": ranks[0].get("parameter_bytes") if ranks else None, "wall_s": job["wall_s"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--world", type=int, default=None, help="ranks per job (default: 1 on CUDA, 2 on a CPU)")
    parser.add_argument("--models", default="transformer,cnn")
    parser.add_argument("--wrappers", default=",".join(WRAPPERS))
    parser.add_argument("--budgets", default="1.0,0.5,least")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=400, help="seconds per job")
    parser.add_argument("--quick", action="store_true", help="the small sizes, compiler='eager' (a CPU smoke)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import results_io

    world = args.world or (1 if args.device == "cuda" else 2)
    os.makedirs(args.out, exist_ok=True)
    options = {"compiler": "eager"} if args.quick else {}
    base = dict(device=args.device, quick=args.quick, steps=args.steps, options=options,
                collective_timeout_s=min(args.timeout, 300))
    specs = [dict(base, model=m, wrapper=w, budget=b) for m in args.models.split(",") for w in args.wrappers.split(",")
             if not (m == "cnn" and w == "fsdp2_compile_blocks") for b in args.budgets.split(",")]
    data = {"command": results_io.command(argv, script="distributed_step.py"), "world": world, "jobs": []}
    path = os.path.join(args.out, "distributed_step.json")

    def named_least(job):
        return next((r.get("least_bytes") for r in job["ranks"] if r and r.get("least_bytes")), None)

    def run(spec):
        if spec["budget"] == "least":
            # The 1-byte probe's error names the step's least budget (one error since
            # 2026-11-28; a further one, if any, is recorded in least_search): run that.
            job = run_job(dict(spec, budget=1, steps=1), world, args.timeout)
            tried = [(1, named_least(job))]
            while named_least(job) is not None and len(tried) < 4:
                job = run_job(dict(spec, budget=named_least(job)), world, args.timeout)
                tried.append((job["budget"], named_least(job)))
            return dict(job, least_search=tried)  # (budget, the least its error named)
        elif "." in spec["budget"]:
            spec = dict(spec, budget=float(spec["budget"]))
        else:
            spec = dict(spec, budget=int(spec["budget"]))
        return run_job(spec, world, args.timeout)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for done in concurrent.futures.as_completed([pool.submit(run, spec) for spec in specs]):
            job = done.result()
            job["summary"] = summarize(job)
            data["jobs"].append(job)
            print(json.dumps(job["summary"]), flush=True)
            with open(path, "w") as f:
                json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
