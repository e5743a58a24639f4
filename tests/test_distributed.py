"""Training across processes (issue #22): 2 gloo ranks (CPU), float64.

- DDP compiled with fxremat in both orders, with DDPOptimizer's graph splitting and without;
- FSDP2 (``fully_shard`` on every block and on the model), compiled whole or block by block.

Each rank's gradients equal single-process eager PyTorch's on the two ranks' batches (both
wrappers average them), and both ranks make the same plans. Every run has a timeout and fails
clearly; nothing hangs."""

import contextlib
import faulthandler
import os
import signal
import socket
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from fxremat import models

TIMEOUT_S = 240  # a whole two-rank run (about 10-25 s alone on 2 cores)
STARTUP_TIMEOUT_S = 120  # spawning both ranks, before TIMEOUT_S counts
COLLECTIVE_TIMEOUT_S = 180  # one collective: the other rank may still be compiling
BATCH = dict(b=4, t=16, dim=64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    shape = (BATCH["b"], BATCH["t"], BATCH["dim"])
    return (torch.randn(*shape, generator=g, dtype=torch.float64),
            torch.randn(*shape, generator=g, dtype=torch.float64))


def _model(layers=4):
    torch.manual_seed(0)
    return models.make_transformer(dim=BATCH["dim"], layers=layers)[0].double()


def _worker(rank, world, port, folder, order, optimize_ddp, budget, cost_model="roofline", steps=1, layers=4):
    import fxremat
    from fxremat.measure import FSDP2_OWN, measure_peak_bytes

    if cost_model == "measured":
        # Each rank its own timing cache, and rank 1 a device a thousand times slower on every
        # library kernel: left alone, the ranks would cost plans apart.
        os.environ["FXREMAT_CACHE_DIR"] = os.path.join(folder, f"cache{rank}")
        if rank == 1:
            from fxremat.optimer import OpTimer

            OpTimer._measure = lambda self, group: 1e-1
    if order.endswith("+scratch") and rank == 1:
        # Rank 1's library calls measure 256 KiB of scratch memory each: its peaks, and so
        # its plans, would differ from rank 0's.
        from fxremat import workspace

        workspace._measure = lambda node, channels_last=False, strides=None: 256 * 1024
        order = order.removesuffix("+scratch")
    with _process_group(rank, world, port):
        torch._dynamo.config.optimize_ddp = optimize_ddp
        model = _model(layers)
        options = {"compiler": "eager", "memory_budget": budget, "cost_model": cost_model}
        # bucket_cap_mb=1: DDP's first bucket is 1 MB; several buckets split the graph (DDPOptimizer)
        if order.startswith("fsdp2"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
                if order == "fsdp2_compile_blocks":
                    block.compile(backend="fxremat", options=options)
            fully_shard(model, mesh=mesh)
            step = torch.compile(model, backend="fxremat", options=options) if order == "fsdp2_compile_model" else model
        elif order == "ddp_then_compile":
            step = torch.compile(torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1),
                                 backend="fxremat", options=options)
        else:
            model = torch.compile(model, backend="fxremat", options=options)
            step = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
        peaks, refused = [], None
        for i in range(steps):  # after the first, each step's peak measured (not a compiling one:
            for p in _parameters(step):  # the profiler around Dynamo's first compile can crash)
                p.grad = None
            batch = _batch(rank)  # the step's inputs, which the budget does not count
            try:
                if i == 0:
                    step(*batch).backward()
                else:
                    # what the budget counts: not FSDP2's own allocations (the all-gathered parameters)
                    peaks.append(measure_peak_bytes(lambda: step(*batch).backward(), FSDP2_OWN)["peak_bytes"])
            except fxremat.BudgetError as error:
                refused = {"least_bytes": error.least_bytes, "message": str(error), "step": i}
                break
        plans = [{"graph_id": p.graph_id, "solver": p.solver, "saved": [d["name"] for d in p.saved],
                  "recomputed": [d["name"] for d in p.recomputed], "sequence": p.sequence,
                  "predicted_peak_bytes": p.predicted_peak_bytes, "budget_bytes": p.budget_bytes,
                  "replanned": p.notes.get("ranks"), "step": p.notes.get("step")}
                 for p in fxremat.inspect.plans()]
        grads = [_full(p.grad).detach().clone() if p.grad is not None else None for p in _parameters(step)]
        torch.save({"plans": plans, "grads": grads, "peaks": peaks, "refused": refused},
                   os.path.join(folder, f"rank{rank}.pt"))


@contextlib.contextmanager
def _process_group(rank: int, world: int, port: int):
    """The default gloo group for the block. Collectives give up after ``COLLECTIVE_TIMEOUT_S``
    rather than wait forever. At a normal end the ranks meet in a barrier before they take it
    down: a rank that tears down (rank 0 also takes the store with it) while the other still
    talks to it can leave that one waiting. After an error, nothing is taken down: the rank
    exits and ``_spawn`` ends the others."""
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    yield
    dist.barrier()
    dist.destroy_process_group()


def _full(grad):
    """FSDP2's gradients are this rank's shards (DTensor): the whole gradient, gathered."""
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _parameters(step):
    module = getattr(step, "_orig_mod", step)
    module = getattr(module, "module", module)
    return list(getattr(module, "_orig_mod", module).parameters())


def _run(order, optimize_ddp, budget, cost_model="roofline", steps=1, layers=4):
    return _spawn(_worker, (order, optimize_ddp, budget, cost_model, steps, layers),
                  f"run ({order}, optimize_ddp={optimize_ddp})")


def _spawn(worker, args, what: str) -> list:
    """``worker(rank, 2, port, folder, *args)`` on 2 ranks, each saving ``folder/rank<r>.pt``:
    what they saved; a run past ``TIMEOUT_S`` is killed and fails the test with each rank's
    Python stacks at that moment (where it waits). No rank outlives the test: a rank left
    running would hold pytest's output open after the suite ends."""
    import time

    folder = tempfile.mkdtemp(prefix="fxremat-ranks-")
    context = mp.start_processes(_with_stacks, args=(2, _free_port(), folder, worker, *args), nprocs=2, join=False,
                                 daemon=True, start_method="spawn")
    # TIMEOUT_S counts from when both ranks run (each has opened its stacks file): starting a
    # rank imports torch, which on a loaded machine took more than the hang test's 8 s.
    started_by = time.monotonic() + STARTUP_TIMEOUT_S
    deadline = None
    try:
        while not context.join(timeout=1):
            now = time.monotonic()
            if deadline is None and all(os.path.exists(os.path.join(folder, f"rank{r}.stacks")) for r in range(2)):
                deadline = now + TIMEOUT_S
            if deadline is None and now > started_by:
                pytest.fail(f"{what}: the ranks did not start in {STARTUP_TIMEOUT_S} s")
            if deadline is not None and now > deadline:
                running = [p for p in context.processes if p.is_alive()]
                for process in running:
                    _signal(process.pid, signal.SIGUSR1)
                time.sleep(3)
                stacks = "\n".join(f"--- rank {r} ({'running' if context.processes[r] in running else 'ended'}) ---\n"
                                    + _read(os.path.join(folder, f"rank{r}.stacks")) for r in range(2))
                pytest.fail(f"{what} did not finish in {TIMEOUT_S} s; the ranks' stacks then:\n{stacks}")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    return [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(2)]


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it ended meanwhile
        pass


def _with_stacks(rank, world, port, folder, worker, *args):
    """``worker(rank, world, port, folder, *args)``, with every thread's Python stack written
    to ``folder/rank<r>.stacks`` on SIGUSR1 (``_spawn`` asks before it kills a late rank)."""
    stacks = open(os.path.join(folder, f"rank{rank}.stacks"), "w")  # noqa: SIM115 (open while the rank lives)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    worker(rank, world, port, folder, *args)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()[-6000:] or "(empty)"
    except OSError as error:
        return f"({error})"


def _eager_grads(layers=4):
    """Single-process eager gradients of the mean of the two ranks' losses (DDP averages)."""
    model = _model(layers)
    loss = sum(model(*_batch(rank)) for rank in range(2)) / 2
    loss.backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("order, optimize_ddp", [
    ("ddp_then_compile", True), ("ddp_then_compile", False), ("compile_then_ddp", False),
    ("fsdp2_compile_model", False), ("fsdp2_compile_blocks", False),
])
def test_two_ranks_give_eager_gradients_and_the_same_plans(order, optimize_ddp):
    ranks = _run(order, optimize_ddp, budget=0.9)
    assert ranks[0]["plans"] and ranks[0]["plans"] == ranks[1]["plans"]
    if order == "ddp_then_compile" and optimize_ddp:
        assert len(ranks[0]["plans"]) > 1  # DDPOptimizer split the graph at bucket boundaries
    expected = _eager_grads()
    for rank in ranks:
        worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()
                    for a, b in zip(rank["grads"], expected))
        assert worst <= 1e-12, worst


