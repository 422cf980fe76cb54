# the device call after benchmarks/calls-2026-12-07c/next-call.sh (planned in session 2026-12-07d). In order:
# 1. GPU tests of 2026-12-07d's two switches: MIXZOO_EMBED_GRAD=onehot against the sort-based embedding backward
#    (tests/gpu/test_embedding_gpu.py, with both timed), MIXZOO_STACKED_EVAL=vmapped's validation against each model
#    alone for the eight (tests/gpu/test_throughput_gpu.py -k vmapped_validation).
# 2. The embedding's gradient in the training step: MIXZOO_EMBED_GRAD=sort, then onehot, each in its own process, back
#    to back, stacked+graphed K = 6 at MAD's lengths 128 and 1024: the cost floor (where the embedding's share is
#    largest) and GLA (the fastest mechanism); a warm-up process first (Triton compiles).
# 3. A stacked run's validations, one model at a time against vmapped (benchmarks/validation_time.py) at 128 and 1024.
# BUDGET: seconds for it all. Carry [".whl", ".gpu"].
set -o pipefail
export END=$(( $(date +%s) + ${BUDGET:-540} ))
left() { echo $(( END - $(date +%s) )); }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); echo "$card"
GTN=-embed KEXPR="embedding" K=tests/gpu/test_embedding_gpu.py T=90 bash scripts/gpu-zoo.sh gputests
GTN=-vmapped-validation KEXPR="vmapped_validation" K=tests/gpu/test_throughput_gpu.py T=120 bash scripts/gpu-zoo.sh gputests
S="--plugin benchmarks/floor_mixer.py --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
TPN=-warm TP_ARGS="--plugin benchmarks/floor_mixer.py --shape mad --steps 3 --warmup 2 --procs= \
  --modes stacked+graphed --K 6 floor gla" T=90 bash scripts/gpu-zoo.sh tput
for g in sort onehot; do
  [ $(left) -gt 150 ] && MIXZOO_EMBED_GRAD=$g TPN=-embed-$g TP_ARGS="--shape mad,mad1024 $S floor gla" T=100 \
    bash scripts/gpu-zoo.sh tput
done
[ $(left) -gt 100 ] && SCRIPT_ARGS="softmax gdn lla mamba hyena --shape mad,mad1024 --reps 2 \
  --json logs/validation-time.json" T=$(( $(left) - 20 )) bash scripts/gpu-zoo.sh script:benchmarks/validation_time.py
grep -h -E "passed|failed|embedding K=|vmapped-validation" logs/gputests-embed.log logs/gputests-vmapped-validation.log
for f in logs/throughput-embed-*.md; do echo "== $f"; grep -E "stacked" $f; done
cat logs/validation_time.log
case "$card" in *H200*) python3 -m mixzoo bench throughput --project benchmarks/calls-2026-12-06f/throughput-table-k6-h200-a6610f9.json \
  benchmarks/calls-2026-12-06f/throughput-lla-strided-prologue-h200-a6610f9.json --protocol settings \
  --validation logs/validation-time.json | tail -n 12 ;; esac
echo "== end $(date +%T), left $(left)"
