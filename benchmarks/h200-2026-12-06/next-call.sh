# planned, not run on 2026-12-06 (the session's device time ran out): the GPU tests of Hyena's default (the operator
# as one Function, FFT operands in padded buffers) in the throughput and mixer suites, then GLA's fla path unpadded.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { echo $(( END - $(date +%s) )); }
go() { local need=$1; shift; if [ $(left) -gt $need ]; then echo "== $(date +%T) $*"; "$@"; else echo "== skipped (time): $*"; fi; }
Z="bash scripts/gpu-zoo.sh"
go 200 env K="tests/gpu/test_throughput_gpu.py tests/gpu/test_mixers_gpu.py" KEXPR=hyena T=200 $Z gputests
go 60 env SCRIPT_ARGS="--mixers gla --variants 16,none --T 256,1024 --out logs/fla-unpadded-gla.json" T=$(( $(left) - 15 )) $Z script:benchmarks/fla_unpadded.py
echo "== end $(date +%T), left $(left)"
