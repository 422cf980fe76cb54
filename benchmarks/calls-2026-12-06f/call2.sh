# session 2026-12-06f call 2. Call 1 (H100) timed softmax with the attention strides aligned 1.08-1.13x the step at every
# MAD length (now the default) and LLA at 512 and 1024 with its heads at their width (VEC loads) 1.01-1.05x the padded
# copies. Now, back to back, each in its own process: LLA contiguous per head, and strided from the qkv prologue, at all
# four lengths; the eight at today's defaults (LLA padded), stacked+graphed K = 6, for the projection table (its LLA
# row is the padded copies' rate in the same call); then the GPU tests not yet run on a GPU (Hyena's fftconv operator,
# the qkv prologue) and those of the new attention default; K = 3 only if time is left. BUDGET: seconds for it all.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
MIXZOO_LLA_HEADS=contiguous TPN=-lla-contiguous TP_ARGS="$S --K 6 lla" T=60 bash scripts/gpu-zoo.sh tput
MIXZOO_LLA_HEADS=strided MIXZOO_QKV_PROLOGUE=fused TPN=-lla-strided-prologue TP_ARGS="$S --K 6 lla" T=60 \
  bash scripts/gpu-zoo.sh tput
echo "== table at $(date +%T), left $(left)"
ALL="softmax gdn gla mesa lla parallax mamba hyena"
TPN=-table-k6 TP_ARGS="$S --K 6 --budget-s 180 $ALL" T=$(( $(left) - 60 )) bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
[ $(left) -gt 40 ] && GTN=-tests K="tests/gpu/test_attn_gpu.py tests/gpu/test_parallax_prologue_gpu.py tests/gpu/test_fftconv_gpu.py" \
  T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh gputests
[ $(left) -gt 100 ] && TPN=-table-k3 TP_ARGS="$S --K 3 --budget-s $(( $(left) - 40 )) $ALL" T=$(( $(left) - 15 )) \
  bash scripts/gpu-zoo.sh tput
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked|\| all" $f | head -n 40; done
grep -h -E "passed|failed|^FAILED|^ERROR|B=" logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
