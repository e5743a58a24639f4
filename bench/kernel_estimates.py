"""Each Inductor kernel's measured time beside the cost model's estimate of the groups it comes from.

    MODEL=resnet50 STEPS=8 OUT=kernels.json python bench/kernel_estimates.py

Per-block checkpointing and fxremat at its measured peak, compiled as ``bench/kernel_split.py``
does, with Inductor's kernel names listing the FX nodes they compute
(``cpp.descriptive_names="inductor_node"``); each kernel's median time over ``STEPS`` profiled
steps (per call: Inductor calls one kernel for each instance of identical code, its name
listing the first instance's nodes) is set beside the ``costmodel.estimate_graph`` groups
whose nodes its name lists most of (several of the model's groups can be one kernel). A
diagnostic for issue #26 (a few kernels far slower than their bytes), CPU only; not a test.
Run it with an empty ``TORCHINDUCTOR_CACHE_DIR``: each kernel is also marked by whether its
generated C++ fills only part of its vectors (``partial_vectors``), read from that directory.
"""
import collections, glob, json, os, re, statistics, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
import torch
import torch._inductor.compile_fx as compile_fx
from torch.profiler import ProfilerActivity, profile
from ab import Contender, peer_strategy
from frontier_strategies import FX_OPTIONS_DEFAULT
from kernel_split import part_of
from fxremat import costmodel
torch.set_num_threads(1)
graphs = []
post_grad = compile_fx._recursive_post_grad_passes
def captured(gm, *a, **k):
    out = post_grad(gm, *a, **k)
    graphs.append(gm)
    return out
spec = {"model": os.environ.get("MODEL", "resnet50"), "scale": "small", "overrides": {}, "device": "cpu",
        "dtype": "float32", "fx_options": dict(FX_OPTIONS_DEFAULT)}
compile_fx._recursive_post_grad_passes = captured
with torch._functorch.config.patch(enable_autograd_cache=False), \
        torch._inductor.config.patch({"fx_graph_cache": False, "cpp.enable_kernel_profile": True,
                                      "cpp.descriptive_names": "inductor_node", "kernel_name_max_ops": 10000}):
    peer = Contender(spec, peer_strategy("ckpt_blocks"), 2)
    budget = peer.measure()
    n_peer = len(graphs)
    fx = Contender(spec, {"name": "fxremat", "kind": "fxremat", "budget_bytes": budget}, 2)
compile_fx._recursive_post_grad_passes = post_grad
sides = {"peer": (peer, graphs[:n_peer]), "fxremat": (fx, graphs[n_peer:])}
print({k: len(v[1]) for k, v in sides.items()})
steps = int(os.environ.get("STEPS", "8"))
samples = {n: collections.defaultdict(list) for n in sides}
for r in range(steps):
    for name in (("peer", "fxremat") if r % 2 == 0 else ("fxremat", "peer")):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sides[name][0].step()
        per, calls = collections.Counter(), collections.Counter()
        for e in prof.events():
            part = part_of(e)
            if part is not None and part.endswith("kernels"):
                per[(part.split()[0], e.name)] += e.cpu_time_total
                calls[(part.split()[0], e.name)] += 1
        for k, v in per.items():
            # Inductor emits one kernel for calls of identical code (a block's batch norms): its
            # name lists the first call's nodes, so a call's time is compared with that group's.
            samples[name][k].append((v, calls[k]))
profile_cpu = costmodel.profile_for("cpu")
out = {}
for name, (_, gms) in sides.items():
    ests = {"forward": costmodel.estimate_graph(gms[0], profile_cpu), "backward": costmodel.estimate_graph(gms[-1], profile_cpu)}
    rows = []
    kernels = [(phase, kname, "_" + kname.split("_cpp_fused_", 1)[-1] + "_", vals)
               for (phase, kname), vals in samples[name].items()]
    # Each group goes to the kernel whose name lists most of its nodes (Inductor may fuse
    # several of the model's groups into one kernel); a reused kernel's later instances,
    # whose nodes no name lists, are left out (``unmatched_us``).
    assigned = collections.defaultdict(list)
    unmatched = collections.Counter()
    for phase in ("forward", "backward"):
        for k in ests[phase].per_group:
            if k.kind == "compute":
                continue
            hits = [(sum(1 for n in k.nodes if f"_{n}_" in body), kname) for ph, kname, body, _ in kernels if ph == phase]
            best = max(hits, default=(0, None))
            if best[0]:
                assigned[(phase, best[1])].append(k)
            else:
                unmatched[phase] += k.seconds * 1e6
    for phase, kname, body, vals in kernels:
        groups = assigned[(phase, kname)]
        n_calls = vals[0][1]
        rows.append({"phase": phase, "kernel": kname, "calls": n_calls,
                     "measured_us": statistics.median(v for v, _ in vals) / n_calls,
                     "estimated_us": sum(k.seconds for k in groups) * 1e6 if groups else None,
                     "bytes": sum(k.bytes_moved for k in groups) if groups else None,
                     "bounds": [k.bound for k in groups], "groups": [k.nodes for k in groups]})
    out[name + " unmatched_us"] = dict(unmatched)
    out[name] = rows
    for phase in ("forward", "backward"):
        m = sum(r["measured_us"] * r["calls"] for r in rows if r["phase"] == phase)
        e = sum(k.seconds * 1e6 for k in ests[phase].per_group if k.kind != "compute")
        print(name, phase, "kernels measured", round(m), "us; estimated fused/other", round(e), "us;", len([r for r in rows if r["phase"] == phase]), "kernels measured,", len([k for k in ests[phase].per_group if k.kind != "compute"]), "groups")
# Which kernels fill only part of their vectors, from Inductor's generated C++ (its cache
# directory): a vectorized loop whose extent is not a multiple of its step (8 channels in
# steps of 16 fp32 lanes), or a scalar tail loop.
from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir
source = {}
for path in glob.glob(os.path.join(inductor_cache_dir(), "**", "*.py"), recursive=True):
    text = open(path).read()
    for m in re.finditer(r"\ncpp_fused_(\w+) = async_compile\.cpp_pybinding\(.*?r'''(.*?)'''", text, re.S):
        source[m.group(1)] = m.group(2)
def partial(code):
    loops = re.findall(r"<static_cast<int64_t>\((\d+)L\); x\d+\+=static_cast<int64_t>\((\d+)L\)", code)
    return "_tail++" in code or any(int(n) % int(step) for n, step in loops if int(step) > 1)
for name in ("peer", "fxremat"):
    for r in out[name]:
        code = source.get(r["kernel"].split("_cpp_fused_", 1)[-1])
        r["partial_vectors"] = None if code is None else partial(code)
    for phase in ("forward", "backward"):
        for flag in (True, False):
            rows = [r for r in out[name] if r["phase"] == phase and r["partial_vectors"] is flag]
            m = sum(r["measured_us"] * r["calls"] for r in rows)
            e = sum((r["estimated_us"] or 0) * r["calls"] for r in rows)
            print(name, phase, "partial vectors" if flag else "whole vectors", len(rows), "kernels,",
                  sum(r["calls"] for r in rows), "calls: measured", round(m), "us, estimated", round(e), "us")
json.dump(out, open(os.environ.get("OUT", "kernel_estimates.json"), "w"), indent=1)
