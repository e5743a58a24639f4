"""fxremat.measure on tiny eager examples with exact byte counts."""

import torch

from fxremat.measure import measure_peak_bytes, saved_activation_bytes, time_steps

MB = 1 << 20


def empty(nbytes):
    return torch.empty(nbytes, dtype=torch.uint8)


def test_peak_counts_live_allocations():
    def step():
        a = empty(4 * MB)
        b = empty(8 * MB)  # 12 MB live here
        del a
        return b  # held by the caller: still live at the end

    assert measure_peak_bytes(step) == {"peak_bytes": 12 * MB, "end_bytes": 8 * MB}


def test_peak_reused_address_counts_once_at_a_time():
    def step():
        for _ in range(5):
            x = empty(MB)  # often handed back at the same address
            del x

    assert measure_peak_bytes(step) == {"peak_bytes": MB, "end_bytes": 0}


def test_peak_ignores_frees_of_older_memory():
    older = [empty(16 * MB)]  # allocated before any profiling: its free is not reported

    def step():
        older.clear()
        return empty(2 * MB)

    assert measure_peak_bytes(step) == {"peak_bytes": 2 * MB, "end_bytes": 2 * MB}


def test_peak_ignores_frees_of_memory_from_an_earlier_profile():
    # Allocated while an earlier profile was recording: the allocator knows its size
    # and does report its free in the next window, which must not lower the total.
    kept = {}

    def first():
        kept["x"] = empty(3 * MB)

    def second():
        del kept["x"]
        return empty(MB)

    assert measure_peak_bytes(first) == {"peak_bytes": 3 * MB, "end_bytes": 3 * MB}
    assert measure_peak_bytes(second) == {"peak_bytes": MB, "end_bytes": MB}


def test_allocations_in_a_scope_not_counted_are_left_out_and_their_frees_ignored():
    # FSDP2's own allocations (all-gathered parameters) sit in its "FSDP::" profiler scopes;
    # a block allocated outside them and freed inside one still leaves the total.
    def step():
        with torch.profiler.record_function("FSDP::pre_forward (blocks.0)"):
            gathered = empty(4 * MB)
        a = empty(2 * MB)  # 6 MB live with the gathered block, 2 MB counted
        with torch.profiler.record_function("FSDP::post_backward_reduce (blocks.0)"):
            del a, gathered
            b = empty(MB)
        return empty(MB), b

    assert measure_peak_bytes(step, ("FSDP::",)) == {"peak_bytes": 2 * MB, "end_bytes": MB, "all_peak_bytes": 6 * MB}


def test_saved_bytes_excludes_inputs():
    x = torch.randn(100, 100, requires_grad=True)
    w = torch.randn(100, 100, requires_grad=True)
    # mm saves x and w; relu saves its output (100 * 100 float32); sum saves no tensor.
    forward = lambda: (x @ w).relu().sum()  # noqa: E731
    assert saved_activation_bytes(forward, exclude=[x, w]) == 40_000
    assert saved_activation_bytes(forward) == 120_000


def test_saved_bytes_counts_a_storage_once():
    x = torch.randn(100, 100, requires_grad=True)

    def forward():
        h = x.exp()  # exp saves its output h
        return h[:50].sin().sum()  # sin saves a view of h: same storage

    assert saved_activation_bytes(forward, exclude=[x]) == 40_000


def test_saved_bytes_excludes_views_of_parameters():
    torch.manual_seed(0)
    linear = torch.nn.Linear(10, 20)
    batch = torch.randn(4, 10)
    # addmm saves the batch and the transposed weight (a view of the parameter);
    # relu saves its 4 x 20 float32 output.
    forward = lambda: linear(batch).relu().sum()  # noqa: E731
    assert saved_activation_bytes(forward, exclude=[*linear.parameters(), batch]) == 320


def test_time_steps():
    calls = []
    times = time_steps(lambda: calls.append(1), warmup=2, steps=3)
    assert len(calls) == 5
    assert len(times) == 3 and all(t >= 0 for t in times)


def test_a_cuda_history_leaves_out_what_fsdp2_allocates_itself():
    """On CUDA the budget's measurement tells FSDP2's own allocations (its all-gathered
    parameters, its reduce-scatter buffers) apart by their stacks, as the profiler's scopes do
    on a CPU; sizes count as the caching allocator's 512-byte blocks, and a free of a block
    allocated before the history began lowers nothing."""
    from fxremat.measure import FSDP2_OWN_FILES, peaks_of_cuda_trace

    fsdp2 = [{"filename": "/x/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"}]
    graph = [{"filename": "/tmp/torchinductor_root/ab/cabc.py"}]
    trace = [{"action": "alloc", "addr": 1, "size": 4096, "frames": fsdp2},   # gathered parameters
             {"action": "alloc", "addr": 2, "size": 1000, "frames": graph},   # an activation: 1024
             {"action": "free_completed", "addr": 9, "size": 8192},            # an older block
             {"action": "alloc", "addr": 3, "size": 2048, "frames": graph},
             {"action": "free_completed", "addr": 1, "size": 4096},
             {"action": "alloc", "addr": 1, "size": 512, "frames": graph}]     # its address reused
    assert peaks_of_cuda_trace(trace, FSDP2_OWN_FILES) == {"peak_bytes": 3584, "all_peak_bytes": 7168}
    assert peaks_of_cuda_trace(trace) == {"peak_bytes": 7168, "all_peak_bytes": 7168}
