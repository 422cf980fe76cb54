# session 2026-12-07b call 1 on whatever card comes (the H200 did not start three times): the two side-by-side
# comparisons of call1.sh and call2.sh, then their GPU tests, then what fits.
# 1. Hyena stacked+graphed K = 6 at 128 and 256 with its Toeplitz products in fp32 and in bf16x3 (call2.sh).
# 2. gdn, GLA and MesaNet with the gated output norm as one kernel (MIXZOO_GATED_NORM=fused) and as the default
#    (torch), stacked+graphed K = 6 at MAD's four lengths (call1.sh).
# 3. GPU tests: Hyena's fftconv (bf16x3 against float64, timed) and the gated norm's kernel.
# 4. The training tests (graphed against eager, stacked against separate runs) of gdn, GLA, MesaNet with the fused
#    norm and of Hyena with bf16x3; then, with the time left, the floor and the eight at lengths 32 and 64 (MAD's
#    compression and memorization settings, so far scaled down from 128 in the projection). Each configuration in its
#    own process, back to back. BUDGET: seconds for it all.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_HYENA_TOEPLITZ_MM=fp32 TPN=-hyena-fp32 TP_ARGS="--shape mad,mad256 $S hyena" T=70 bash scripts/gpu-zoo.sh tput
MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 TPN=-hyena-bf16x3 TP_ARGS="--shape mad,mad256 $S hyena" T=70 bash scripts/gpu-zoo.sh tput
S4="--shape mad,mad256,mad512,mad1024 $S"
MIXZOO_GATED_NORM=fused TPN=-gated-fused TP_ARGS="$S4 gdn gla mesa" T=110 bash scripts/gpu-zoo.sh tput
MIXZOO_GATED_NORM=torch TPN=-gated-torch TP_ARGS="$S4 gdn gla mesa" T=110 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-tests K="tests/gpu/test_fftconv_gpu.py tests/gpu/test_fused_kernels_gpu.py" KEXPR="bf16x3 or gate_after or norms_take" \
  T=90 bash scripts/gpu-zoo.sh gputests
echo "== training tests at $(date +%T), left $(left)"
[ $(left) -gt 60 ] && MIXZOO_GATED_NORM=fused MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 GTN=-training KEXPR="gdn or gla or mesa or hyena" \
  K=tests/gpu/test_throughput_gpu.py T=$(( $(left) > 200 ? 150 : $(left) - 40 )) bash scripts/gpu-zoo.sh gputests
echo "== short lengths at $(date +%T), left $(left)"
[ $(left) -gt 60 ] && TPN=-short-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py --shape mad32,mad64 $S \
  --budget-s $(( $(left) - 45 )) floor softmax gdn gla mesa lla parallax mamba hyena" T=$(( $(left) - 12 )) \
  bash scripts/gpu-zoo.sh tput
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 12; done
grep -h -E "passed|failed|^FAILED|^ERROR|bf16x3|fp32 " logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
