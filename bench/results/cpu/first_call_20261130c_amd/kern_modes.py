import os, sys, glob, json, warnings
mode = sys.argv[1]; layers = int(sys.argv[2])
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"/tmp/s52/k/{mode}{layers}" + ("_" + sys.argv[4] if len(sys.argv) > 4 else "")
import torch, fxremat
from fxremat import models
warnings.simplefilter("ignore")
torch.manual_seed(0)
model, batch = models.make_transformer(batch=2, seq=64, dim=64, layers=layers)
if mode == "torch": compiled = torch.compile(model)
else:
    compiled = torch.compile(model, backend="fxremat", options={"memory_budget": float(sys.argv[3]) if len(sys.argv) > 3 else 0.5, **({"solver": sys.argv[4]} if len(sys.argv) > 4 else {})})
loss = compiled(*batch)
fwd = set(glob.glob(cache + "/**/*.cpp", recursive=True))
loss.backward()
bwd = sorted(set(glob.glob(cache + "/**/*.cpp", recursive=True)) - fwd)
json.dump({"fwd": sorted(fwd), "bwd": bwd}, open(cache + ".json", "w"))
print(mode, len(fwd), len(bwd))
