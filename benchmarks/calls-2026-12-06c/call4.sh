# session 2026-12-06c call 4: the FFTs' 1/n in the filters' spectrum (MIXZOO_HYENA_FFT_SCALE=filter, the new default)
# against irfft's own pass over its output (output), Hyena stacked+graphed K = 6 at the FFT lengths, back to back;
# then the operator's GPU tests (bit for bit the chained steps, and either scale).
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-190} ))
left() { echo $(( END - $(date +%s) )); }
S="--shape mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
for how in filter output; do
  MIXZOO_HYENA_FFT_SCALE=$how TPN=-hyena-scale-$how TP_ARGS="$S hyena" T=60 bash scripts/gpu-zoo.sh tput
done
[ $(left) -gt 40 ] && K=tests/gpu/test_fftconv_gpu.py KEXPR=operator T=$(( $(left) - 10 )) bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-*.md; do echo "== $f"; grep stacked $f | head -4; done
tail -n 8 logs/gputests.log
echo "== end $(date +%T), left $(left)"
