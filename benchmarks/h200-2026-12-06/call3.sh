# session 2026-12-06b call 3: the Hyena operator's FFT operands written into zero-padded buffers (the default now)
# against rfft's padding (MIXZOO_HYENA_FFT_PAD=rfft, the operator as timed in call 1), its GPU tests, and a per-kernel
# profile of the cost floor's step (benchmarks/floor_mixer.py) at length 1024.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { echo $(( END - $(date +%s) )); }
go() { local need=$1; shift; if [ $(left) -gt $need ]; then echo "== $(date +%T) $*"; "$@"; else echo "== skipped (time): $*"; fi; }
Z="bash scripts/gpu-zoo.sh"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed"
go 300 env K=tests/gpu/test_fftconv_gpu.py KEXPR=operator T=110 $Z gputests
go 200 env TPN=-hyena-buffers TP_ARGS="--shape mad512,mad1024 $S --K 6,3 hyena" T=70 $Z tput
go 130 env TPN=-hyena-rfftpad MIXZOO_HYENA_FFT_PAD=rfft TP_ARGS="--shape mad512,mad1024 $S --K 6,3 hyena" T=70 $Z tput
go 50 env SCRIPT_ARGS="--mixers floor --shape mad1024 --stacked 6 --graphed --steps 3 --warmup 5 --top 25 --by-source --out logs/prof-floor-mad1024" \
  T=$(( $(left) - 10 )) $Z script:benchmarks/floor_profile.py
echo "== end $(date +%T), left $(left)"
