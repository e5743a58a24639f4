#!/bin/bash
# Session 54's second GPU call: the allocator's history of the plans that measured over their
# prediction in call 1 (three Hugging Face models outside the zoo, the decoder at 0.5), and
# GPT-2's step at per-block checkpointing's peak again with what each step starts from.
export PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=3 PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1
R=/tmp/r2; mkdir -p $R
T="timeout -k 10 ${PART_LIMIT:-230}"
S='{"batch": 16, "seq": 256}'
for mb in qwen2:75838976 gpt_neox:0.5 falcon:80039936 phi:64124928; do
  m=${mb%%:*}; b=${mb#*:}
  ($T python bench/step_plans.py --model $m --scale small --sizes "$S" --budget $b --device cuda --out $R/$m --record $R/$m/rec > $R/$m.log 2>&1; echo "rc=$?" >> $R/$m.log) &
done
($T python bench/step_plans.py --model gpt2 --scale gpu --budget 3624217088 --device cuda --solver rotor --out $R/gpt2-rotor > $R/gpt2-rotor.log 2>&1; echo "rc=$?" >> $R/gpt2-rotor.log) &
($T python - > $R/decoder.log 2>&1 <<'PY'; echo "rc=$?" >> $R/decoder.log) &
import json
from fxremat.harness import measure_step
r = measure_step("decoder", "fxremat", {"memory_budget": 0.5}, device="cuda", timeout=220, record_dir="/tmp/r2/decoder/rec")
print(json.dumps({k: r.get(k) for k in ("predicted_peak_bytes", "peak_bytes", "budget_bytes", "solver", "record_dir")}), flush=True)
PY
wait
tar czf $OUT/run6b.tar.gz -C /tmp r2
du -sh $R/*
