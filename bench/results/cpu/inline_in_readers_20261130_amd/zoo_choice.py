"""Which auto plans change with the store-or-inline rule in estimate_graph: each frontier model
(small scale) at several fractions, planned where torch.compile plans (Inductor timeline),
stopped before compiling; old rule by patching computed_in_readers to False. Run on branch
experiment/inline-in-readers (main has no computed_in_readers):

    python zoo_choice.py new|old transformer4,gpt2,... 0.8,0.5,0.2
"""
import json
import os
import sys
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))  # the repository
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]
import torch
from fxremat import costmodel
from fxremat.plans import Planned, planning_only, wrapped
from frontier_models import build
from compile_plan_time import plan_digest
rule = sys.argv[1]
models = sys.argv[2].split(",")
budgets = [float(b) for b in sys.argv[3].split(",")]
if rule == "old":
    costmodel.computed_in_readers = lambda node, inlining: False
def plan_of(name, budget):
    torch._dynamo.reset(); torch.manual_seed(0)
    m = (build("transformer", "small", {"layers": 4, "dim": 64, "heads": 4, "seq": 64, "batch": 2})
         if name == "transformer4" else build(name, "small"))
    compiled = torch.compile(m.model, backend="fxremat", options={"memory_budget": budget, "hold_outputs": False})
    with planning_only():
        try:
            out = compiled(*m.batch)
            (out if out.dim() == 0 else out.sum()).backward()
        except Exception as error:
            planned = wrapped(error, (Planned,))
            if planned is None:
                return {"error": repr(error)[:200]}
            p = planned.plan
            return {"solver": p.solver, "peak": p.predicted_peak_bytes, "budget": p.budget_bytes,
                    "est_ms": round(p.notes.get("estimated_step_s", float("nan")) * 1e3, 4), "digest": plan_digest(p),
                    "why": p.notes.get("why", "")[-160:]}
    return {"error": "not stopped"}
for name in models:
    for b in budgets:
        r = plan_of(name, b)
        print(json.dumps({"rule": rule, "model": name, "budget": b, **r}), flush=True)
