#!/bin/bash
# A sweep over several GPUs, measured in one call (run from the repository root on a host with two
# or more GPUs, .whl/ carried, $OUT set; PostgreSQL from the system or PGBIN=/path/to/bin).
#
#   1. The same sweep three ways, each in its own results directory, one after the other:
#        one GPU     CUDA_VISIBLE_DEVICES=<first> --workers PER_GPU
#        all GPUs    --workers PER_GPU x N (mixzoo assigns workers to GPUs round-robin)
#        packed      --workers auto (the default packing: several small runs per GPU)
#      For each: wall time, trials per hour, the GPU each row ran on (the row's `gpu` column), and
#      whether the leaderboard holds exactly one row per (mechanism, setting, seed).
#   2. Two hosts simulated: PostgreSQL on loopback; two separate `mixzoo sweep` commands, each seeing
#      one GPU and its own MIXZOO_HOSTNAME; the first is killed (SIGKILL) once it holds a trial; the
#      second reclaims it after MIXZOO_SWEEP_GRACE and finishes. Same exactness check.
# Writes $OUT/multi-gpu.md (the table) and $OUT/multi-gpu-logs.tgz. N overrides the GPU count (a dry run on a
# CPU host: N=1 SPEC=some.toml BUDGET=smoke).
#   SPEC (default mqar), BUDGET (default small), MODELS (default softmax,gdn), PER_GPU (default 2),
#   T (seconds per sweep, default 150)
set -u -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR=$PWD/.triton-cache/multi
site=${SITE:-/tmp/site}
[ -d $site/optuna ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl
export PYTHONPATH=$site:$PWD
mkdir -p $TRITON_CACHE_DIR logs-multi
for f in scripts/h200-triton-autotune.tgz .gpu/at*.tgz; do [ -f $f ] && tar xzf $f -C $TRITON_CACHE_DIR; done
SPEC=${SPEC:-mqar} BUDGET=${BUDGET-small} MODELS=${MODELS:-softmax,gdn} PER_GPU=${PER_GPU:-2} T=${T:-150}
N=${N:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
IFS=, read -r -a VIS <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((N - 1)))}"
echo "GPUs: $N (${VIS[*]}); spec $SPEC [$BUDGET] models $MODELS; $PER_GPU workers per GPU" | tee logs-multi/summary.txt
mkdir -p $OUT; trap 'tar czf $OUT/multi-gpu-logs.tgz logs-multi' EXIT

summary() {   # results dir, label, wall seconds, storage (journal file or URL) -> one Markdown row
  python3 - "$@" <<'EOF'
import sys, collections, pyarrow.dataset as ds
import optuna
res, label, wall, where = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
if "://" in where:
    st = optuna.storages.RDBStorage(where)
else:
    from optuna.storages.journal import JournalFileBackend, JournalStorage
    st = JournalStorage(JournalFileBackend(where))
trials = [t for s in st.get_all_studies() for t in st.get_all_trials(s._study_id)]
done = sum(t.state.name == "COMPLETE" for t in trials)
try:
    rows = ds.dataset(f"{res}/leaderboard", format="parquet", partitioning="hive").to_table().to_pylist()
except Exception:
    rows = []
keys = collections.Counter((r["study"], r["seed"]) for r in rows if r.get("study"))
exact = "yes" if keys and set(keys.values()) == {1} else f"NO ({sum(v > 1 for v in keys.values())} duplicated)"
gpus = collections.Counter(str(r.get("gpu")) for r in rows)
print(f"| {label} | {wall:.0f} | {done} of {len(trials)} | {3600 * done / max(wall, 1):.0f} | {len(rows)} | "
      + ", ".join(f"GPU {g}: {n}" for g, n in sorted(gpus.items())) + f" | {exact} |")
EOF
}

