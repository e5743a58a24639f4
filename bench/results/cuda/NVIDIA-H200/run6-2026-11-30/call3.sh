#!/bin/bash
# Session 54's third GPU call: the Hugging Face models of call 1 again with the two rules found
# from call 2's records (a mask written where Inductor hints it through its expand; the
# broadcast bias copied dense for each efficient attention backward on torch 2.11), the
# installed Inductor's sdpa_constraint, and the CPU tests that failed on torch 2.11 in call 1.
export PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=2 PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1
R=/tmp/r3; mkdir -p $R
T="timeout -k 10 ${PART_LIMIT:-200}"
S='{"batch": 16, "seq": 256}'
python - > $R/inductor211.txt 2>&1 <<'PY'
import inspect, torch
from torch._inductor import lowering, ir
from fxremat import _compat
print("torch", torch.__version__)
print("attention_backward_copies_broadcast_bias", _compat.attention_backward_copies_broadcast_bias())
print(inspect.getsource(lowering.sdpa_constraint))
print(inspect.getsource(ir.BaseView.realize_hint))
PY
for mb in qwen2:least gpt_neox:least phi:least gemma:least mistral:least falcon:least gptj:least qwen2:0.5 gpt_neox:0.5 mistral:0.5; do
  m=${mb%%:*}; b=${mb#*:}
  rec=""; case $mb in falcon:least|gptj:least) rec="--record $R/$m-$b/rec";; esac
  ($T python bench/step_plans.py --model $m --scale small --sizes "$S" --budget $b --device cuda --out $R/$m-$b $rec > $R/$m-$b.log 2>&1; echo "rc=$?" >> $R/$m-$b.log) &
done
($T python -m pytest -n 3 -p no:cacheprovider -v --tb=short "tests/test_dynamic.py::test_cnn_with_dynamic_resolution_keeps_a_byte_budget" "tests/test_inductor_buffers.py::test_a_unets_convolution_backward_scratchpad_is_counted" "tests/test_inductor_buffers.py::test_a_group_norms_scale_and_shift_are_written_and_its_output_inlined" > $R/pytest211.log 2>&1; echo "rc=$?" >> $R/pytest211.log) &
wait
tar czf $OUT/run6c.tar.gz -C /tmp r3
grep -h '"step": 2' $R/*.log | cut -c1-160
