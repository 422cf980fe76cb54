# session 2026-12-07c call 1: the call session 2026-12-07b planned (its next-call.sh, which this file replaces; not run
# then: no device start) with Mamba-2's heads-fold gradients (MIXZOO_FOLD_HEADS_GRAD) added after step 1. In order of
# what decides a default:
# 1. Hyena stacked+graphed K = 6 at 128 and 256 with its Toeplitz products in fp32 (the default) and in bf16x3
#    (MIXZOO_HYENA_TOEPLITZ_MM=bf16x3: bf16 hi + lo tensor-core GEMMs with float32 output).
# 2. The GPU tests of the two kernels not yet run on a GPU: bf16x3 against float64 at MAD's stacked shape (and its
#    timing against fp32), the gated output norm's kernel (MIXZOO_GATED_NORM=fused).
# 3. gdn, GLA and MesaNet with the gated norm fused against torch (the default), stacked+graphed K = 6 at the four
#    lengths.
# 4. The training tests (graphed against eager, stacked against separate runs) of gdn, GLA, MesaNet with the fused
#    norm and of Hyena with bf16x3.
# 5. On an H200 (the card of the projection's table), with the time left: the floor and the eight at lengths 32 and
#    64 (MAD's compression and memorization settings; the projection extrapolates them from 128 and 256).
# Each configuration in its own process, back to back. If a new form wins and its tests pass, make it the first value
# of its switch (mixzoo/kernels/__init__.py: GATED_NORM, HYENA_TOEPLITZ_MM; for bf16x3 tests/test_stacked.py's Hyena
# weight bound, 2e-4, measured 2.8e-4 with it on the CPU: see the 2026-12-07b log). BUDGET: seconds for it all.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "$card"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_HYENA_TOEPLITZ_MM=fp32 TPN=-hyena-fp32 TP_ARGS="--shape mad,mad256 $S hyena" T=60 bash scripts/gpu-zoo.sh tput
MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 TPN=-hyena-bf16x3 TP_ARGS="--shape mad,mad256 $S hyena" T=60 bash scripts/gpu-zoo.sh tput
for g in views contiguous; do
  MIXZOO_FOLD_HEADS_GRAD=$g TPN=-mamba-$g TP_ARGS="--shape mad,mad256 $S mamba" T=60 bash scripts/gpu-zoo.sh tput
done
echo "== tests at $(date +%T), left $(left)"
GTN=-tests K="tests/gpu/test_fftconv_gpu.py tests/gpu/test_fused_kernels_gpu.py" KEXPR="bf16x3 or gate_after or norms_take" \
  T=90 bash scripts/gpu-zoo.sh gputests
S4="--shape mad,mad256,mad512,mad1024 $S"
[ $(left) -gt 200 ] && MIXZOO_GATED_NORM=fused TPN=-gated-fused TP_ARGS="$S4 gdn gla mesa" T=100 bash scripts/gpu-zoo.sh tput
[ $(left) -gt 100 ] && [ -f logs/throughput-gated-fused.json ] && MIXZOO_GATED_NORM=torch TPN=-gated-torch \
  TP_ARGS="$S4 gdn gla mesa" T=100 bash scripts/gpu-zoo.sh tput
echo "== training tests at $(date +%T), left $(left)"
[ $(left) -gt 60 ] && MIXZOO_GATED_NORM=fused MIXZOO_HYENA_TOEPLITZ_MM=bf16x3 MIXZOO_FOLD_HEADS_GRAD=contiguous GTN=-training \
  KEXPR="gdn or gla or mesa or hyena or mamba" \
  K=tests/gpu/test_throughput_gpu.py T=$(( $(left) > 200 ? 150 : $(left) - 40 )) bash scripts/gpu-zoo.sh gputests
echo "== short lengths at $(date +%T), left $(left)"
case "$card" in *H200*)
  [ $(left) -gt 60 ] && TPN=-short-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py --shape mad32,mad64 $S \
    --budget-s $(( $(left) - 45 )) floor softmax gdn gla mesa lla parallax mamba hyena" T=$(( $(left) - 12 )) \
    bash scripts/gpu-zoo.sh tput ;;
esac
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 12; done
grep -h -E "passed|failed|^FAILED|^ERROR|bf16x3|fp32 " logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
