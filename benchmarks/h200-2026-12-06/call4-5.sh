# session 2026-12-06b calls 4 and 5 (the H200 of call 3, still warm): the eight mechanisms with the current defaults,
# stacked+graphed K = 6 (call 4) and K = 3 (call 5), at MAD's baseline and its lengths 256 to 1024, one machine; and the
# cost floor (benchmarks/floor_mixer.py) at K = 6 after the K = 6 table.
export END=$(( $(date +%s) + 590 ))
TPN=-table-h200 TP_ARGS="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6 --budget-s 470 softmax gdn gla mesa lla parallax mamba hyena" T=540 bash scripts/gpu-zoo.sh tput
TPN=-floor-h200 TP_ARGS="--plugin benchmarks/floor_mixer.py --shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6 floor" T=$(( END - $(date +%s) - 5 )) bash scripts/gpu-zoo.sh tput
# call 5
TPN=-table-h200-k3 TP_ARGS="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 3 --budget-s 250 softmax gdn gla mesa lla parallax mamba hyena" T=330 bash scripts/gpu-zoo.sh tput
