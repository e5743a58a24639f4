#!/bin/bash
# Prepared in session 54 for the next GPU session (not yet run): the Hugging Face models of
# run 6 again with both mask rules, their joint graphs saved (FXREMAT_SAVE_JOINTS) to plan
# here, the measured step's own allocator history, and FSDP2 measured as the budget counts.
export PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=2 PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1
R=/tmp/r7; mkdir -p $R
T="timeout -k 10 ${PART_LIMIT:-300}"
S='{"batch": 16, "seq": 256}'
for mb in qwen2:least gpt_neox:least phi:least gemma:least mistral:least falcon:least gptj:least qwen2:0.5 gpt_neox:0.5; do
  m=${mb%%:*}; b=${mb#*:}
  rec=""; case $mb in qwen2:least|falcon:least) rec="--record $R/$m-$b/rec";; esac
  (FXREMAT_SAVE_JOINTS=$R/joints/$m-$b $T python bench/step_plans.py --model $m --scale small --sizes "$S" --budget $b \
     --device cuda --out $R/$m-$b $rec > $R/$m-$b.log 2>&1; echo "rc=$?" >> $R/$m-$b.log) &
done
($T python bench/distributed_step.py --device cuda --world 1 --jobs 2 --timeout 240 --models transformer,cnn \
   --wrappers fsdp2_compile_model,fsdp2_compile_blocks --budgets least --out $R/dist > $R/dist.log 2>&1; echo "rc=$?" >> $R/dist.log) &
wait
tar czf $OUT/run7.tar.gz -C /tmp r7
grep -h '"step": 2' $R/*.log | cut -c1-160
