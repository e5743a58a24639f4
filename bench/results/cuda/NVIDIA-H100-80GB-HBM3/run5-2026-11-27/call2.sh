#!/bin/bash
# Session 33's second GPU call: the allocator's history of the two least plans that measured over their prediction.
export PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=4 PYTHONWARNINGS=ignore
python - <<'PY'
import concurrent.futures, json, os, shutil
from fxremat.harness import measure_step
out = os.environ["OUT"]
cases = {"gpt": ({"batch": 32, "seq": 256, "dim": 256, "layers": 4}, 152347648), "decoder": ({}, 11910144)}
def run(name):
    kwargs, budget = cases[name]
    rec = os.path.join("/tmp/rec", name)
    r = measure_step(name, "fxremat", {"memory_budget": budget}, device="cuda", model_kwargs=kwargs, timeout=200, record_dir=rec)
    return name, {k: r.get(k) for k in ("predicted_peak_bytes", "peak_bytes", "budget_bytes", "solver", "record_dir")}
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    for name, r in pool.map(run, cases):
        print(name, json.dumps(r), flush=True)
shutil.make_archive(os.path.join(out, "least-records"), "gztar", "/tmp/rec")
PY
ls -la $OUT
