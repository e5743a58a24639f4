"""The runtime cost model: FLOPs, bytes, fusion groups, profiles, measured-mode cache."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat import costmodel, devices

aten = torch.ops.aten
# Round numbers, so expected times are easy to read; the calibrated profile is tested apart.
PROFILE = costmodel.DeviceProfile("test", {"fp32": 1e11, "tf32": 1e12}, vector_flops=1e10, bandwidth=1e10,
                                  launch_overhead=1e-6)


def _trace(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


def test_flops_of_mm_bmm_addmm_conv_match_hand_computation():
    m, k, n, b = 6, 7, 5, 3
    gm = _trace(lambda x, y: x @ y, torch.randn(m, k), torch.randn(k, n))
    assert costmodel.node_flops(_node(gm, aten.mm.default)) == 2 * m * k * n
    gm = _trace(torch.bmm, torch.randn(b, m, k), torch.randn(b, k, n))
    assert costmodel.node_flops(_node(gm, aten.bmm.default)) == 2 * b * m * k * n
    gm = _trace(torch.addmm, torch.randn(n), torch.randn(m, k), torch.randn(k, n))
    assert costmodel.node_flops(_node(gm, aten.addmm.default)) == 2 * m * k * n
    batch, cin, cout, h, w, kh, kw = 2, 3, 4, 9, 9, 3, 3
    gm = _trace(lambda x, wt: F.conv2d(x, wt, stride=1, padding=1), torch.randn(batch, cin, h, w),
                torch.randn(cout, cin, kh, kw))
    conv = _node(gm, aten.convolution.default)
    assert costmodel.node_flops(conv) == 2 * batch * cout * h * w * cin * kh * kw
    # a compute-intensive op is its own kernel, timed at the matmul peak
    assert costmodel.node_time(conv, PROFILE) >= costmodel.node_flops(conv) / 1e11 + PROFILE.launch_overhead


def test_cpu_attention_is_priced_by_its_matmuls():
    # torch's flop counter has no formula for the CPU's fused attention: priced at one FLOP
    # an output element, an attention looked free to recompute (issue #26's decoder).
    b, h, t, d = 2, 4, 32, 16
    q, k, v = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))

    def fwd_bwd(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(out.sum(), (q, k, v))

    gm = make_fx(fwd_bwd, tracing_mode="fake")(q, k, v)
    forward = _node(gm, aten._scaled_dot_product_flash_attention_for_cpu.default)
    backward = _node(gm, aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    assert costmodel.node_flops(forward) == 4 * b * h * t * t * d  # QK^T and PV, causal mask not counted
    assert costmodel.node_flops(backward) > costmodel.node_flops(forward)


def test_pointwise_flops_weigh_transcendentals():
    gm = _trace(lambda x: (x + 1).exp(), torch.randn(10, 10))
    assert costmodel.node_flops(_node(gm, aten.add.Tensor)) == 100
    assert costmodel.node_flops(_node(gm, aten.exp.default)) == 100 * costmodel.TRANSCENDENTAL_FLOPS
    gm = _trace(lambda x: x.sum(dim=1), torch.randn(10, 20))
    assert costmodel.node_flops(_node(gm, aten.sum.dim_IntList)) == 200  # one per input element


def test_pointwise_chain_is_one_kernel_moving_its_bytes_once():
    x = torch.randn(256, 256)
    nbytes = x.numel() * 4
    gm = _trace(lambda x: x.sin().cos().exp(), x)
    groups = costmodel.kernel_groups(gm)
    assert [[n.target for n in g] for g in groups] == [[aten.sin.default, aten.cos.default, aten.exp.default]]
    est = costmodel.estimate_graph(gm, PROFILE)
    (kernel,) = est.per_group
    assert (kernel.bytes_read, kernel.bytes_written) == (nbytes, nbytes)  # 2 tensors, not 6
    unfused = sum(costmodel.node_bytes_moved(n) for n in gm.graph.nodes)
    assert unfused == 6 * nbytes
    assert kernel.kind == "fused"
    assert est.total_s == pytest.approx(max(kernel.flops / 1e10, 2 * nbytes / 1e10) + 1e-6)


def test_softmax_reads_its_input_once_and_writes_output_and_row_statistics():
    x = torch.randn(64, 128)
    gm = _trace(lambda x: x - x.amax(dim=1, keepdim=True), x)  # a reduction and its pointwise user
    (kernel,) = costmodel.estimate_graph(gm, PROFILE).per_group
    assert kernel.bytes_read == x.numel() * 4
    assert kernel.bytes_written == x.numel() * 4 + 64 * 4  # the output, and the reduction's result


def test_a_long_reduction_makes_its_users_a_second_pass_that_reads_the_input_again():
    # A batch norm's shape: per channel over batch and pixels (2,048 elements a channel), the
    # normalized output computed from the statistics: Inductor's kernel loops over the data
    # twice, once to reduce and once to normalize, reading x each time.
    x = torch.randn(8, 16, 16, 16)

    def batch_norm(x):
        var, mean = torch.var_mean(x, dim=(0, 2, 3), keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(var + 1e-5)

    (kernel,) = costmodel.estimate_graph(_trace(batch_norm, x), PROFILE).per_group
    assert kernel.bytes_read == 2 * x.numel() * 4
    # Its two passes touch x once: with x in the cache, the cache's rate, for both passes.
    cached = dataclasses.replace(PROFILE, vector_flops=1e13, cache_bytes=3 * x.numel() * 4, cache_bandwidth=1e11)
    (kernel,) = costmodel.estimate_graph(_trace(batch_norm, x), cached).per_group
    assert kernel.seconds == pytest.approx(kernel.bytes_moved / 1e11 + cached.launch_overhead)
    # A short reduction (a row of 16 under a layer norm) is no loop of its own: one pass.
    y = torch.randn(512, 16)
    gm = _trace(lambda y: (y - y.mean(dim=1, keepdim=True)) * 2.0, y)
    (kernel,) = costmodel.estimate_graph(gm, PROFILE).per_group
    assert kernel.bytes_read == y.numel() * 4
    # What a pass computes from the kernel's inputs is computed, from them, again in the next:
    # xc is the centred input, read by the reduction and by the output after it.
    def backward_like(x, g):
        xc = x - 1.0
        s = (g * xc).sum(dim=(0, 2, 3), keepdim=True)
        return g - xc * s

    gm = _trace(backward_like, x, torch.randn_like(x))
    (kernel,) = costmodel.estimate_graph(gm, PROFILE).per_group
    assert kernel.bytes_read == 4 * x.numel() * 4  # x and g, each in both passes


def test_views_are_free_and_an_expanded_read_counts_its_storage():
    x, bias = torch.randn(128, 64), torch.randn(64)
    gm = _trace(lambda x, b: (x.t() + b.view(64, 1).expand(64, 128)).relu(), x, bias)
    (kernel,) = costmodel.estimate_graph(gm, PROFILE).per_group
    assert kernel.bytes_read == x.numel() * 4 + bias.numel() * 4
    assert all(costmodel.node_bytes_moved(n) == 0 for n in gm.graph.nodes
               if n.op == "call_function" and n.target in (aten.t.default, aten.view.default, aten.expand.default))


def test_kernels_do_not_fuse_across_a_matmul():
    # a feeds the mm and, directly, the add after it: one kernel holding sin and add would
    # have to run both before and after the mm.
    def f(x, w):
        a = x.sin()
        return (a @ w).cos() + a

    gm = _trace(f, torch.randn(32, 32), torch.randn(32, 32))
    groups = [[n.target for n in g] for g in costmodel.kernel_groups(gm)]
    assert groups == [[aten.sin.default], [aten.mm.default], [aten.cos.default, aten.add.Tensor]]
    est = costmodel.estimate_graph(gm, PROFILE)
    sin_kernel = est.per_group[0]
    assert sin_kernel.bytes_written == 32 * 32 * 4  # read by the mm and by the later kernel
    assert est.per_group[1].kind == "compute"


def test_a_value_inlined_into_two_kernels_is_computed_in_both():
    # ``cdf`` (one cheap op on one input) is read by the product a matmul reads and, after a
    # second matmul, by the gradient-like product: Inductor writes ``a`` and ``b`` in two
    # kernels and computes ``cdf`` inside each (the timeline's store-or-inline rule). Priced
    # as one kernel of its own that writes it, a plan whose recomputed GELU shares its
    # ``erf`` with the GELU's backward looked cheaper than one computing it twice, where
    # both compile to the same two kernels (issue #21's 4-layer transformer).
    def f(x, w, dy, w2):
        cdf = x * 0.5 + 1.0
        a = x * cdf
        g = dy @ w2
        return a @ w, g * cdf

    n = 64
    gm = _trace(f, *(torch.randn(n, n) for _ in range(4)))
    est = costmodel.estimate_graph(gm, PROFILE)
    fused = [k for k in est.per_group if k.kind == "fused"]
    cdf = [node.name for node in gm.graph.nodes if node.target in (aten.mul.Tensor, aten.add.Tensor)][:2]
    assert len(fused) == 2 and all(k.computed_inline == cdf for k in fused)
    assert all(name not in k.nodes for k in est.per_group for name in cdf)
    # each kernel computes cdf (two ops) beside its own product, reads x, and writes its product
    assert [k.flops for k in fused] == [3 * n * n, 3 * n * n]
    assert all(k.bytes_written == n * n * 4 for k in fused)
    assert fused[0].bytes_read == n * n * 4 and fused[1].bytes_read == 2 * n * n * 4
    # without the store-or-inline memo, cdf joins the first product's kernel, which writes it once
    first = costmodel.kernel_groups(gm)[0]
    assert [node.name for node in first] == cdf + [fused[0].nodes[0]]


def test_constants_are_computed_inside_their_readers():
    def f(x):
        i = torch.arange(16)
        mask = i.view(16, 1) >= i.view(1, 16)  # causal, as Inductor's decompositions build it
        return x.masked_fill(~mask, 0.0).exp()

    gm = _trace(f, torch.randn(4, 16, 16))
    est = costmodel.estimate_graph(gm, PROFILE)
    assert len(est.per_group) == 1  # the mask is no kernel of its own
    assert est.per_group[0].bytes_read == 4 * 16 * 16 * 4  # x only: the mask is never read from memory


def _mlp_graph(n):
    def f(x, w1, w2):
        return ((x @ w1).relu() @ w2).sum()

    return _trace(f, torch.randn(n, n), torch.randn(n, n), torch.randn(n, n))


def test_estimates_are_positive_and_monotone_in_problem_size():
    for profile in (PROFILE, costmodel.H100_SXM, costmodel.DEFAULT_CPU):
        totals = [costmodel.estimate_graph(_mlp_graph(n), profile).total_s for n in (16, 64, 256, 1024)]
        assert all(t > 0 for t in totals)
        assert totals == sorted(totals) and len(set(totals)) == len(totals)
        est = costmodel.estimate_graph(_mlp_graph(1024), profile)
        assert all(k.seconds > 0 for k in est.per_group)
        assert est.flops >= 2 * 2 * 1024**3  # the two matmuls


def test_every_kernel_node_is_in_exactly_one_kernel_on_a_partitioned_step():
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from fxremat import _compat, compare, models

    graphs = []

    def partition(gm, joint_inputs, **kwargs):
        fwd, bwd = compare.partitioners()["fxremat"](gm, joint_inputs, **kwargs)
        graphs.append((fwd, bwd))
        return fwd, bwd

    nop = lambda g, _: make_boxed_func(g.forward)  # noqa: E731
    backend = aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=partition,
                           decompositions=_compat.inductor_decompositions())
    torch.manual_seed(0)
    model, batch = models.make_transformer()
    torch.compile(model, backend=backend)(*batch).backward()
    (fwd, bwd), = graphs
    step = costmodel.estimate_step(fwd, bwd, PROFILE)
    assert step.total_s == pytest.approx(step.forward.total_s + step.backward.total_s)
    for gm, est in ((fwd, step.forward), (bwd, step.backward)):
        grouped = [name for k in est.per_group for name in k.nodes]
        assert len(grouped) == len(set(grouped))
        inlined = {n.name for n in costmodel.inlined_constants(gm)}
        kernels = {n.name for n in gm.graph.nodes if costmodel._is_kernel(n)}
        # A value Inductor computes in each reader is in no kernel, and in the body of each
        # kernel that reads it.
        inlining = costmodel.Inlining()
        in_readers = {n.name for n in gm.graph.nodes if costmodel._is_kernel(n)
                      and costmodel.computed_in_readers(n, inlining)} - inlined
        assert set(grouped) == kernels - inlined - in_readers
        computed_inline = {name for k in est.per_group for name in k.computed_inline}
        assert computed_inline == in_readers
        assert sum(k.kind == "compute" for k in est.per_group) == sum(
            costmodel.oplib.is_compute_intensive(n) for n in gm.graph.nodes)
        assert est.total_s == pytest.approx(sum(k.seconds for k in est.per_group))


def test_gpu_profiles_match_device_names_and_use_tensor_cores():
    assert costmodel.gpu_profile("NVIDIA H100 80GB HBM3") is costmodel.H100_SXM
    assert costmodel.gpu_profile("NVIDIA H100 PCIe") is costmodel.H100_PCIE
    assert costmodel.gpu_profile("NVIDIA H200") is costmodel.H200
    assert costmodel.gpu_profile("NVIDIA A100-SXM4-80GB") is costmodel.A100_80GB
    assert costmodel.gpu_profile("NVIDIA A100 80GB PCIe") is costmodel.A100_80GB_PCIE
    assert costmodel.gpu_profile("Tesla T4") is None
    h100 = costmodel.H100_SXM
    assert h100.peak_flops(torch.float32, True, tf32=True) == 494.5e12
    assert h100.peak_flops(torch.float32, True, tf32=False) == 67e12
    assert h100.peak_flops(torch.bfloat16, True) == 989.5e12
    assert h100.peak_flops(torch.bfloat16, False) == 67e12 / 2  # pointwise: no tensor cores, no FMA
    assert costmodel.H200.bandwidth > h100.bandwidth
    gm = _mlp_graph(4096)
    tensor_cores, cuda_cores = (costmodel.estimate_graph(gm, h100, tf32=t).total_s for t in (True, False))
    assert tensor_cores < cuda_cores
    assert costmodel.profile_for("cpu").name.startswith("cpu")
    assert costmodel.profile_for(h100) is h100


def test_cpu_calibration_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FXREMAT_CACHE_DIR", str(tmp_path))
    assert costmodel.cpu_profile().source == costmodel.DEFAULT_CPU.source  # not calibrated yet
    measured = costmodel.calibrate_cpu()
    assert (tmp_path / "cpu_profile.json").exists()
    for value in (measured.matmul_flops["fp32"], measured.vector_flops, measured.bandwidth, measured.launch_overhead):
        assert value > 0 and math.isfinite(value)

    def no_measuring(*a, **k):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(devices, "_median_time", no_measuring)  # calibrate_cpu looks it up there
    assert costmodel.calibrate_cpu() == measured
    assert costmodel.cpu_profile() == measured
    assert costmodel.profile_for("cpu") == measured


def test_measured_mode_cache_round_trips(tmp_path):
    # mm and cumsum are library calls under Inductor (cumsum a fallback to ATen on CPU); the
    # embedding is an index Inductor generates code for, as it does the fused sin and cos.
    gm = _trace(lambda x, w: (x @ w).sin().cos() + torch.embedding(w, torch.zeros(4, dtype=torch.long)).sum()
                + torch.cumsum(w, 0), torch.randn(64, 64), torch.randn(64, 64))
    timer = costmodel.OpTimer("cpu", directory=tmp_path, repeats=3)
    first = costmodel.estimate_graph(gm, PROFILE, timer=timer)
    library = [k for k in first.per_group if k.bound == "measured"]
    assert sorted(k.nodes[-1].split("_")[0] for k in library) == ["cumsum", "mm"]
    assert all(k.seconds > 0 for k in library)
    embedding = [k for k in first.per_group if any(name.startswith("embedding") for name in k.nodes)]
    assert embedding and all(k.bound != "measured" for k in embedding)  # Inductor's own code: the roofline
    assert all(k.bound != "measured" for k in first.per_group if k.kind == "fused")  # default scope: extern only
    assert timer.misses == len(library) and timer.hits == 0
    again = costmodel.OpTimer("cpu", directory=tmp_path)
    second = costmodel.estimate_graph(gm, PROFILE, timer=again)
    assert (again.hits, again.misses) == (len(library), 0)
    assert [k.seconds for k in second.per_group] == [k.seconds for k in first.per_group]
    everything = costmodel.OpTimer("cpu", directory=tmp_path, scope="all", repeats=3)
    third = costmodel.estimate_graph(gm, PROFILE, timer=everything)
    assert all(k.bound == "measured" for k in third.per_group)
    assert everything.hits == len(library)  # shared entries, one cache file


def test_measured_mode_times_real_kernels_under_the_fake_mode(tmp_path, monkeypatch):
    """The partitioner runs inside torch.compile's fake mode: the timer's kernels still run
    on real tensors (under fake mode they took 0.3 ms where the real conv takes 1 ms+)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from fxremat import optimer

    gm = _trace(lambda x, w: x @ w, torch.randn(64, 64), torch.randn(64, 64))
    seen = []

    def once(run, *a, **k):
        seen.extend(type(v) for v in run().values())
        return 1e-3

    monkeypatch.setattr(optimer, "_median_time", once)
    timer = costmodel.OpTimer("cpu", directory=tmp_path)
    with FakeTensorMode(), torch._C._EnablePythonDispatcher():
        assert timer.time_kernel([_node(gm, aten.mm.default)]) == 1e-3
    assert seen and torch.Tensor in seen and FakeTensor not in seen


def test_measured_mode_keys_differ_by_shape_and_stride(tmp_path):
    timer = costmodel.OpTimer("cpu", directory=tmp_path)
    a = _trace(lambda x, w: x @ w, torch.randn(8, 8), torch.randn(8, 8))
    b = _trace(lambda x, w: x @ w, torch.randn(8, 16), torch.randn(16, 8))
    c = _trace(lambda x, w: x @ w.t(), torch.randn(8, 8), torch.randn(8, 8))
    keys = {timer.key([_node(gm, aten.mm.default)]) for gm in (a, b, c)}
    assert len(keys) == 3


def test_profile_json_round_trip():
    data = costmodel.H200.to_json()
    assert costmodel.DeviceProfile(**data) == costmodel.H200
    assert dataclasses.replace(costmodel.H200, cache_bandwidth=1e13).bandwidth_for(1024) == 1e13
    assert costmodel.H200.bandwidth_for(1024) == costmodel.H200.bandwidth  # no cache bandwidth known
