"""Paired A/B on fxremat.models.make_deep_cnn at the plan fixture's size: auto vs solver=rotor."""
import os
import sys
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))  # the repository
sys.path[:0] = [os.path.join(ROOT, "bench"), ROOT]
import torch
import frontier_models as fm
from fxremat import models
from fxremat.plans import Planned, planning_only, wrapped

def make_deep(batch, size, depth):
    model, data = models.make_deep_cnn(batch=batch, size=size, depth=depth)
    return fm.FrontierModel(model, data, None, False, [], {})

fm.SIZES["deep_cnn"] = {"small": dict(batch=4, size=16, depth=4)}
fm._BUILDERS["deep_cnn"] = make_deep
fraction = float(sys.argv[1]); rounds = sys.argv[2]; out = sys.argv[3]
torch.manual_seed(0)
m = fm.build("deep_cnn", "small")
compiled = torch.compile(m.model, backend="fxremat", options={"memory_budget": fraction, "hold_outputs": False})
with planning_only():
    try:
        compiled(*m.batch).backward()
    except Exception as error:
        planned = wrapped(error, (Planned,))
        budget = planned.plan.budget_bytes
        print("fraction", fraction, "budget bytes", budget, "auto picks", planned.plan.solver, flush=True)
torch._dynamo.reset()
import ab
ab.main(["--model", "deep_cnn", "--peer", "inductor", "--budget-bytes", str(budget), "--rounds", rounds,
         "--variant-options", '{"solver": "rotor"}', "--out", out])
