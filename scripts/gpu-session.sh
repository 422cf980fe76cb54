#!/bin/bash
# The GPU measurements of the README, as run on the lent GPU machine
# (run from the repository root, with the pure-Python wheels in .whl/ and $OUT set):
#   bash scripts/gpu-session.sh setup-only | mixers | bench | throughput | kernels | sweep | scripts
# (mixers: K=EXPR selects tests as pytest -k does; scripts: SCRIPTS="a.py b.py")
# Several parts may run at once on a two-GPU machine (run setup-only first): GPU=0/1 selects the
# device, TAG=-x names that run's log, JSON and caches apart.
set -o pipefail
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${GPU:-0}
site=/tmp/site
[ -d $site/fla ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl
export PYTHONPATH=$site:$PWD
# Triton's compile cache with autotune results, kept between lent machines: .gpu/tc.tgz and
# .gpu/at-*.tgz (carried) are unpacked first; each part packs its autotune results (the full
# cache is too large to bring back) into $OUT/at-PART.tgz when it ends
export TRITON_CACHE_DIR=$PWD/.triton-cache/$1$TAG TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in .gpu/tc.tgz .gpu/at-*.tgz; do [ -f $f ] && tar xzf $f -C $TRITON_CACHE_DIR; done
trap "cd $TRITON_CACHE_DIR && find . -name '*.autotune.json' | tar czf $OUT/at-$1$TAG.tgz -T -" EXIT
log=$OUT/$1$TAG.log
case $1 in
  setup-only) nvidia-smi | tee $log ;;
  mixers)
    MIXZOO_BENCH_OUT=$OUT/mixers$TAG.json timeout ${T:-450} python3 -m pytest -q -m gpu -rA -s --durations=5 \
      ${K:+-k "$K"} tests/gpu/test_mixers_gpu.py tests/gpu/test_trainer_gpu.py 2>&1 | grep --line-buffered -v -i "warn" | tee $log | tail -60
    timeout ${T2:-120} python3 benchmarks/gdn_paths.py 2>&1 | tee -a $log ;;
  bench)   # MIXERS="a b:KEY=V ..." (default: all registered), alone on the GPU for its timings
    timeout ${T:-300} python3 -m mixzoo bench mixers ${MIXERS} --out $OUT/mixers$TAG.json 2>&1 \
      | grep --line-buffered -v -i "warn" | tee $log | tail -30 ;;
  throughput)
    MIXZOO_BENCH_MIXERS=${MIXERS:-softmax,gdn,gla} timeout ${T:-540} python3 -m mixzoo bench throughput \
      --out $OUT/throughput.json 2>&1 | grep --line-buffered -v -i "warn" | tee $log | tail -40 ;;
  kernels)
    export PYTHONPATH=$PYTHONPATH:$PWD/.flashlla MIXZOO_FLASHLLA_MIN_LEN=4096 MIXZOO_FLASHLLA_MAX_LEN=4096
    timeout ${T:-240} python3 -m pytest -q -m gpu -rA tests/gpu/test_lla_kernel.py 2>&1 | tee $log | tail -40
    timeout ${T2:-300} python3 -m mixzoo bench kernels --out $OUT/kernels.json 2>&1 | grep --line-buffered -v -i "warn" \
      | tee -a $log | tail -30 ;;
  sweep)
    t0=$(date +%s)
    timeout ${T:-540} python3 -m mixzoo --results $OUT/res sweep mqar --preset small --workers 2 2>&1 \
      | grep --line-buffered -v -i "warn" | tee $log | tail -40
    echo "sweep wall $(( $(date +%s) - t0 )) s" | tee -a $log
    python3 -m mixzoo --results $OUT/res leaderboard show 2>&1 | tail -20 | tee -a $log
    (cd $OUT && tar czf res.tgz res && rm -rf res) ;;
  scripts)   # SCRIPTS="a.py b.py" run one after the other, each within T seconds
    for f in ${SCRIPTS}; do timeout ${T:-150} python3 $f 2>&1 | grep --line-buffered -v -i "warn" | tee -a $log; done ;;
  *) echo "unknown part $1"; exit 2 ;;
esac
