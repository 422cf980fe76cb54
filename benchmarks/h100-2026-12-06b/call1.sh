# session 2026-12-06b call 1: Hyena's Functions on the GPU (tests), Hyena's operator as one Function and the Toeplitz
# step's Function each timed against the default, the cost floor (a mixer that does not mix) at MAD's lengths, then
# per-kernel profiles (stacked+graphed, K = 6).
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-565} ))
left() { echo $(( END - $(date +%s) )); }
go() { local need=$1; shift; if [ $(left) -gt $need ]; then echo "== $(date +%T) $*"; "$@"; else echo "== skipped (time): $*"; fi; }
Z="bash scripts/gpu-zoo.sh"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed"
L4="mad,mad256,mad512,mad1024"
go 420 env K=tests/gpu/test_fftconv_gpu.py T=150 $Z gputests
go 300 env TPN=-hyena-default TP_ARGS="--shape $L4 $S --K 6 hyena" T=80 $Z tput
go 220 env TPN=-hyena-op MIXZOO_HYENA_OP=fused TP_ARGS="--shape $L4 $S --K 6,3 hyena" T=100 $Z tput
go 150 env TPN=-hyena-toeplitz-fused MIXZOO_HYENA_TOEPLITZ=fused TP_ARGS="--shape mad,mad256 $S --K 6 hyena" T=50 $Z tput
go 100 env TPN=-floor TP_ARGS="--plugin benchmarks/floor_mixer.py --shape $L4 $S --K 6 floor" T=80 $Z tput
P="--stacked 6 --graphed --steps 3 --warmup 5 --top 25 --by-source"
for job in "hyena mad1024" "mamba mad1024"; do
  set -- $job
  go 45 env MIXZOO_HYENA_OP=fused SCRIPT_ARGS="--mixers $1 --shape $2 $P --out logs/prof-$1-$2" T=$(( $(left) - 10 )) $Z script:benchmarks/profile_step.py
  mv logs/profile_step.log logs/prof-$1-$2.log 2>/dev/null
done
echo "== end $(date +%T), left $(left)"