def test_ddp_buckets_share_the_step_budget():
    """DDPOptimizer splits the graph at bucket boundaries and compiles every bucket before the
    first runs, each planned within the whole byte budget. At a budget the unconstrained step
    goes over, their first call finds the later bucket over (what the earlier one holds beside
    it); it is planned again within what that leaves, and each rank's step measures within the
    budget, both ranks with the same plans and eager's gradients."""
    unconstrained = [p["predicted_peak_bytes"] for p in _run("ddp_then_compile", True, 100_000_000)[0]["plans"]]
    assert len(unconstrained) == 2  # two buckets, two graphs
    budget = unconstrained[1] + int(0.7 * unconstrained[0])
    ranks = _run("ddp_then_compile", True, budget, steps=4)
    assert ranks[0]["plans"] == ranks[1]["plans"]
    replanned = [p for p in ranks[0]["plans"] if p["step"]["held_by_earlier_graphs_bytes"] > 0]
    assert replanned and all(p["step"]["held_by_earlier_graphs_bytes"] + p["predicted_peak_bytes"] <= budget
                             for p in replanned)
    expected = _eager_grads()
    for rank in ranks:
        assert rank["peaks"][-1] <= budget, (rank["peaks"], budget)
        worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()
                    for a, b in zip(rank["grads"], expected))
        assert worst <= 1e-12, worst


