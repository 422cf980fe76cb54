# session 2026-12-06d call 2: Parallax's stacked+graphed K = 6 training step at MAD's baseline and its lengths 256 to
# 1024, back to back, each in its own process: the defaults now (heads of 8 handed to the kernels unpadded, the
# prologue as one kernel each way) and both as before (MIXZOO_PARALLAX_PROLOGUE=torch MIXZOO_FLA_PAD=16); the GPU tests
# of the prologue and of Parallax's kernels; then, with time left, the prologue as the separate ops alone
# (MIXZOO_PARALLAX_PROLOGUE=torch) and the stacked and graphed training tests of Parallax.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-570} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_PARALLAX_PROLOGUE=fused MIXZOO_FLA_PAD=none TPN=-parallax-new TP_ARGS="$S parallax" T=110 bash scripts/gpu-zoo.sh tput
MIXZOO_PARALLAX_PROLOGUE=torch MIXZOO_FLA_PAD=16 TPN=-parallax-defaults TP_ARGS="$S parallax" T=110 \
  bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-parallax K="tests/gpu/test_parallax_prologue_gpu.py tests/gpu/test_parallax_tiles_gpu.py" \
  T=$(( $(left) > 130 ? 110 : $(left) - 20 )) bash scripts/gpu-zoo.sh gputests
[ $(left) -gt 100 ] && MIXZOO_PARALLAX_PROLOGUE=torch MIXZOO_FLA_PAD=none TPN=-parallax-unpadded-only TP_ARGS="$S parallax" \
  T=$(( $(left) - 20 )) bash scripts/gpu-zoo.sh tput
[ $(left) -gt 60 ] && MIXZOO_PARALLAX_PROLOGUE=fused MIXZOO_FLA_PAD=none GTN=-parallax-training KEXPR=parallax K=tests/gpu/test_throughput_gpu.py \
  T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-parallax-*.md; do echo "== $f"; grep -E "^\| (mad|parallax)|model-steps" $f | head -n 8; done
grep -h -E "passed|failed|^PASSED|^FAILED|^ERROR|prologue B=|parallax B=|parallax layer" logs/gputests-parallax*.log | tail -n 60
echo "== end $(date +%T), left $(left)"
