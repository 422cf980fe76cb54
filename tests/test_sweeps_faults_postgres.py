"""PostgreSQL restarted, and down for good, while two workers run a sweep: a real server on
loopback (as test_sweeps_postgres.py starts it), restarted and stopped with pg_ctl."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_sweeps_faults import ENV, check_complete, error_lines, spec_file, wait_for
from test_sweeps_postgres import PASSWORD, postgres_server

from mixzoo.cli import main
from mixzoo.sweeps import engine


@pytest.fixture(scope="module")
def server():
    with postgres_server("mixzoo-pgf-") as srv:
        yield srv


def trials_of(url: str, prefix: str) -> dict[str, list]:
    """The studies named ``prefix...`` and their trials (a fresh connection each time, opened as the
    sweep opens it: the first poll may race the sweep's creation of the tables)."""
    from mixzoo.sweeps.storage import open_storage
    storage = open_storage(url)
    try:
        return {s.study_name: storage.get_all_trials(s._study_id) for s in storage.get_all_studies()
                if s.study_name.startswith(prefix)}
    finally:
        storage.engine.dispose()


def running(url: str, prefix: str):
    for ts in trials_of(url, prefix).values():
        for t in ts:
            if t.state.name == "RUNNING" and "owner" in t.user_attrs:
                return t
    return None


def sweep(res: Path, spec: Path, url: str, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mixzoo", "--results", str(res), "--device", "cpu", "sweep", str(spec),
           "--workers", "2"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**ENV, "MIXZOO_SWEEP_HEARTBEAT": "0.2", "MIXZOO_STORAGE": url, **env})


def leaderboard(res: Path) -> list[dict]:
    from mixzoo.leaderboard import read_table
    return read_table(res).to_pylist()


def test_postgres_restart_while_two_workers_run(tmp_path, server):
    spec = spec_file(tmp_path / "pgr.toml", "t-pgr", trials=2, seeds=2, steps=200)
    res = tmp_path / "res"
    p = sweep(res, spec, server.url, {"MIXZOO_STORAGE_RETRY_S": "60"})
    try:
        t = wait_for(lambda: running(server.url, "t-pgr"), p, every=0.1)
        assert t is not None, p.communicate()
        before = server.pid()
        server.pg_ctl("-m", "fast", "-w", "-t", "60", "restart")   # every connection is cut
        assert server.pid() != before
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, out + err
    assert PASSWORD not in out + err
    st = trials_of(server.url, "t-pgr")
    check_complete(st, leaderboard(res), trials=2, seeds=2)
    every = [x for ts in st.values() for x in ts]
    assert not [x for x in every if x.user_attrs.get("stale")]            # nothing lost, so nothing retried
    (same,) = [x for x in every if x._trial_id == t._trial_id]
    assert same.state.name == "COMPLETE"                                   # the trial the restart hit
    text = "".join(q.read_text() for q in (res / "sweeps" / "logs").glob("*.log"))
    starts = Counter(line.split(" start ", 1)[1].split(":")[0] for line in text.splitlines() if " start " in line)
    assert len(starts) == 2 + 2 and set(starts.values()) == {1}, starts   # each trial and seed ran once


def test_postgres_down_workers_stop_then_rerun_resumes(tmp_path, server, capsys, monkeypatch):
    spec = spec_file(tmp_path / "pgd.toml", "t-pgd", trials=2, seeds=2, steps=200)
    res = tmp_path / "res"
    p = sweep(res, spec, server.url, {"MIXZOO_STORAGE_RETRY_S": "2"})
    try:
        assert wait_for(lambda: running(server.url, "t-pgd"), p, every=0.1) is not None, p.communicate()
        server.pg_ctl("-m", "fast", "-w", "-t", "60", "stop")
        t0 = time.time()
        out, err = p.communicate(timeout=120)
        waited = time.time() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        server.start()
    assert p.returncode == 75, out + err
    assert waited < 30, waited                                    # a bounded wait, not a hang
    lines = error_lines(err)
    assert {x.split(" ", 1)[0] for x in lines if x.startswith("[w")} == {"[w0]", "[w1]"}, err   # one line each
    assert len(lines) == 3 and all("unreachable for 2 s" in x and "rerun the same command" in x for x in lines), err
    assert PASSWORD not in out + err and "mixzoo:***@127.0.0.1" in err
    assert "Traceback" not in out + err

    monkeypatch.setenv("MIXZOO_STORAGE", server.url)
    monkeypatch.setattr(engine, "POLL_S", 0.2)
    rc = main(["--results", str(res), "--device", "cpu", "sweep", str(spec)])
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    st = trials_of(server.url, "t-pgd")
    check_complete(st, leaderboard(res), trials=2, seeds=2)
    assert any(x.user_attrs.get("stale") for ts in st.values() for x in ts)   # the cut-off trials, retried
