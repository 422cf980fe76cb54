# session 2026-12-06d call 2: Parallax's heads of 8 handed to the kernels unpadded (the default now) against padded
# in memory (MIXZOO_FLA_PAD=16), stacked+graphed K = 6 at MAD's baseline and its lengths 256 to 1024, back to back,
# each in its own process; then the GPU tests of the Parallax kernels (bit equality of the two) and of the FFT
# convolution (4ccf29d).
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_FLA_PAD=none TPN=-parallax-unpadded TP_ARGS="$S parallax" T=120 bash scripts/gpu-zoo.sh tput
MIXZOO_FLA_PAD=16 TPN=-parallax-padded TP_ARGS="$S parallax" T=120 bash scripts/gpu-zoo.sh tput
GTN=-parallax-fftconv K="tests/gpu/test_parallax_tiles_gpu.py tests/gpu/test_fftconv_gpu.py" \
  T=$(( $(left) - 20 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-parallax-*.md; do echo "== $f"; tail -n 8 $f; done
grep -E "passed|failed|^PASSED|^FAILED|parallax B=" logs/gputests-parallax-fftconv.log | tail -n 40
echo "== end $(date +%T), left $(left)"
