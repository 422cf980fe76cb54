#!/bin/bash
# The GPU runs behind the zoo-matrix work (run from the repository root on the lent GPU machine,
# with .whl/ and .gpu/ carried and $OUT set; scripts/device-wheels.sh makes .whl/ and .gpu/mamba-whl/ here). Parts, any
# number, run at once in the background:
#   zoo          mixzoo check-zoo over the whole matrix (W workers, default 10)
#   div:CASE:M[:S] benchmarks/divergence.py CASE --model M [--stop-at S] (CASE: mqar512 mqar512d64 state48
#                selcopy; HP="k=v ..." extra)
#   zoo2         a second check-zoo (ZOO2_ARGS, W2 workers) into the same results
#   build        scripts/build-mamba-ssm.sh from .gpu/*.tar.gz (wheels to .gpu/build, then installed)
#   madbench     mixzoo bench mixers --shape mad (alone: run it as the only part); logs/madbench$MBN.*
#   bench        mixzoo bench mixers $BENCH_ARGS (alone); logs/bench$MBN.*
#   tput         mixzoo bench throughput $TP_ARGS (step modes side by side; alone), logs/throughput$TPN.*
#   gputests     pytest -m gpu on K (files, default tests/gpu), KEXPR selecting as pytest -k
#   gputests2    a second pytest beside it, on K2 (KEXPR2), log logs/gputests-2.log
#   script:F     python3 F $SCRIPT_ARGS (a benchmark script) in the background
#   optmad       benchmarks/optimizer_mad.py (AdamW vs Muon on MAD; OW workers, OSTEPS steps)
#   repro:N[,N]  mixzoo reproduce N --scale $RSCALE (default small) into results/, one figure after another,
#                stopped by SIGTERM at the call's end (it resumes); results/ comes back as $OUT/results.tgz
# gputests' log is logs/gputests$GTN.log; LLACHECK=1 makes div:CASE:lla rerun the captured launch
# (benchmarks/lla_launch_check.py, then under compute-sanitizer memcheck and initcheck)
# gputests parts stop with SIGINT at T, so that pytest still prints its summary.
# T: seconds for every part (default 540). Logs, JSON and captures are packed into $OUT/logs.tgz,
# Triton's autotune results into $OUT/at.tgz (unpacked from .gpu/at*.tgz at the start), built
# mamba-ssm wheels (under 45 MiB) into $OUT/mw.part-* (cat them | tar x into .gpu/, as .gpu/mamba-whl).
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR=$PWD/.triton-cache/zoo
site=${SITE:-/tmp/site}     # one per concurrent invocation
[ -d $site/fla ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl
[ -d .gpu/mamba-whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target $site .gpu/mamba-whl/*.whl
export PYTHONPATH=$site:$PWD MIXZOO_SITE=$site
mkdir -p $TRITON_CACHE_DIR logs
# Triton autotune results (committed: fla's first call of a shape autotunes for minutes without them): those
# gathered on H100s for shapes no H200 call tuned (mesa's unpadded heads, K = 16, ...), then those gathered on H200s
# (which win where both have a file), then any newer ones carried in .gpu/
for f in scripts/h100-triton-autotune.tgz scripts/h200-triton-autotune.tgz .gpu/at*.tgz; do [ -f $f ] && tar xzf $f -C $TRITON_CACHE_DIR; done
# a damaged autotune file (two processes once wrote fla's chunk_fwd_kernel_h one at once) makes Triton's
# autotuner raise JSONDecodeError in every later run that reads it: drop such files, they are retuned
python3 - "$TRITON_CACHE_DIR" <<'PY'
import json, pathlib, sys
for p in pathlib.Path(sys.argv[1]).rglob("*.autotune.json"):
    try:
        json.loads(p.read_text())
    except Exception:
        print("dropping a damaged autotune file:", p)
        p.unlink()
PY
pack() {
  (cd $TRITON_CACHE_DIR && find . -name '*.autotune.json' | tar czf $OUT/at.tgz -T -)
  [ -n "$REPRO" ] && tar czf $OUT/results.tgz results
  tar czf $OUT/logs.tgz --exclude='nonfinite-*.pt' --exclude='*.full.pt' logs   # captures stay behind; report.json and small inputs come back
  if ls .gpu/build/wheels/*.whl >/dev/null 2>&1; then  # built wheels, in pieces under the 16 MiB file limit
    n=$(du -m -c .gpu/build/wheels/*.whl | tail -n 1 | cut -f1)
    [ "$n" -le 45 ] && tar cf - -C .gpu/build wheels | split -b 15m - $OUT/mw.part- || echo "wheels: $n MiB, not brought back"
  fi
}
trap pack EXIT
trap 'exit 143' TERM INT    # a call stopped at its limit still packs what its parts finished (EXIT runs pack)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee logs/nvidia-smi.txt
T=${T:-540}
# the call's end: parts that come late get what is left. Set it once for a call that runs this script
# several times, and below the call's own limit (600 s): a part still running at that limit is killed
# with everything it has not packed.
END=${END:-$(( $(date +%s) + 575 ))}
left() { echo $(( END - $(date +%s) - 15 )); }
pids=()
for part in "$@"; do
  case $part in
    zoo) timeout $T python3 -m mixzoo --results logs/zoo-res check-zoo --workers ${W:-10} --out logs/zoo.json \
           ${ZOO_ARGS} > logs/zoo.log 2>&1 & pids+=($!) ;;
    zoo2) timeout $T python3 -m mixzoo --results logs/zoo-res check-zoo --workers ${W2:-2} --out logs/zoo2.json \
           ${ZOO2_ARGS} > logs/zoo2.log 2>&1 & pids+=($!) ;;
    div:*) IFS=: read -r _ c m stop <<< "$part"         # div:CASE:MODEL[:STOP_AT]
           { timeout $T python3 benchmarks/divergence.py $c --model $m --out logs/div ${stop:+--stop-at $stop} \
               ${HP:+$(printf -- '--hp %s ' $HP)} \
             > logs/div-$c-$m.log 2>&1
           # LLACHECK=1: rerun the captured full launch with poisoned buffers, then under compute-sanitizer
           if [ "$m" = lla ] && [ -n "$LLACHECK" ]; then
             for l in ${LLALAYERS:-0}; do
               f=logs/div/$c-lla-s0/lla-worst-layer$l.full.pt; [ -f "$f" ] || continue
               b=logs/check-$c-layer$l
               [ $(left) -gt 20 ] && timeout $(left) python3 benchmarks/lla_launch_check.py $f --repeat 2 > $b.log 2>&1
               for tool in memcheck initcheck; do
                 [ $(left) -gt 30 ] || break
                 timeout $(left) compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/lla_launch_check.py \
                   $f --fill normal > $b-$tool.log 2>&1; echo "rc $?" >> $b-$tool.log
               done
             done
           fi; } &
           pids+=($!) ;;
    build) (t0=$(date +%s); MAX_JOBS=${JOBS:-6} ONLY=$ONLY timeout $T bash scripts/build-mamba-ssm.sh .gpu .gpu/build \
             > logs/build.log 2>&1; cp .gpu/build/*.txt .gpu/build/*.log logs/ 2>/dev/null; echo "build rc $? in $(( $(date +%s) - t0 )) s" >> logs/build.log) & pids+=($!) ;;
    madbench) timeout $T python3 -m mixzoo bench mixers --shape mad ${MIXERS} --out logs/madbench$MBN.json \
             > logs/madbench$MBN.log 2>&1 & pids+=($!) ;;
    bench) timeout $T python3 -m mixzoo bench mixers ${BENCH_ARGS} --out logs/bench$MBN.json \
             > logs/bench$MBN.log 2>&1 & pids+=($!) ;;
    tput) timeout $T python3 -m mixzoo bench throughput ${TP_ARGS} --out logs/throughput$TPN.json --md logs/throughput$TPN.md \
             > logs/throughput$TPN.log 2>&1 & pids+=($!) ;;
    script:*) f=${part#script:}; timeout $T python3 $f ${SCRIPT_ARGS} > logs/$(basename $f .py).log 2>&1 & pids+=($!) ;;
    gputests2) timeout -s INT -k 30 $T python3 -m pytest -q -m gpu -rA --tb=short ${KEXPR2:+-k "$KEXPR2"} ${K2} \
                > logs/gputests-2.log 2>&1 & pids+=($!) ;;
    gputests) timeout -s INT -k 30 $T python3 -m pytest -q -m gpu -rA --tb=short ${KEXPR:+-k "$KEXPR"} ${K:-tests/gpu} \
                > logs/gputests${GTN}.log 2>&1 & pids+=($!) ;;
    optmad) timeout $T python3 benchmarks/optimizer_mad.py --workers ${OW:-10} --steps ${OSTEPS:-1000} \
              --results logs/optmad-res --out logs/optmad.json > logs/optmad.log 2>&1 & pids+=($!) ;;
    repro:*) REPRO=1
             (for n in $(echo ${part#repro:} | tr , ' '); do
                [ $(left) -gt 30 ] || break
                timeout -s TERM $(left) python3 -m mixzoo --results results reproduce $n --scale ${RSCALE:-small} \
                  --workers ${RW:-auto} > logs/repro-$n.log 2>&1; echo "rc $?" >> logs/repro-$n.log
              done) & pids+=($!) ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
for p in "${pids[@]}"; do wait $p; done
tail -n 3 logs/*.log
grep -h -E "^(FAIL|COMPLETE|skip) " logs/zoo.log 2>/dev/null | grep -v "^COMPLETE" | head -40
