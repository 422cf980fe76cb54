# planned, not run on 2026-12-06 (no machine, then no device time): Hyena's Functions on the GPU (stacked at 512
# against separate runs; the Toeplitz layer against float64), the Toeplitz Function timed against the composition,
# then per-kernel profiles of the stacked+graphed step (K = 6) where the projection's time is.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { echo $(( END - $(date +%s) )); }
Z="bash scripts/gpu-zoo.sh"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed"
echo "== $(date +%T) gputests"
K=tests/gpu/test_fftconv_gpu.py T=120 $Z gputests > /dev/null 2>&1
for v in torch fused; do
  echo "== $(date +%T) hyena toeplitz $v"
  TPN=-hyena-toeplitz-$v MIXZOO_HYENA_TOEPLITZ=$v MIXZOO_BENCH_MIXERS=hyena TP_ARGS="--shape mad,mad256 $S --K 6" T=60 $Z tput > /dev/null 2>&1
done
P="--stacked 6 --graphed --steps 3 --warmup 5 --top 25"
for job in "hyena mad1024" "hyena mad" "mesa mad1024" "lla mad512" "mamba mad1024" "parallax mad1024"; do
  set -- $job
  [ $(left) -gt 40 ] || { echo "skipped (time): $job"; continue; }
  echo "== $(date +%T) $job"
  SCRIPT_ARGS="--mixers $1 --shape $2 $P --by-source --out logs/prof-$1-$2" T=$(( $(left) - 10 )) $Z script:benchmarks/profile_step.py >/dev/null 2>&1
  mv logs/profile_step.log logs/prof-$1-$2.log 2>/dev/null
done
tar czf $OUT/logs.tgz logs
echo "== end $(date +%T), left $(left)"
