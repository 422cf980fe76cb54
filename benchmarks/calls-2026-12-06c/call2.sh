# session 2026-12-06c call 2: the eight mechanisms with the current defaults (Hyena channels-first, LLA's explicit solve
# capped at precision level 1), stacked+graphed K = 6, then the cost floor (benchmarks/floor_mixer.py) at K = 6, then
# K = 3, at MAD's baseline and its lengths 256 to 1024, one machine; then GLA's fla path unpadded if time is left.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-575} ))
left() { echo $(( END - $(date +%s) )); }
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
ALL="softmax gdn gla mesa lla parallax mamba hyena"
TPN=-table-k6 TP_ARGS="$S --K 6 --budget-s 300 $ALL" T=330 bash scripts/gpu-zoo.sh tput
TPN=-floor-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py $S --K 6 floor" T=60 bash scripts/gpu-zoo.sh tput
TPN=-table-k3 TP_ARGS="$S --K 3 --budget-s $(( $(left) - 40 )) $ALL" T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh tput
[ $(left) -gt 60 ] && SCRIPT_ARGS="--mixers gla --variants 16,none --T 256,1024 --out logs/fla-unpadded-gla.json" \
  T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh script:benchmarks/fla_unpadded.py
for f in logs/throughput-*.md; do echo "== $f"; tail -n 16 $f; done
echo "== end $(date +%T), left $(left)"
