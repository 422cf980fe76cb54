import json
import os
import subprocess
import sys

from mixzoo.leaderboard import read_table
from mixzoo.train.packing import auto_workers, procs_per_gpu

RUN = ["run", "mqar", "--preset", "demo", "--steps", "12", "--hp", "d_model=16", "--hp", "n_train=128",
       "--hp", "n_val=32", "--hp", "n_test=32", "--hp", "eval_every=6", "--seed", "3"]


def _cmd(results, model):
    return [sys.executable, "-m", "mixzoo", "--results", str(results), "--device", "cpu", *RUN, "--model", model]


def _metrics(results):
    rows = read_table(results).to_pylist()
    return {r["model"]: (r["metrics_json"], r["val_metrics_json"], r["steps"], r["best_step"]) for r in rows}


def test_packed_processes_give_identical_results(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    single, packed = tmp_path / "single", tmp_path / "packed"
    for m in ("softmax", "lla"):
        subprocess.run(_cmd(single, m), env=env, check=True, capture_output=True)
    procs = [subprocess.Popen(_cmd(packed, m), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for m in ("softmax", "lla")]
    assert all(p.wait() == 0 for p in procs)
    a, b = _metrics(single), _metrics(packed)
    assert set(a) == {"softmax", "lla"} and a == b
    assert json.loads(a["lla"][0])["accuracy"] >= 0


def test_packing_policy():
    assert procs_per_gpu(64, 128, 64) == 4          # launch-bound tiny model
    assert procs_per_gpu(128, 256, 128) == 2
    assert procs_per_gpu(256, 256, 128) == 1        # saturates the GPU alone
    assert auto_workers([({"batch_size": 64, "d_model": 64}, 128)], n_gpus=2) == 8
    assert auto_workers([({"batch_size": 64, "d_model": 64}, 128), ({"batch_size": 256, "d_model": 128}, 256)], 1) == 1
    assert auto_workers([({}, 64)], n_gpus=0) == 1
