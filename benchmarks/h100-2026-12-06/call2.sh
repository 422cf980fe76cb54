# session 2026-12-06 call 2: the projection table with the current defaults, one machine; then GPU tests
set -o pipefail
export END=$(( $(date +%s) + 565 ))
left() { echo $(( END - $(date +%s) )); }
go() { local need=$1; shift; if [ $(left) -gt $need ]; then echo "== $(date +%T) $*"; "$@"; else echo "== skipped (time): $*"; fi; }
Z="bash scripts/gpu-zoo.sh"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed"
go 300 env TPN=-table TP_ARGS="--shape mad,mad256,mad512,mad1024 $S --K 6,3 softmax gdn gla mesa lla parallax mamba hyena" T=$(( $(left) - 200 )) $Z tput
go 150 env TPN=-mesa-pad16 MIXZOO_FLA_PAD=16 TP_ARGS="--shape mad,mad1024 $S --K 6 mesa" T=60 $Z tput
go 100 env K=tests/gpu/test_fftconv_gpu.py K2=tests/gpu/test_throughput_gpu.py KEXPR2="mesa or hyena" T=$(( $(left) - 40 )) $Z gputests gputests2
go 60 env SCRIPT_ARGS="--mixers gdn,gla --variants 16,none --T 256,1024 --out logs/fla-unpadded-gdn-gla.json" T=$(( $(left) - 15 )) $Z script:benchmarks/fla_unpadded.py
echo "== end $(date +%T), left $(left)"
