"""Resumption: workers killed with SIGKILL mid-sweep; a rerun ends with the complete leaderboard,
one row per (mechanism, setting, seed), and the trial budget met exactly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

from test_sweeps_helpers import journal, rows, studies, write_spec

ENV = {**os.environ, "MIXZOO_SWEEP_POLL": "0.3"}


def _cmd(res, spec, workers=2):
    return [sys.executable, "-m", "mixzoo", "--results", str(res), "--device", "cpu", "sweep", str(spec),
            "--workers", str(workers)]


def _wait_for(res, cond, proc, timeout=180.0):
    """Poll the journal until ``cond(studies)`` returns a value; None if the sweep ended first."""
    path = res / "sweeps" / "optuna-journal.log"
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        if path.exists():
            hit = cond(studies(journal(res)))
            if hit:
                return hit
        time.sleep(0.1)
    return None


def _check_complete(res, n_units, trials, seeds):
    st = studies(journal(res))
    search = {k: v for k, v in st.items() if not k.endswith(":final")}
    assert len(search) == n_units
    for name, ts in search.items():
        live = [t for t in ts if not t.user_attrs.get("stale")]
        assert sorted(t.user_attrs["slot"] for t in live) == list(range(trials)), name  # budget met exactly
        assert all(t.state.is_finished() for t in ts)
    lb = rows(res)
    keys = Counter((r["study"], r["seed"]) for r in lb)
    assert set(keys.values()) == {1}, keys                          # no duplicate
    assert sorted(keys) == sorted((s, seed) for s in search for seed in range(seeds))
    return st


def test_sigkill_one_worker_others_go_on_then_rerun(tmp_path):
    spec = write_spec(tmp_path / "kill.toml", name="t-kill", models=["softmax"], trials=3, seeds=2,
                      extra='[pruner]\nkind = "none"\n')
    res = tmp_path / "res"
    p = subprocess.Popen(_cmd(res, spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)

    def running(st):
        for ts in st.values():
            for t in ts:
                if t.state.name == "RUNNING" and "owner" in t.user_attrs:
                    return t
    t = _wait_for(res, running, p)
    assert t is not None, p.communicate()[0]
    time.sleep(0.3)
    os.kill(int(t.user_attrs["owner"].split("|")[2]), signal.SIGKILL)
    out, _ = p.communicate(timeout=240)
    assert "stopped with signal 9" in out, out
    assert p.returncode == 0, out        # the surviving worker reaped the killed trial and finished
    st = _check_complete(res, 1, 3, 2)
    stale = [x for ts in st.values() for x in ts if x.user_attrs.get("stale")]
    assert [x.number for x in stale] == [t.number]
    assert any(x.user_attrs.get("retry_of") == t.number and x.state.is_finished() for ts in st.values() for x in ts)
    n_trials = {k: len(v) for k, v in st.items()}

    r = subprocess.run(_cmd(res, spec), capture_output=True, text=True, env=ENV, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {k: len(v) for k, v in studies(journal(res)).items()} == n_trials   # nothing ran again
    _check_complete(res, 1, 3, 2)


def test_sigkill_whole_sweep_in_final_phase_then_rerun(tmp_path):
    spec = write_spec(tmp_path / "killall.toml", name="t-killall", models=["softmax"], trials=1, seeds=4,
                      extra='[pruner]\nkind = "none"\n')
    res = tmp_path / "res"
    p = subprocess.Popen(_cmd(res, spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                         start_new_session=True)

    def mid_final(st):
        for k, ts in st.items():
            if k.endswith(":final") and any(t.state.name == "COMPLETE" for t in ts) \
                    and any(t.state.name == "RUNNING" and "owner" in t.user_attrs for t in ts):
                return True
    hit = _wait_for(res, mid_final, p)
    os.killpg(p.pid, signal.SIGKILL)
    out, _ = p.communicate(timeout=60)
    assert hit, out
    assert 1 <= len(rows(res)) < 4

    r = subprocess.run(_cmd(res, spec, workers=1), capture_output=True, text=True, env=ENV, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    st = _check_complete(res, 1, 1, 4)
    final = next(v for k, v in st.items() if k.endswith(":final"))
    assert any(t.user_attrs.get("stale") for t in final)
