# session 2026-12-07c call 2 (after calls-2026-12-07b/next-call.sh): where the stacked+graphed K = 6 step goes at
# length 128, per kernel and by source line, for the cost floor (eight times its row is 16.0 of the 45.3 projected
# hours) and the five mechanisms furthest above it; the 2026-12-07 profile at 128 stopped after Hyena and Mamba-2.
# Then, on an H200 and with the time left, the eight at K = 3 (the sweep's seeds) at MAD's four lengths.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "$card"
P="--stacked 6 --graphed --steps 3 --warmup 4 --top 25 --by-source --shape mad"
SCRIPT_ARGS="$P --plugin benchmarks/floor_mixer.py --mixers floor,lla,mesa --out logs/profile-128a" T=150 \
  bash scripts/gpu-zoo.sh script:benchmarks/profile_step.py
SCRIPT_ARGS="$P --mixers mamba,parallax,hyena --out logs/profile-128b" T=$(( $(left) > 300 ? 150 : $(left) - 30 )) \
  bash scripts/gpu-zoo.sh script:benchmarks/profile_step.py
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
case "$card" in *H200*) [ $(left) -gt 100 ] && TPN=-table-k3 TP_ARGS="$S --K 3 --budget-s $(( $(left) - 40 )) \
  softmax gdn gla mesa lla parallax mamba hyena" T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh tput ;; esac
grep -h -E "busy|^### " logs/profile-128*/profile_step.md | head -n 40
for f in logs/throughput-*.md; do echo "== $f"; grep -E "stacked|\| all" $f | head -n 40; done
echo "== end $(date +%T), left $(left)"