def test_ddp_buckets_name_the_steps_least_budget_in_one_error():
    """DDPOptimizer compiles every bucket before the first runs. Under a budget no plan of
    the step meets (1 byte), the first call raises one BudgetError naming the step's least
    budget (each bucket at its least-memory plan with the buckets after it counted at its
    turn), before anything runs, the same on both ranks. Before, each bucket's refusal named
    the least as far as it could see: a 1-byte budget took four errors on two buckets. At that
    budget the buckets are planned together at their first call, each within what the earlier
    ones hold with the later ones' least at its turn, and not again: the step measures within
    the budget (from the third step: DDP builds its gradient buckets again in the second), with
    eager's gradients."""
    import collections

    refused = [rank["refused"] for rank in _run("ddp_then_compile", True, 1, layers=8)]
    assert refused[0] is not None and refused[0]["step"] == 0 and refused[0] == refused[1]
    least = refused[0]["least_bytes"]
    assert "graphs need at least" in refused[0]["message"] and f"at least {least} bytes" in refused[0]["message"]
    ranks = _run("ddp_then_compile", True, least, steps=3, layers=8)
    assert ranks[0]["plans"] == ranks[1]["plans"]
    planned = collections.Counter(p["graph_id"] for p in ranks[0]["plans"])
    assert len(planned) >= 3 and max(planned.values()) <= 2, planned  # at its compile, then with the others
    expected = _eager_grads(layers=8)
    for rank in ranks:
        assert rank["refused"] is None, rank["refused"]
        assert rank["peaks"][-1] <= least, (rank["peaks"], least)
        worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()
                    for a, b in zip(rank["grads"], expected))
        assert worst <= 1e-12, worst


