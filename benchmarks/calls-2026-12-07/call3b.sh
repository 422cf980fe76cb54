# session 2026-12-07 call 3b: call3.sh cut to the device time left (four device starts failed before it): the gated output
# norm as one kernel (the default) against MIXZOO_GATED_NORM=torch, gdn, GLA and MesaNet stacked+graphed K = 6 at
# lengths 128 and 1024, each configuration in its own process, back to back; then the kernel's GPU tests.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-150} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
TPN=-gated-fused TP_ARGS="$S gdn gla mesa" T=55 bash scripts/gpu-zoo.sh tput
MIXZOO_GATED_NORM=torch TPN=-gated-torch TP_ARGS="$S gdn gla mesa" T=55 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
[ $(left) -gt 25 ] && GTN=-gated K=tests/gpu/test_fused_kernels_gpu.py KEXPR="gate_after or norms_take" \
  T=$(( $(left) - 5 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 20; done
grep -h -E "passed|failed|^FAILED|^ERROR|rms_norm_gate|GatedNorm" logs/gputests-*.log | tail -n 20
echo "== end $(date +%T), left $(left)"
