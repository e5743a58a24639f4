#!/bin/bash
# Session 33's GPU call: everything side by side, each part writing as it goes.
export PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=2 PYTHONWARNINGS=ignore
O=$OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/env.txt 2>&1
python - >> $O/env.txt 2>&1 <<'PY'
import torch, platform
from torch.autograd.function import BackwardCFunction
import fxremat
from fxremat import _compat
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "python", platform.python_version())
print("backward_frees_incoming_gradients", _compat.backward_frees_incoming_gradients())
print("BackwardCFunction boxed attrs", [a for a in dir(BackwardCFunction) if "box" in a])
print("Function boxed attrs", [a for a in dir(torch.autograd.Function) if "box" in a])
try:
    import pytest, hypothesis; print("pytest", pytest.__version__, "hypothesis", hypothesis.__version__)
except ImportError as e:
    print("no pytest/hypothesis:", e)
PY
(timeout 480 python bench/step_plans.py --model gpt2 --scale gpu --budget 3624217088 --device cuda --solver rotor --out $O/gpt2-rotor > $O/gpt2-rotor.log 2>&1; echo "rc=$?" >> $O/gpt2-rotor.log) &
(timeout 480 python bench/step_plans.py --model gpt2 --scale gpu --budget 3624217088 --device cuda --solver auto --out $O/gpt2-auto > $O/gpt2-auto.log 2>&1; echo "rc=$?" >> $O/gpt2-auto.log) &
(timeout 500 python bench/distributed_step.py --device cuda --world 1 --jobs 4 --timeout 240 --models transformer,cnn --wrappers ddp_then_compile+split,compile_then_ddp,fsdp2_compile_model,fsdp2_compile_blocks --budgets 0.5,least --out $O/dist > $O/dist.log 2>&1; echo "rc=$?" >> $O/dist.log) &
(timeout 500 python bench/gpu_suite.py check --only prediction --jobs 3 --cases gpt,decoder,transformer,unet,cnn --out $O/check > $O/check.log 2>&1; echo "rc=$?" >> $O/check.log) &
if python -c "import pytest, hypothesis" 2>/dev/null; then
  (timeout 480 bash -c "python -m pytest -q -p no:cacheprovider tests/test_step_budget.py -k incoming_gradient; python -m pytest -q -x -p no:cacheprovider tests/test_distributed.py" > $O/pytest211.log 2>&1; echo "rc=$?" >> $O/pytest211.log) &
fi
wait
ls -la $O
