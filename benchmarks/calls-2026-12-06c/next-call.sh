# planned, not run on 2026-12-06 (session c: every call was lent an H100 and the device time ran out): the eight with
# the current defaults on an H200, K = 6, the floor, then K = 3 (call2.sh without GLA's unpadded try, which fla refuses),
# to replace the README's H200 table (commit 51ec073). Then:
#   mixzoo bench throughput --project logs/throughput-table-k6.json logs/throughput-table-k3.json --protocol settings
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-575} ))
left() { echo $(( END - $(date +%s) )); }
S="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed"
ALL="softmax gdn gla mesa lla parallax mamba hyena"
TPN=-table-k6 TP_ARGS="$S --K 6 --budget-s 300 $ALL" T=330 bash scripts/gpu-zoo.sh tput
TPN=-floor-k6 TP_ARGS="--plugin benchmarks/floor_mixer.py $S --K 6 floor" T=60 bash scripts/gpu-zoo.sh tput
TPN=-table-k3 TP_ARGS="$S --K 3 --budget-s $(( $(left) - 40 )) $ALL" T=$(( $(left) - 15 )) bash scripts/gpu-zoo.sh tput
for f in logs/throughput-*.md; do echo "== $f"; tail -n 16 $f; done
echo "== end $(date +%T), left $(left)"
