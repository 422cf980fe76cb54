# session 2026-12-06 call 1: Hyena's FFT-step Function and Toeplitz gather, timed; stale K=3/K=16 cells; MesaNet unpadded
set -o pipefail
export END=$(( $(date +%s) + 560 ))
left() { echo $(( END - $(date +%s) )); }
go() { local need=$1; shift; if [ $(left) -gt $need ]; then echo "== $(date +%T) $*"; "$@"; else echo "== skipped (time): $*"; fi; }
Z="bash scripts/gpu-zoo.sh"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed"
go 400 env K=tests/gpu/test_fftconv_gpu.py T=100 $Z gputests
go 300 env TPN=-hyena-torch MIXZOO_BENCH_MIXERS=hyena TP_ARGS="--shape mad,mad256,mad512,mad1024 $S --K 6" T=90 $Z tput
go 250 env TPN=-hyena-fused MIXZOO_HYENA_CONV=fused MIXZOO_BENCH_MIXERS=hyena TP_ARGS="--shape mad512,mad1024 $S --K 6" T=70 $Z tput
go 220 env TPN=-hyena-fft MIXZOO_HYENA_CONV=fused MIXZOO_HYENA_PATH=fft MIXZOO_BENCH_MIXERS=hyena TP_ARGS="--shape mad,mad256 $S --K 6" T=60 $Z tput
go 200 env TPN=-hyena-gather MIXZOO_HYENA_TOEPLITZ=gather MIXZOO_BENCH_MIXERS=hyena TP_ARGS="--shape mad,mad256 $S --K 6" T=60 $Z tput
go 160 env TPN=-k16 TP_ARGS="--shape mad $S --K 16 gdn gla" T=70 $Z tput
go 120 env TPN=-k3 TP_ARGS="--shape mad,mad256,mad512,mad1024 $S --K 3 softmax mesa" T=100 $Z tput
go 60 env SCRIPT_ARGS="--mixers mesa --variants 16,none --T 256,1024 --out logs/fla-unpadded.json" T=$(( $(left) - 15 )) $Z script:benchmarks/fla_unpadded.py
echo "== end $(date +%T), left $(left)"