def test_fsdp2_steps_meet_the_least_budget_their_errors_name():
    """FSDP2 with the model compiled: its graphs break at each block's FSDP2 hooks and one block
    graph runs for every block. A 1-byte budget's error names a least budget (two errors at
    most: the first graph's error knows only the graphs compiled before it has run); at the last
    one named, each rank's step measures within it, FSDP2's own allocations (the parameters it
    all-gathers, its reduce-scatter buffers: ``measure.FSDP2_OWN``) not counted, as
    docs/distributed.md defines the budget; both ranks alike, eager's gradients. A block's
    gradients, which FSDP2 reduce-scatters and frees after its backward, are not counted as
    kept by a later graph to the step's end (they were: a least 41% higher)."""
    budget, named = 1, []
    for _ in range(3):
        ranks = _run("fsdp2_compile_model", False, budget, steps=3)
        refused = [rank["refused"] for rank in ranks]
        if refused[0] is None:
            break
        assert refused[0] == refused[1] and refused[0]["least_bytes"] > budget, refused
        budget = refused[0]["least_bytes"]
        named.append(budget)
    assert 1 <= len(named) <= 2, named
    assert ranks[0]["plans"] == ranks[1]["plans"]
    block_bytes = sum(p.numel() * p.element_size() for p in _model().blocks[0].parameters())
    kept = max(p["step"]["kept_by_later_graphs_bytes"] for p in ranks[0]["plans"] if p["step"])
    assert kept < block_bytes, (kept, block_bytes)
    expected = _eager_grads()
    for rank in ranks:
        assert rank["refused"] is None, rank["refused"]
        assert 0 < rank["peaks"][-1] <= budget, (rank["peaks"], budget)
        worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()
                    for a, b in zip(rank["grads"], expected))
        assert worst <= 1e-12, worst


@pytest.mark.parametrize("order, cost_model", [("ddp_then_compile", "measured"),
                                               ("ddp_then_compile+scratch", "roofline")])
def test_ranks_that_measure_apart_get_rank_0s_plan(order, cost_model):
    """Ranks whose own measurements differ: with cost_model="measured", rank 1's kernels a
    thousand times slower; or rank 1's library calls measuring more scratch memory. Rank 1
    plans again with rank 0's figures (``fxremat.ranks``), so both compile the same graphs,
    and the gradients are eager's."""
    # 0.2: low enough that which values to recompute depends on the kernels' times (at 0.5
    # and above every rank's timings pick the same plan on this model)
    ranks = _run(order, False, budget=0.2, cost_model=cost_model)
    assert ranks[0]["plans"] and ranks[0]["plans"] == [dict(p, replanned=None) for p in ranks[1]["plans"]]
    assert all(p["replanned"] is None for p in ranks[0]["plans"])
    assert any(p["replanned"] for p in ranks[1]["plans"]), "the ranks' timings did not set their plans apart"
    expected = _eager_grads()
    for rank in ranks:
        worst = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()
                    for a, b in zip(rank["grads"], expected))
        assert worst <= 1e-12, worst


