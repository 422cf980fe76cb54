# session 2026-12-07b call 1 on whatever card comes (the H200 did not start three times): the two side-by-side
# comparisons of call1.sh and call2.sh, then their GPU tests, then what fits.
# 1. Hyena stacked+graphed K = 6 at 128 and 256 with its Toeplitz products in fp32 and in bf16x3 (call2.sh).
# 2. gdn, GLA and MesaNet with the gated output norm as one kernel (MIXZOO_GATED_NORM=fused) and as the default
#    (torch), stacked+graphed K = 6 at MAD's four lengths (call1.sh).
# 3. GPU tests: Hyena's fftconv (bf16x3 against float64, timed) and the gated norm's kernel.
# 4. With the time left: Hyena at 512 and 1024 on Toeplitz products in bf16x3 against the FFTs; the training tests
#    (graphed against eager, stacked against separate runs) of gdn, GLA, MesaNet with the fused norm and of Hyena with
#    bf16x3. Each configuration in its own process, back to back. BUDGET: seconds for it all.
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
[ $(left) -gt 130 ] && TPN=-hyena-fft TP_ARGS="--shape mad512,mad1024 $S hyena" T=50 bash scripts/gpu-zoo.sh tput
[ $(left) -gt 100 ] && MIXZOO_HYENA_PATH=toeplitz MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 TPN=-hyena-toeplitz-bf16x3 \
  TP_ARGS="--shape mad512,mad1024 $S hyena" T=60 bash scripts/gpu-zoo.sh tput
echo "== training tests at $(date +%T), left $(left)"
[ $(left) -gt 40 ] && MIXZOO_GATED_NORM=fused MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 GTN=-training \
  KEXPR="gdn or gla or mesa or hyena" K=tests/gpu/test_throughput_gpu.py T=$(( $(left) - 12 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 12; done
grep -h -E "passed|failed|^FAILED|^ERROR|bf16x3|fp32 " logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
