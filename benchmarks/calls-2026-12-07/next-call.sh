# planned for the next session's first device call (not run: the 2026-12-07 session's device starts failed after call 2
# until its device time was spent). The gated output norm of gdn, GLA and MesaNet (the norm, then times silu of the gate)
# as one kernel each way (mixzoo.kernels.rmsnorm.rms_norm_gate, MIXZOO_GATED_NORM=fused) against the default, the norm's
# kernel followed by PyTorch's silu, product and cast (MIXZOO_GATED_NORM=torch): the three mechanisms' stacked+graphed
# K = 6 steps at MAD's four lengths, each configuration in its own process, back to back; then the GPU tests of the
# kernel (against float64, folding, timed in the layer) and the three mechanisms' training tests (graphed against
# eager, stacked against separate runs) with it. If it wins, make "fused" GATED_NORM[0] (mixzoo/kernels/__init__.py).
# Then, on an H200 and with the time left, the floor and K = 3. BUDGET: seconds for it all (560 fits one call).
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_GATED_NORM=fused TPN=-gated-fused TP_ARGS="$S gdn gla mesa" T=120 bash scripts/gpu-zoo.sh tput
MIXZOO_GATED_NORM=torch TPN=-gated-torch TP_ARGS="$S gdn gla mesa" T=120 bash scripts/gpu-zoo.sh tput
echo "== tests at $(date +%T), left $(left)"
GTN=-gated K=tests/gpu/test_fused_kernels_gpu.py KEXPR="gate_after or norms_take" T=60 bash scripts/gpu-zoo.sh gputests
[ $(left) -gt 60 ] && MIXZOO_GATED_NORM=fused GTN=-training KEXPR="gdn or gla or mesa" K=tests/gpu/test_throughput_gpu.py T=$(( $(left) - 20 )) \
  bash scripts/gpu-zoo.sh gputests
# on an H200 (the card of the K = 6 table of calls-2026-12-06f/call2), with what is left: the floor, then the eight at
# K = 3 (the sweep column of the projection), neither measured on an H200 since 51ec073
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" in *H200*)
  S4="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
  [ $(left) -gt 80 ] && TPN=-floor-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py $S4 --K 6 floor" T=60 \
    bash scripts/gpu-zoo.sh tput
  [ $(left) -gt 100 ] && TPN=-table-k3 TP_ARGS="$S4 --K 3 --budget-s $(( $(left) - 40 )) softmax gdn gla mesa lla parallax mamba hyena" \
    T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh tput ;;
esac
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 20; done
grep -h -E "passed|failed|^FAILED|^ERROR|rms_norm_gate|GatedNorm" logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
