# planned for the next session's first device call (about 8 min; not run): what the 2026-12-06f calls left unmeasured.
# 1. The training tests with today's defaults for softmax (aligned attention strides) and LLA (heads strided from the
#    qkv prologue): graphed against eager, stacked and stacked+graphed against separate runs, Muon.
# 2. The cost floor at today's commit (last measured on an H200 at 51ec073), then the eight at K = 3 (the sweep
#    column of the projection: a sweep stacks its 3 seeds at K = 3), stacked+graphed at MAD's four lengths.
# Then `mixzoo bench throughput --project <the K = 6 table of call2> <LLA strided of call2> <this K = 3 table>
# --protocol settings` (on the same card kind as call 2, an H200: compare only within one card kind).
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
GTN=-training KEXPR="lla or softmax" K=tests/gpu/test_throughput_gpu.py T=150 bash scripts/gpu-zoo.sh gputests
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
TPN=-floor-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py $S --K 6 floor" T=60 bash scripts/gpu-zoo.sh tput
ALL="softmax gdn gla mesa lla parallax mamba hyena"
[ $(left) -gt 100 ] && TPN=-table-k3 TP_ARGS="$S --K 3 --budget-s $(( $(left) - 40 )) $ALL" T=$(( $(left) - 15 )) \
  bash scripts/gpu-zoo.sh tput
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked|\| all" $f | head -n 40; done
grep -h -E "passed|failed|^FAILED|^ERROR" logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
