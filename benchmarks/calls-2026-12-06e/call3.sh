# session 2026-12-06e call 3: call 2 found LLA's kernels slower reading the heads at a (B, T, H, D) stride (0.84x the
# step at 1024) and softmax slower with the qkv prologue (0.95-0.99x). Now: LLA's stacked+graphed K = 6 step with each
# head's rows made contiguous at its width (MIXZOO_LLA_HEADS=contiguous, the default now; q, k from the rotation
# kernel as before) against the padded copies as before (MIXZOO_LLA_HEADS=padded), back to back, each in its own
# process; the GPU test of the three ways (bit for bit, timed); then with the time left the eight at MAD's lengths,
# stacked+graphed K = 6, for the README's H200 table.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
TPN=-lla-contiguous TP_ARGS="$S --K 6 lla" T=100 bash scripts/gpu-zoo.sh tput
MIXZOO_LLA_HEADS=padded TPN=-lla-padded TP_ARGS="$S --K 6 lla" T=100 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-strided KEXPR="strided" K="tests/gpu/test_lla_kernel.py" T=60 bash scripts/gpu-zoo.sh gputests
ALL="softmax gdn gla mesa lla parallax mamba hyena"
[ $(left) -gt 120 ] && TPN=-table-k6 TP_ARGS="$S --K 6 --budget-s $(( $(left) - 45 )) $ALL" T=$(( $(left) - 15 )) \
  bash scripts/gpu-zoo.sh tput
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked|\| all" $f | head -n 40; done
grep -h -E "passed|failed|^PASSED|^FAILED|^ERROR|lla B=" logs/gputests-*.log | tail -n 20
echo "== end $(date +%T), left $(left)"
