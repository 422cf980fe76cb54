# session 2026-12-07b: the one short call the device time left allows (every start before it failed). Side by side,
# each configuration in its own process: Hyena stacked+graphed K = 6 at 128 and 256, its Toeplitz products in fp32
# and in bf16x3; then the two new kernels' GPU tests (bf16x3 against float64, timed; the gated norm's kernel); then, if
# time is left, gdn, GLA and MesaNet with the gated norm fused against torch at 128 and 1024. BUDGET: seconds.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-300} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_HYENA_TOEPLITZ_MM=fp32 TPN=-hyena-fp32 TP_ARGS="--shape mad,mad256 $S hyena" T=60 bash scripts/gpu-zoo.sh tput
MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 TPN=-hyena-bf16x3 TP_ARGS="--shape mad,mad256 $S hyena" T=60 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
[ $(left) -gt 50 ] && GTN=-tests K="tests/gpu/test_fftconv_gpu.py tests/gpu/test_fused_kernels_gpu.py" \
  KEXPR="bf16x3 or gate_after or norms_take" T=$(( $(left) > 110 ? 80 : $(left) - 20 )) bash scripts/gpu-zoo.sh gputests
echo "== gated at $(date +%T), left $(left)"
[ $(left) -gt 100 ] && MIXZOO_GATED_NORM=fused TPN=-gated-fused TP_ARGS="--shape mad,mad1024 $S gdn gla mesa" \
  T=$(( $(left) / 2 - 5 )) bash scripts/gpu-zoo.sh tput
[ $(left) -gt 40 ] && [ -f logs/throughput-gated-fused.json ] && MIXZOO_GATED_NORM=torch TPN=-gated-torch \
  TP_ARGS="--shape mad,mad1024 $S gdn gla mesa" T=$(( $(left) - 10 )) bash scripts/gpu-zoo.sh tput
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 12; done
grep -h -E "passed|failed|^FAILED|^ERROR|bf16x3|fp32 " logs/gputests-*.log | tail -n 20
echo "== end $(date +%T), left $(left)"
