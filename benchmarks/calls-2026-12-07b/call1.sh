# session 2026-12-07b call 1 (what 2026-12-07's next-call.sh planned, then the protocol's short lengths).
# 1. The gated output norm of gdn, GLA and MesaNet as one kernel each way (MIXZOO_GATED_NORM=fused) against the
#    default (the norm's kernel, then PyTorch's silu, product and cast: MIXZOO_GATED_NORM=torch), stacked+graphed K = 6
#    at MAD's four lengths, each configuration in its own process, back to back.
# 2. The kernel's GPU tests, then the three mechanisms' training tests with it (graphed against eager, stacked
#    against separate runs).
# 3. The eight and the floor at lengths 32 and 64 (MAD's compression and memorization settings), stacked+graphed K = 6:
#    the projection has scaled the baseline's step time down in length there, which a launch-bound step does not do.
# BUDGET: seconds for it all.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_GATED_NORM=fused TPN=-gated-fused TP_ARGS="$S gdn gla mesa" T=120 bash scripts/gpu-zoo.sh tput
MIXZOO_GATED_NORM=torch TPN=-gated-torch TP_ARGS="$S gdn gla mesa" T=120 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-gated K=tests/gpu/test_fused_kernels_gpu.py KEXPR="gate_after or norms_take" T=60 bash scripts/gpu-zoo.sh gputests
echo "== short lengths at $(date +%T), left $(left)"
ALL="softmax gdn gla mesa lla parallax mamba hyena"
[ $(left) -gt 100 ] && TPN=-short-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py --shape mad32,mad64 --steps 30 --warmup 10 \
  --procs= --modes stacked+graphed --K 6 --budget-s $(( $(left) - 130 )) floor $ALL" T=$(( $(left) - 100 )) \
  bash scripts/gpu-zoo.sh tput
echo "== training tests at $(date +%T), left $(left)"
[ $(left) -gt 50 ] && MIXZOO_GATED_NORM=fused GTN=-training KEXPR="gdn or gla or mesa" K=tests/gpu/test_throughput_gpu.py \
  T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 24; done
grep -h -E "passed|failed|^FAILED|^ERROR|rms_norm_gate|GatedNorm" logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
