# session 2026-12-07 call 1: what the 2026-12-06f calls left unmeasured, then where the slow mechanisms' steps go.
# 1. The training tests with today's defaults for softmax (aligned attention strides) and LLA (heads strided from the
#    qkv prologue): graphed against eager, stacked and stacked+graphed against separate runs, Muon.
# 2. The cost floor at this commit, stacked+graphed K = 6 at MAD's four lengths.
# 3. Per-kernel profiles of the stacked+graphed K = 6 step at lengths 128 and 1024 for the mechanisms with the most
#    device-hours above the floor (LLA, MesaNet, Mamba-2, Hyena, Parallax), by source line.
# 4. On an H200 only (the card of the K = 6 table it pairs with, calls-2026-12-06f/call2), the eight at K = 3, the
#    sweep column of the projection. BUDGET: seconds for it all.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { echo $(( END - $(date +%s) )); }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "$card"
GTN=-training KEXPR="lla or softmax" K=tests/gpu/test_throughput_gpu.py T=150 bash scripts/gpu-zoo.sh gputests
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
TPN=-floor-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py $S --K 6 floor" T=60 bash scripts/gpu-zoo.sh tput
echo "== profiles at $(date +%T), left $(left)"
P="--mixers hyena,mamba,mesa,parallax,lla --stacked 6 --graphed --steps 3 --warmup 4 --top 25 --by-source"
SCRIPT_ARGS="$P --shape mad1024 --out logs/profile-1024" T=110 bash scripts/gpu-zoo.sh script:benchmarks/profile_step.py
SCRIPT_ARGS="$P --shape mad --out logs/profile-128" T=70 bash scripts/gpu-zoo.sh script:benchmarks/profile_step.py
ALL="softmax gdn gla mesa lla parallax mamba hyena"
case "$card" in *H200*) [ $(left) -gt 100 ] && TPN=-table-k3 TP_ARGS="$S --K 3 --budget-s $(( $(left) - 40 )) $ALL" \
  T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh tput ;; esac
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked|\| all" $f | head -n 40; done
grep -h -E "busy|^### " logs/profile-*/profile_step.md | head -n 40
grep -h -E "passed|failed|^FAILED|^ERROR" logs/gputests-*.log | tail -n 30
echo "== end $(date +%T), left $(left)"
