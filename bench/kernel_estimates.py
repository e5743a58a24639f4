"""Each Inductor kernel's measured time beside the cost model's estimate of the group it comes from.

    MODEL=resnet50 STEPS=8 OUT=kernels.json python bench/kernel_estimates.py

Per-block checkpointing and fxremat at its measured peak, compiled as ``bench/kernel_split.py``
does, with Inductor's kernel names listing the FX nodes they compute
(``cpp.descriptive_names="inductor_node"``); each kernel's median time over ``STEPS`` profiled
steps is matched to the ``costmodel.estimate_graph`` group sharing most of its nodes. A
diagnostic for issue #26 (a few kernels far slower than their bytes), CPU only; not a test.
"""
import collections, os, statistics, sys, json
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
        per = collections.Counter()
        for e in prof.events():
            part = part_of(e)
            if part is not None and part.endswith("kernels"):
                per[(part.split()[0], e.name)] += e.cpu_time_total
        for k, v in per.items():
            samples[name][k].append(v)
profile_cpu = costmodel.profile_for("cpu")
out = {}
for name, (_, gms) in sides.items():
    ests = {"forward": costmodel.estimate_graph(gms[0], profile_cpu), "backward": costmodel.estimate_graph(gms[-1], profile_cpu)}
    rows = []
    for (phase, kname), vals in samples[name].items():
        body = "_" + kname.split("_cpp_fused_", 1)[-1] + "_"
        best, overlap = None, 0
        for k in ests[phase].per_group:
            if k.kind == "compute":
                continue
            hit = sum(1 for n in k.nodes if f"_{n}_" in body)
            if hit > overlap:
                best, overlap = k, hit
        rows.append({"phase": phase, "kernel": kname, "measured_us": statistics.median(vals),
                     "estimated_us": best.seconds * 1e6 if best else None, "bytes": best.bytes_moved if best else None,
                     "bound": best.bound if best else None, "group": best.nodes if best else [], "overlap": overlap})
    out[name] = rows
    for phase in ("forward", "backward"):
        m = sum(r["measured_us"] for r in rows if r["phase"] == phase)
        e = sum(k.seconds * 1e6 for k in ests[phase].per_group if k.kind != "compute")
        print(name, phase, "kernels measured", round(m), "us; estimated fused/other", round(e), "us;", len([r for r in rows if r["phase"] == phase]), "kernels measured,", len([k for k in ests[phase].per_group if k.kind != "compute"]), "groups")
json.dump(out, open(os.environ.get("OUT", "kernel_estimates.json"), "w"), indent=1)
