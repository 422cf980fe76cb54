# session 2026-12-06c call 3: per-kernel profiles of Hyena's stacked+graphed K = 6 step, channels-first (the default),
# at a Toeplitz length (128) and an FFT length (1024).
export END=$(( $(date +%s) + ${BUDGET:-200} )); Z="bash scripts/gpu-zoo.sh"
for s in mad mad1024; do
  SCRIPT_ARGS="--mixers hyena --shape $s --stacked 6 --graphed --steps 3 --warmup 5 --top 30 --by-source --out logs/prof-hyena-$s" T=90 $Z script:benchmarks/profile_step.py
  mv logs/profile_step.log logs/prof-hyena-$s.log
done
ls logs