sweep() {   # label, results dir, extra env..., -- sweep args
  local label=$1 res=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t0=$(date +%s)
  env "${envs[@]}" timeout $T python3 -m mixzoo --results $res sweep $SPEC ${BUDGET:+--budget $BUDGET} --models $MODELS "$@" \
    > logs-multi/$label.log 2>&1
  echo "$label rc $? in $(( $(date +%s) - t0 )) s" | tee -a logs-multi/summary.txt
  summary $res "$label" $(( $(date +%s) - t0 )) $res/sweeps/optuna-journal.log >> logs-multi/table.md
}

echo "| run | wall s | trials complete | trials per hour | rows | rows per GPU | one row per (mechanism, setting, seed) |" \
  > logs-multi/table.md
echo "|---|---|---|---|---|---|---|" >> logs-multi/table.md
sweep one-gpu logs-multi/res-one CUDA_VISIBLE_DEVICES=${VIS[0]} -- --workers $PER_GPU
sweep all-gpus logs-multi/res-all -- --workers $(( PER_GPU * N ))
sweep packed logs-multi/res-packed -- --workers auto

# two hosts through one PostgreSQL on loopback
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -n 1)}
if [ -z "$PGBIN" ] || [ ! -x "$PGBIN/initdb" ]; then
  echo "two hosts: not run: no PostgreSQL here (set PGBIN)" | tee -a logs-multi/summary.txt
else
  pgd=$(mktemp -d); port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  as_pg=(); [ "$(id -u)" = 0 ] && { chown -R postgres $pgd; as_pg=(runuser -u postgres --); }
  echo mixzoo > $pgd/pw; [ "$(id -u)" = 0 ] && chown postgres $pgd/pw
  "${as_pg[@]}" $PGBIN/initdb -D $pgd/data -U mixzoo --auth=scram-sha-256 --pwfile=$pgd/pw -E UTF8 --no-sync > logs-multi/pg.log 2>&1
  "${as_pg[@]}" $PGBIN/pg_ctl -D $pgd/data -o "-p $port -k $pgd -c listen_addresses=127.0.0.1" -l $pgd/log -w start >> logs-multi/pg.log 2>&1
  url=postgresql://mixzoo:mixzoo@127.0.0.1:$port/postgres
  t0=$(date +%s)
  for i in 0 1; do
    # its own session: killing it takes its worker processes too, as a host going down would
    setsid env CUDA_VISIBLE_DEVICES=${VIS[$(( i % N ))]} MIXZOO_HOSTNAME=host-$i MIXZOO_STORAGE=$url \
      MIXZOO_SWEEP_GRACE=${GRACE:-20} timeout $T python3 -m mixzoo --results logs-multi/res-hosts sweep $SPEC ${BUDGET:+--budget $BUDGET} --models $MODELS \
      --workers $PER_GPU > logs-multi/host-$i.log 2>&1 &
    eval "pid$i=$!"
  done
  # kill host-0's whole command (its workers too) once it holds a trial
  python3 - $url <<'EOF'
import sys, time, optuna
url = sys.argv[1]
for _ in range(600):
    try:
        st = optuna.storages.RDBStorage(url)
        if any(t.state.name == "RUNNING" and t.user_attrs.get("owner", "").startswith("host-0|")
               for s in st.get_all_studies() for t in st.get_all_trials(s._study_id)):
            print("host-0 holds a trial"); break
    except Exception:
        pass
    time.sleep(0.5)
EOF
  kill -KILL -- -$pid0; echo "killed host-0 at $(( $(date +%s) - t0 )) s" | tee -a logs-multi/summary.txt
  wait $pid1; echo "host-1 rc $? in $(( $(date +%s) - t0 )) s" | tee -a logs-multi/summary.txt
  grep -h "reaped stale trial" logs-multi/host-1.log | head -5 | tee -a logs-multi/summary.txt
  summary logs-multi/res-hosts "two hosts, host-0 killed" $(( $(date +%s) - t0 )) $url >> logs-multi/table.md
  "${as_pg[@]}" $PGBIN/pg_ctl -D $pgd/data -m immediate stop >> logs-multi/pg.log 2>&1
fi
cat logs-multi/table.md | tee $OUT/multi-gpu.md
