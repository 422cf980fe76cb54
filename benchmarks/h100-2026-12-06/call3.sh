# session 2026-12-06 call 3: Hyena's stacked Function on the GPU against separate runs; per-kernel profiles (K = 6)
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-200} ))
left() { echo $(( END - $(date +%s) )); }
Z="bash scripts/gpu-zoo.sh"
echo "== $(date +%T) gputests"
K=tests/gpu/test_fftconv_gpu.py KEXPR=stacked_training T=90 $Z gputests > /dev/null 2>&1
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
