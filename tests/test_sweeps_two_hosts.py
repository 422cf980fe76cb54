"""Two hosts simulated on one machine: two separate ``mixzoo sweep`` commands, each with its own
host name (``MIXZOO_HOSTNAME``), neither started by nor knowing the other, joined only through one
PostgreSQL server on loopback. One is killed (SIGKILL) while it holds a trial; the other sees that
trial's heartbeat stop, reclaims it after the grace period, and finishes the sweep: every trial
slot and seed exactly once, one leaderboard row per (mechanism, setting, seed).
(scripts/multi-gpu-sweep.sh runs the same with one GPU per command.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from test_sweeps_faults import ENV, check_complete, spec_file, wait_for
from test_sweeps_faults_postgres import leaderboard, trials_of
from test_sweeps_postgres import postgres_server


def _host(res, spec, url, host):
    cmd = [sys.executable, "-m", "mixzoo", "--results", str(res), "--device", "cpu", "sweep", str(spec),
           "--workers", "1"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**ENV, "MIXZOO_STORAGE": url, "MIXZOO_HOSTNAME": host,
                                 "MIXZOO_SWEEP_GRACE": "3", "MIXZOO_SWEEP_HEARTBEAT": "0.2"})


def test_two_commands_on_one_postgres_one_killed_mid_trial(tmp_path):
    spec = spec_file(tmp_path / "hosts.toml", "t-hosts", trials=4, seeds=2, steps=200)
    res = tmp_path / "res"                      # a shared results directory (as on a shared filesystem)
    with postgres_server("mixzoo-pgh-") as srv:
        a = _host(res, spec, srv.url, "host-a")
        b = _host(res, spec, srv.url, "host-b")
        try:
            def held_by_a():
                for ts in trials_of(srv.url, "t-hosts").values():
                    for t in ts:
                        if t.state.name == "RUNNING" and t.user_attrs.get("owner", "").startswith("host-a|"):
                            return t
            t = wait_for(held_by_a, a, timeout=180)
            assert t is not None, a.communicate()[0]
            os.kill(a.pid, signal.SIGKILL)
            a.wait()
            out_b, _ = b.communicate(timeout=240)
        finally:
            for p in (a, b):
                if p.poll() is None:
                    p.kill()
        assert b.returncode == 0, out_b
        assert f"reaped stale trial {t.number}" in out_b, out_b
        st = trials_of(srv.url, "t-hosts")
    (ts,) = [ts for ts in st.values() if t._trial_id in {x._trial_id for x in ts}]
    (lost,) = [x for x in ts if x._trial_id == t._trial_id]
    assert lost.state.name == "FAIL" and lost.user_attrs.get("stale") and "host-a" in lost.user_attrs["reason"]
    (retry,) = [x for x in ts if x.user_attrs.get("retry_of") == t.number]
    assert retry.state.name == "COMPLETE" and retry.user_attrs["owner"].startswith("host-b|")
    check_complete(st, leaderboard(res), trials=4, seeds=2)
    owners = {x.user_attrs["owner"].split("|")[0] for ts in st.values() for x in ts if "owner" in x.user_attrs}
    assert owners == {"host-a", "host-b"}       # both hosts took trials from the one study
