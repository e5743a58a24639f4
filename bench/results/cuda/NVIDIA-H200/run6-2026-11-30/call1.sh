#!/bin/bash
# Session 54's GPU call (issues #22 and #26): everything side by side, each part writing as it
# goes into /tmp/r, which is packed into $OUT/run6.tar.gz at the end (every part has its own
# time limit, well inside the call's).
export PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=2 PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R/unseen
T="timeout -k 10 ${PART_LIMIT:-400}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt 2>&1
python - >> $R/env.txt 2>&1 <<'PY'
import torch, platform, sympy
import fxremat
from fxremat import _compat
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "python", platform.python_version())
print("backward_frees_incoming_gradients", _compat.backward_frees_incoming_gradients())
x, y = sympy.symbols("x y", positive=True, integer=True)
print("symbolic_max", _compat.symbolic_max(x, y, 3), type(_compat.symbolic_max(x, y)).__module__)
PY
# 1. GPT-2 small (seq 1024, batch 8) at per-block checkpointing's measured step peak (H200, run 3).
for s in rotor auto; do
  ($T python bench/step_plans.py --model gpt2 --scale gpu --budget 3624217088 --device cuda --solver $s --out $R/gpt2-$s > $R/gpt2-$s.log 2>&1; echo "rc=$?" >> $R/gpt2-$s.log) &
done
# 2. Predicted vs measured peak of the GPT's and the decoder's rows (the least plans were 5.5% and 6.5% over in run 5).
($T python bench/gpu_suite.py check --only prediction --jobs 3 --cases gpt,decoder --out $R/check > $R/check.log 2>&1; echo "rc=$?" >> $R/check.log) &
# 3. DDP (DDPOptimizer's buckets) and FSDP2 on one NCCL rank at the step's least.
($T python bench/distributed_step.py --device cuda --world 1 --jobs 3 --timeout 300 --models transformer,cnn --wrappers ddp_then_compile+split,fsdp2_compile_model,fsdp2_compile_blocks --budgets least --out $R/dist > $R/dist.log 2>&1; echo "rc=$?" >> $R/dist.log) &
# 4. Hugging Face architectures outside the zoo on CUDA: 0.5 and the step's least.
(for m in t5 gpt_neox phi qwen2 opt bloom falcon gptj mistral gemma bart; do for b in 0.5 least; do echo "$m $b"; done; done |
  $T xargs -P 5 -L 1 sh -c 'python bench/step_plans.py --model $0 --scale small --sizes "{\"batch\": 16, \"seq\": 256}" --budget $1 --device cuda --out /tmp/r/unseen/$0-$1 > /tmp/r/unseen/$0-$1.log 2>&1' ; echo "rc=$?" > $R/unseen/rc) &
# 5. CPU tests on the device's torch (2.11).
($T python -m pytest -n 4 --dist loadfile -p no:cacheprovider -v tests/test_dynamic.py tests/test_timeline_layouts.py tests/test_inductor_buffers.py tests/test_step_budget.py tests/test_distributed.py > $R/pytest211.log 2>&1; echo "rc=$?" >> $R/pytest211.log) &
wait
tar czf $OUT/run6.tar.gz -C /tmp r
ls -la $R $R/unseen
