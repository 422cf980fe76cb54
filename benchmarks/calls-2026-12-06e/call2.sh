# session 2026-12-06e call 2: LLA's and softmax attention's stacked+graphed K = 6 training step at MAD's baseline and
# its lengths 256 to 1024, back to back, each configuration in its own process: the defaults now (LLA's kernels read
# the heads of 8 through their strides, unpadded, and write (B, T, H, D); q, k, v of both made by the prologue kernel
# without r) against before (MIXZOO_LLA_HEADS=padded MIXZOO_QKV_PROLOGUE=torch); the GPU tests of LLA's kernels and of
# the prologue; then, with time left, LLA's strided heads alone (MIXZOO_QKV_PROLOGUE=torch) and the stacked and graphed
# training tests of LLA and softmax.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-570} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
TPN=-lla-new TP_ARGS="$S lla" T=120 bash scripts/gpu-zoo.sh tput
MIXZOO_LLA_HEADS=padded MIXZOO_QKV_PROLOGUE=torch TPN=-lla-before TP_ARGS="$S lla" T=120 bash scripts/gpu-zoo.sh tput
TPN=-softmax-new TP_ARGS="$S softmax" T=80 bash scripts/gpu-zoo.sh tput
MIXZOO_QKV_PROLOGUE=torch TPN=-softmax-before TP_ARGS="$S softmax" T=80 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-lla KEXPR="strided or direct or mechanism or bf16_small" K="tests/gpu/test_lla_kernel.py tests/gpu/test_parallax_prologue_gpu.py" \
  T=$(( $(left) > 150 ? 130 : $(left) - 20 )) bash scripts/gpu-zoo.sh gputests
[ $(left) -gt 100 ] && MIXZOO_QKV_PROLOGUE=torch TPN=-lla-strided-only TP_ARGS="$S lla" \
  T=$(( $(left) > 130 ? 100 : $(left) - 20 )) bash scripts/gpu-zoo.sh tput
[ $(left) -gt 60 ] && GTN=-training KEXPR="lla or softmax" K=tests/gpu/test_throughput_gpu.py \
  T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-*.md; do echo "== $f"; grep -E "^\| (mad|lla|softmax)|model-steps" $f | head -n 8; done
grep -h -E "passed|failed|^PASSED|^FAILED|^ERROR|lla B=|prologue|softmax" logs/gputests-*.log | tail -n 60
echo "== end $(date +%T), left $(left)"