class _Gathered(torch.nn.Module):
    """Each block all-gathers its input along the batch (a functional collective in the
    forward; its gradient, a reduce-scatter, in the backward) and keeps this rank's rows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.GELU(), torch.nn.Linear(512, 32)) for _ in range(4))

    def forward(self, x):
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

        for block in self.blocks:
            rows = funcol.all_gather_tensor_autograd(x, gather_dim=0, group=dist.group.WORLD)
            x = x + block(rows).chunk(dist.get_world_size())[dist.get_rank()]
        return x.square().mean()


def _collective_worker(rank, world, port, folder):
    import copy

    import fxremat
    from fxremat import oplib

    with _process_group(rank, world, port):
        model = _Gathered().double()
        reference = copy.deepcopy(model)
        x = torch.randn(256, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        reference(x).backward()
        step = torch.compile(model, backend="fxremat", fullgraph=True,
                             options={"compiler": "eager", "memory_budget": 0.6})
        step(x).backward()
        (plan,) = fxremat.inspect.plans()
        collectives = [d["name"] for d in plan.recomputed
                       if any(str(d["op"]).startswith(ns + ".") for ns in oplib.COLLECTIVE_NAMESPACES)]
        worst = max(((p.grad - r.grad).abs().max() / r.grad.abs().max().clamp_min(1e-3)).item()
                    for p, r in zip(model.parameters(), reference.parameters()))
        torch.save({"solver": plan.solver, "recomputed": [d["name"] for d in plan.recomputed],
                    "saved": [d["name"] for d in plan.saved], "collectives": collectives, "worst": worst},
                   os.path.join(folder, f"rank{rank}.pt"))


def test_collectives_are_never_recomputed_nor_run_by_the_planner(capfd):
    """A model with functional collectives in its graph (an all-gather per block, a
    reduce-scatter in the backward) under a budget that recomputes: no collective is among
    the recomputed ops, the ranks agree, the gradients are eager's, and the planner issued no
    collective of its own (measuring a library call's scratch memory ran each all-gather on
    one rank: gloo reported 'unwaited collective calls' at exit)."""
    ranks = _spawn(_collective_worker, (), "the collectives run")
    assert ranks[0]["recomputed"], "the budget should make the plan recompute"
    assert ranks[0] == dict(ranks[1], worst=ranks[0]["worst"])
    for rank in ranks:
        assert rank["collectives"] == []
        assert rank["worst"] <= 1e-12, rank["worst"]
    assert "unwaited collective" not in capfd.readouterr().err


def _one_rank_hangs(rank, world, port, folder):
    import time

    if rank == 1:
        time.sleep(3600)
    torch.save({}, os.path.join(folder, f"rank{rank}.pt"))


def test_a_rank_that_hangs_fails_the_test_and_does_not_outlive_it(monkeypatch):
    """The harness itself: rank 0 ends, rank 1 never does. ``_spawn`` fails with rank 1's
    stack and kills it (on CI, a rank left running once held the finished suite open until
    the job's time limit)."""
    monkeypatch.setattr(__import__(__name__), "TIMEOUT_S", 8)
    started = set(mp.active_children())
    with pytest.raises(pytest.fail.Exception, match=r"(?s)did not finish in 8 s.*rank 1 \(running\).*in _one_rank_hangs"):
        _spawn(_one_rank_hangs, (), "a hanging rank")
    assert not [p for p in mp.active_children() if p not in started and p.is_alive()]


def _cache_worker(rank, world, port, folder):
    import fxremat
    from fxremat import ranks

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, f"inductor{rank}")  # each rank its own cache

    def step():
        torch._dynamo.reset()
        torch.manual_seed(0)
        model, batch = models.make_mlp(batch=8)
        torch.compile(model, backend="fxremat", options={"memory_budget": 0.5})(*batch).backward()

    if rank == 0:
        step()  # alone, before the process group: rank 0's caches now hold the graph's plan
    before = fxremat.inspect.plan_count()
    with _process_group(rank, world, port):
        step()
    torch.save({"planned": fxremat.inspect.plan_count() - before,
                "key": ranks.plan_key(fxremat.inspect.plans()[-1])}, os.path.join(folder, f"rank{rank}.pt"))


def test_a_rank_with_a_warm_cache_plans_with_the_others():
    """Rank 0 compiled the model before (its Inductor and AOTAutograd caches hold the graph),
    rank 1 did not. Both plan the graph under the process group (planning compares plans
    across ranks: a rank that took its plan from a cache would leave the other waiting in
    that comparison) and reach the same plan. A fraction's plan is otherwise cached."""
    ranks = _spawn(_cache_worker, (), "a warm and a cold cache")
    assert [r["planned"] for r in ranks] == [1, 1]
    assert ranks[0]["key"] == ranks[1]["key"]
