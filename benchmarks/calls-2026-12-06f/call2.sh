# session 2026-12-06f call 2. Call 1 (H100) timed softmax with the attention strides aligned 1.08-1.13x the step at every
# MAD length (now the default) and LLA at 512 and 1024 with its heads at their width (VEC loads) 1.01-1.05x the padded
# copies. Now: LLA's three ways at all four lengths, back to back, each in its own process; the eight at today's
# defaults (LLA padded), stacked+graphed K = 6, for the projection table; the GPU tests not yet run on a GPU (Hyena's
# fftconv operator, the qkv prologue) and those of the new attention default; then K = 3 with the time left.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-570} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
git log -1 --format=%h 2>/dev/null
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
for m in contiguous padded; do
  MIXZOO_LLA_HEADS=$m TPN=-lla-$m TP_ARGS="$S --K 6 lla" T=70 bash scripts/gpu-zoo.sh tput
done
MIXZOO_LLA_HEADS=strided MIXZOO_QKV_PROLOGUE=fused TPN=-lla-strided-prologue TP_ARGS="$S --K 6 lla" T=70 \
  bash scripts/gpu-zoo.sh tput
echo "== table at $(date +%T), left $(left)"
ALL="softmax gdn gla mesa lla parallax mamba hyena"
TPN=-table-k6 TP_ARGS="$S --K 6 --budget-s 200 $ALL" T=230 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-tests K="tests/gpu/test_attn_gpu.py tests/gpu/test_parallax_prologue_gpu.py tests/gpu/test_fftconv_gpu.py" \
  T=$(( $(left) > 200 ? 150 : $(left) - 40 )) bash scripts/gpu-zoo.sh gputests
[ $(left) -gt 80 ] && GTN=-tput-softmax KEXPR=softmax K=tests/gpu/test_throughput_gpu.py T=$(( $(left) - 30 )) \
  bash scripts/gpu-zoo.sh gputests
[ $(left) -gt 100 ] && TPN=-table-k3 TP_ARGS="$S --K 3 --budget-s $(( $(left) - 40 )) $ALL" T=$(( $(left) - 15 )) \
  bash scripts/gpu-zoo.sh tput
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked|\| all" $f | head -n 40; done
grep -h -E "passed|failed|^FAILED|^ERROR|B=" logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
