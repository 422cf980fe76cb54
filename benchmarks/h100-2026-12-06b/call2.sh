# session 2026-12-06b call 2 (the machine still warm after call 1): MQAR's longest shape for the two mechanisms changed
# since the H200 table (Hyena with its operator as one Function, MesaNet unpadded), then per-kernel profiles at 1024.
export END=$(( $(date +%s) + 420 )); Z="bash scripts/gpu-zoo.sh"
(MIXZOO_HYENA_OP=fused TPN=-mqar TP_ARGS="--shape mqar512 --steps 30 --warmup 10 --procs= --modes graphed,stacked,stacked+graphed --K 6 hyena mesa" T=170 $Z tput
 for m in lla parallax mesa; do
   SCRIPT_ARGS="--mixers $m --shape mad1024 --stacked 6 --graphed --steps 3 --warmup 5 --top 25 --by-source --out logs/prof-$m-mad1024" T=70 $Z script:benchmarks/profile_step.py
   mv logs/profile_step.log logs/prof-$m-mad1024.log
 done) > $OUT/call2.out 2>&1
