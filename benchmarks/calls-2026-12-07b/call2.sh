# session 2026-12-07b call 2: Hyena's Toeplitz products on tensor cores. Its long convolution up to length 256 is a
# product with each channel's causal Toeplitz matrix, so far in float32 on CUDA cores (FFMA GEMMs, 13 % of its
# stacked step at 128 on an H100). MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 splits each float32 operand into bf16 hi + lo and
# sums hi·hi + hi·lo + lo·hi in bf16 tensor-core GEMMs with float32 output (about 2^-16 relative a product).
# 1. Hyena stacked+graphed K = 6 at 128 and 256, fp32 against bf16x3, each in its own process, back to back; and at
#    512 and 1024 the Toeplitz path (MIXZOO_HYENA_PATH=toeplitz) in bf16x3 against the FFTs (the default there).
# 2. The GPU tests: tests/gpu/test_fftconv_gpu.py (bf16x3 against float64, timed), then Hyena's training tests
#    (graphed against eager, stacked against separate runs) with bf16x3.
# BUDGET: seconds for it all.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_HYENA_TOEPLITZ_MM=fp32 TPN=-hyena-fp32 TP_ARGS="--shape mad,mad256 $S hyena" T=70 bash scripts/gpu-zoo.sh tput
MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 TPN=-hyena-bf16x3 TP_ARGS="--shape mad,mad256 $S hyena" T=70 bash scripts/gpu-zoo.sh tput
TPN=-hyena-fft TP_ARGS="--shape mad512,mad1024 $S hyena" T=70 bash scripts/gpu-zoo.sh tput
MIXZOO_HYENA_PATH=toeplitz MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 TPN=-hyena-toeplitz-bf16x3 TP_ARGS="--shape mad512,mad1024 $S hyena" \
  T=90 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-fftconv K=tests/gpu/test_fftconv_gpu.py T=90 bash scripts/gpu-zoo.sh gputests
[ $(left) -gt 50 ] && MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 GTN=-training KEXPR="hyena" K=tests/gpu/test_throughput_gpu.py \
  T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 12; done
grep -h -E "passed|failed|^FAILED|^ERROR|bf16x3|fp32" logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
