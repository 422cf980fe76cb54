# session 2026-12-06c call 1: Hyena's operator channels-first (MIXZOO_HYENA_LAYOUT=channels, the new default) against
# the strided layout, back to back, stacked+graphed K = 6 at MAD's lengths; LLA's explicit solve at its precision
# level against capped at 1 (MIXZOO_LLA_DIRECT_PREC); then, side by side, the GPU tests of Hyena's default (fftconv,
# throughput, mixers) and LLA's direct solve with the cap.
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-575} ))
left() { echo $(( END - $(date +%s) )); }
go() { local need=$1; shift; if [ $(left) -gt $need ]; then echo "== $(date +%T) $*"; "$@"; else echo "== skipped (time): $*"; fi; }
Z="bash scripts/gpu-zoo.sh"
S="--steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
for how in channels strided; do
  go 400 env MIXZOO_HYENA_LAYOUT=$how TPN=-hyena-$how TP_ARGS="--shape mad,mad256,mad512,mad1024 $S hyena" T=110 $Z tput
done
for how in level capped; do
  go 250 env MIXZOO_LLA_DIRECT_PREC=$how TPN=-lla-$how TP_ARGS="--shape mad,mad256,mad512,mad1024 $S lla" T=90 $Z tput
done
go 60 env MIXZOO_LLA_DIRECT_PREC=capped K="tests/gpu/test_fftconv_gpu.py tests/gpu/test_throughput_gpu.py tests/gpu/test_mixers_gpu.py" \
  KEXPR="hyena or operator or fft" K2=tests/gpu/test_lla_kernel.py KEXPR2=direct T=$(( $(left) - 20 )) $Z gputests gputests2
for f in logs/throughput-*.md; do echo "== $f"; cat $f; done
tail -n 5 logs/gputests.log logs/gputests-2.log
echo "== end $(date +%T), left $(left)"
