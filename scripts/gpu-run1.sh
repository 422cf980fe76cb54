set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s)
timeout 120 python3 -m mixzoo --results $OUT/res sweep mqar --preset small --workers 2 --trials 2 2>&1 | tee $OUT/sweep.log | grep -v -i warn | tail -30
echo "sweep wall $(( $(date +%s) - t0 )) s"
python3 -m mixzoo --results $OUT/res leaderboard show 2>&1 | tail -12
(cd $OUT && tar czf res.tgz res && rm -rf res)
export MIXZOO_BENCH_MIXERS=softmax MIXZOO_BENCH_STEPS=120
timeout 75 python3 -m mixzoo bench throughput --out $OUT/throughput.json 2>&1 | grep -v -i warn | tee $OUT/throughput.log | tail -25
