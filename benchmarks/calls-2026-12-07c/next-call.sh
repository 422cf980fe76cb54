# the next device call (planned in session 2026-12-07c; benchmarks/calls-2026-12-07d/call2.sh is the one after it).
# In order:
# 1. On an H200 (the card of the README's projection): gdn, GLA and MesaNet at MAD's four lengths with today's default
#    gated norm (fused since 2026-12-07c, timed on an H100 only), for the projection's rows; then the cost floor and the
#    eight at lengths 32 and 64 (MAD's compression and memorization settings, extrapolated so far).
# 2. Mamba-2's heads-fold gradients, MIXZOO_FOLD_HEADS_GRAD=views against contiguous at 128 and 256, after a short
#    warm-up run that compiles mamba-ssm's kernels (in 2026-12-07c the first process spent its 60 s compiling).
# 3. Per-kernel profiles of the stacked+graphed K = 6 step at 128 by source line: the cost floor, LLA, MesaNet, then
#    Mamba-2, Parallax, Hyena.
# 4. On an H200 with the time left: the eight at K = 3 (the sweep's seeds). BUDGET: seconds for it all.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "$card"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
case "$card" in *H200*)
  TPN=-gated-k6 TP_ARGS="--shape mad,mad256,mad512,mad1024 $S gdn gla mesa" T=150 bash scripts/gpu-zoo.sh tput
  TPN=-short-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py --shape mad32,mad64 $S \
    floor softmax gdn gla mesa lla parallax mamba hyena" T=120 bash scripts/gpu-zoo.sh tput ;;
esac
TPN=-mamba-warm TP_ARGS="--shape mad,mad256 --steps 3 --warmup 2 --procs= --modes stacked+graphed --K 6 mamba" T=120 \
  bash scripts/gpu-zoo.sh tput
for g in views contiguous; do
  [ $(left) -gt 100 ] && MIXZOO_FOLD_HEADS_GRAD=$g TPN=-mamba-$g TP_ARGS="--shape mad,mad256 $S mamba" T=70 \
    bash scripts/gpu-zoo.sh tput
done
P="--stacked 6 --graphed --steps 3 --warmup 4 --top 25 --by-source --shape mad"
[ $(left) -gt 120 ] && SCRIPT_ARGS="$P --plugin benchmarks/floor_mixer.py --mixers floor,lla,mesa --out logs/profile-128a" \
  T=$(( $(left) > 300 ? 150 : $(left) - 30 )) bash scripts/gpu-zoo.sh script:benchmarks/profile_step.py
[ $(left) -gt 120 ] && SCRIPT_ARGS="$P --mixers mamba,parallax,hyena --out logs/profile-128b" \
  T=$(( $(left) > 300 ? 150 : $(left) - 30 )) bash scripts/gpu-zoo.sh script:benchmarks/profile_step.py
case "$card" in *H200*) [ $(left) -gt 100 ] && TPN=-table-k3 TP_ARGS="--shape mad,mad256,mad512,mad1024 \
  --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 3 --budget-s $(( $(left) - 40 )) \
  softmax gdn gla mesa lla parallax mamba hyena" T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh tput ;; esac
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 40; done
grep -h -E "busy|^### " logs/profile-128*/profile_step.md | head -n 40
echo "== end $(date +%T), left $(left)"
