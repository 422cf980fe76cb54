# session 2026-12-06d call 1: on an H200, the eight with the current defaults at MAD's lengths (K = 6, the floor,
# K = 3: benchmarks/calls-2026-12-06c/call2.sh), to replace the README's H200 table (commit 51ec073); on any other
# card, the GPU tests of the FFT convolution at the current commit (4ccf29d changed how the backward gets its norm).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
if [[ "$gpu" == *H200* ]]; then
  BUDGET=${BUDGET:-575} bash benchmarks/calls-2026-12-06c/call2.sh
else
  export END=$(( $(date +%s) + ${BUDGET:-300} ))
  GTN=-fftconv K=tests/gpu/test_fftconv_gpu.py T=240 bash scripts/gpu-zoo.sh gputests
  tail -n 5 logs/gputests-fftconv.log
fi
