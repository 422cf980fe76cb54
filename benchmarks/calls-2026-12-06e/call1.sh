# session 2026-12-06e call 1: the eight mechanisms with the current defaults (Parallax unpadded with its prologue kernel
# since 9d19dd9) at MAD's lengths, K = 6, the floor, then K = 3 (benchmarks/calls-2026-12-06c/call2.sh), on whatever
# card is lent, to replace the README's table for that card; then, if time is left, the FFT convolution's GPU tests
# (4ccf29d changed how its backward gets the FFT norm and they have not run since).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
BUDGET=${BUDGET:-560} bash benchmarks/calls-2026-12-06c/call2.sh
export END=$(( $(date +%s) + ${TESTS:-0} ))
if [ "${TESTS:-0}" -gt 60 ]; then
  GTN=-fftconv K=tests/gpu/test_fftconv_gpu.py T=$(( TESTS - 10 )) bash scripts/gpu-zoo.sh gputests
  tail -n 5 logs/gputests-fftconv.log
fi
