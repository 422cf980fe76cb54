"""Faults a long sweep survives, each produced for real: a torn or damaged journal, a full disk
under the leaderboard or the journal (a tmpfs mounted here), a worker on another host that
vanishes (SIGSTOP: no process death to see), and SIGTERM. PostgreSQL restarts and outages are in
test_sweeps_faults_postgres.py. Each checks the outcome: exit codes, one-line messages, the
trials in the storage, the files, and one leaderboard row per (mechanism, setting, seed)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_sweeps_helpers import journal, rows, studies, write_spec

from mixzoo.cli import main
from mixzoo.sweeps import engine

# one compute thread per sweep process: the tiny models gain nothing from more, and two workers
# with two threads each on a 2-core machine spend their time spinning against each other.
# Unbuffered, as the GPU scripts run: each write is its own system call, so a line written in
# pieces shows up as two workers' lines run together
ENV = {**os.environ, "MIXZOO_SWEEP_POLL": "0.3", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
JOURNAL = Path("sweeps") / "optuna-journal.log"


def spec_file(path: Path, name: str, *, trials: int, seeds: int, steps: int = 20) -> Path:
    """The sweep tests' tiny MQAR spec; ``steps`` > 20 makes a trial last long enough to be caught
    while it runs (about 0.5 s at 200 steps)."""
    write_spec(path, name=name, models=["softmax"], trials=trials, seeds=seeds, extra='[pruner]\nkind = "none"\n')
    path.write_text(path.read_text().replace("steps = 20\n", f"steps = {steps}\n"))
    return path


def sweep_cmd(res: Path, spec: Path, workers: int = 1) -> list[str]:
    return [sys.executable, "-m", "mixzoo", "--results", str(res), "--device", "cpu", "sweep", str(spec),
            "--workers", str(workers)]


def rerun(res: Path, spec: Path, capsys) -> tuple[int, str, str]:
    """The same sweep in this process (one worker): exit code, stdout, stderr."""
    capsys.readouterr()
    rc = main(["--results", str(res), "--device", "cpu", "sweep", str(spec)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(autouse=True)
def _fast_poll(monkeypatch):
    monkeypatch.setattr(engine, "POLL_S", 0.2)   # the in-process reruns


def wait_for(cond, proc=None, timeout=120.0, every=0.05):
    t0 = time.time()
    while time.time() - t0 < timeout and (proc is None or proc.poll() is None):
        with contextlib.suppress(Exception):   # a journal read while a worker appends
            hit = cond()
            if hit:
                return hit
        time.sleep(every)
    return None


def running(res: Path, host: str | None = None):
    """A RUNNING trial with an owner (on ``host``) in the journal, else None."""
    if not (res / JOURNAL).exists():
        return None
    for ts in studies(journal(res)).values():
        for t in ts:
            owner = t.user_attrs.get("owner", "")
            if t.state.name == "RUNNING" and owner and (host is None or owner.startswith(host + "|")):
                return t
    return None


def check_complete(st: dict, lb: list[dict], trials: int, seeds: int) -> None:
    """Every slot held by one finished trial (retired ones, and the copies of a slot that racing
    setups laid, aside), no trial RUNNING or WAITING, and exactly one leaderboard row per (study, seed)."""
    search = {k: v for k, v in st.items() if not k.endswith(":final")}
    final = {k: v for k, v in st.items() if k.endswith(":final")}
    assert len(search) == len(final) == 1, sorted(st)
    for ts, n in ((next(iter(search.values())), trials), (next(iter(final.values())), seeds)):
        live = [t for t in ts if not (t.user_attrs.get("stale") or t.user_attrs.get("duplicate"))]
        assert sorted(t.user_attrs["slot"] for t in live) == list(range(n)), [(t.number, t.user_attrs) for t in ts]
        assert all(t.state.is_finished() for t in ts), [(t.number, t.state.name) for t in ts]
        assert all(t.state.name == "COMPLETE" for t in live)
    keys = Counter((r["study"], r["seed"]) for r in lb)
    assert sorted(keys) == [(next(iter(search)), s) for s in range(seeds)] and set(keys.values()) == {1}, keys


def sound(path: Path) -> bool:
    data = path.read_bytes()
    return data.endswith(b"\n") and all(isinstance(json.loads(x), dict) for x in data.splitlines())


def error_lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if "mixzoo: error:" in x]


class Writes:
    """A stream that keeps each write call apart."""

    def __init__(self):
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return len(s)

    def flush(self) -> None:
        pass


def test_a_worker_writes_each_of_its_lines_in_one_call(tmp_path, monkeypatch):
    """Workers share the coordinator's stdout and stderr: a line written as text then newline (what
    print does, two system calls when unbuffered) interleaves with another worker's line."""
    from mixzoo.sweeps import run, storage
    out, err = Writes(), Writes()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    logs = run.Logs(str(tmp_path), "t-lines", "sqlite:///x.db", prefix="[w1] ")
    logs.screen("trial 0 done")
    logs.note("storage unreachable; retrying")
    logs._drop(OSError(28, "No space left on device"))
    assert run._storage_failed(storage.StorageError("storage unreachable for 2 s"), "sqlite:///x.db", "[w1] ") \
        == storage.EXIT_STORAGE
    storage._stderr("journal repaired")
    assert out.calls == ["[w1] trial 0 done\n"]
    assert [c.split(":", 1)[0] for c in err.calls] == ["[w1] mixzoo"] * 3 + ["mixzoo"]
    assert all(c.endswith("\n") and c.count("\n") == 1 for c in err.calls), err.calls
    assert "[w1] mixzoo: error: storage unreachable for 2 s\n" in err.calls


# ---------------------------------------------------------------------------- 1. the journal
def test_torn_journal_tail_is_repaired_and_mid_file_damage_refused(tmp_path, capsys):
    spec = spec_file(tmp_path / "torn.toml", "t-torn", trials=2, seeds=2)
    res = tmp_path / "res"
    r = subprocess.run(sweep_cmd(res, spec), capture_output=True, text=True, env=ENV, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    path = res / JOURNAL
    data = path.read_bytes()
    # a crash mid-write: cut the journal inside the record that finished the last final run
    lines = data.splitlines(keepends=True)
    k = max(i for i, x in enumerate(lines) if json.loads(x)["op_code"] == 6 and json.loads(x)["state"] == 1)
    cut = sum(map(len, lines[:k])) + len(lines[k]) // 2
    with open(path, "r+b") as f:
        f.truncate(cut)
    torn = path.read_bytes()

    rc, out, err = rerun(res, spec, capsys)
    assert rc == 0, out + err
    notes = [x for x in err.splitlines() if "journal" in x]
    assert len(notes) == 1 and "dropped its incomplete last record" in notes[0] and f"byte {cut - len(lines[k]) // 2}" \
        in notes[0], err
    (backup,) = path.parent.glob("optuna-journal.log.damaged-*")
    assert backup.name in notes[0] and backup.read_bytes() == torn       # the damaged file, kept as it was
    assert sound(path) and path.read_bytes().startswith(b"".join(lines[:k]))
    st = studies(journal(res))
    check_complete(st, rows(res), trials=2, seeds=2)
    final = next(v for k_, v in st.items() if k_.endswith(":final"))
    # the run whose completion was cut: its trial reaped and retried; its row was there: not written twice
    assert [t.state.name for t in final if t.user_attrs.get("stale")] == ["FAIL"]
    assert "row already in the leaderboard" in out

    # damage followed by valid records: refused in one line, exit code 2, nothing changed
    good = path.read_bytes()
    lines = good.splitlines(keepends=True)
    mid = len(lines) // 2
    pos = sum(map(len, lines[:mid]))
    bad = good[:pos] + b"#" + good[pos + 1:]
    path.write_bytes(bad)
    rc, out, err = rerun(res, spec, capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("mixzoo: error: journal"), err
    assert str(path) in err and f"byte {pos}" in err and f"truncate -s {pos}" in err and "restore" in err
    assert path.read_bytes() == bad and len(list(path.parent.glob("*.damaged-*"))) == 1
    assert len(rows(res)) == 2

    # the recovery it names works: keep the records before the damage, rerun
    with open(path, "r+b") as f:
        f.truncate(pos)
    rc, out, err = rerun(res, spec, capsys)
    assert rc == 0, out + err
    check_complete(studies(journal(res)), rows(res), trials=2, seeds=2)


# ---------------------------------------------------------------------------- 3. a full disk
@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A small tmpfs at ``path`` (a real file system that fills up), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is made with a tmpfs mount, which needs root")
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs was refused: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(d: Path, leave: int = 0) -> Path:
    """Take all but ``leave`` bytes of ``d``'s file system with one file."""
    s = os.statvfs(d)
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        want = max(s.f_bavail * s.f_frsize - leave, 0)
        with contextlib.suppress(OSError):
            while want > 0:
                want -= os.write(fd, b"\0" * min(want, 1 << 16))
            while leave == 0:      # and whatever the first pass left
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


def leftovers(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if p.is_file() and p.name != "filler"]


def test_full_disk_under_the_leaderboard(tmp_path, capsys):
    spec = spec_file(tmp_path / "lbfull.toml", "t-lbfull", trials=1, seeds=2)
    res = tmp_path / "res"
    with tmpfs(res / "leaderboard", "256k") as lb:
        filler = fill(lb, leave=8192)       # room for part of a row's file, not all of it
        rc, out, err = rerun(res, spec, capsys)
        assert rc == 75, out + err
        (line,) = error_lines(err)
        assert "cannot write the leaderboard row" in line and "No space left on device" in line
        assert "rerun the same command" in line
        assert leftovers(lb) == []                   # no partial file, no temporary file
        final = next(v for k, v in studies(journal(res)).items() if k.endswith(":final"))
        failed = [t for t in final if t.state.name == "FAIL"]
        assert len(failed) == 1 and "No space left on device" in failed[0].user_attrs["reason"]
        assert any(t.state.name == "WAITING" and t.user_attrs.get("retry_of") == failed[0].number for t in final)

        filler.unlink()
        rc, out, err = rerun(res, spec, capsys)
        assert rc == 0, out + err
        check_complete(studies(journal(res)), rows(res), trials=1, seeds=2)
        assert not [p for p in leftovers(lb) if p.name.startswith(".")]


def test_full_disk_under_the_journal_mid_sweep(tmp_path, capsys):
    spec = spec_file(tmp_path / "jfull.toml", "t-jfull", trials=2, seeds=2, steps=200)
    res = tmp_path / "res"
    with tmpfs(res, "1m"):
        p = subprocess.Popen(sweep_cmd(res, spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**ENV, "MIXZOO_SWEEP_HEARTBEAT": "0.1"})
        assert wait_for(lambda: running(res), p) is not None, p.communicate()
        filler = fill(res)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 75, out + err
        (line,) = error_lines(err)
        assert "cannot write the sweep journal" in line and "No space left on device" in line, err
        assert sound(res / JOURNAL)                        # the failed append left no half record
        lb = res / "leaderboard"
        assert not (lb.exists() and [q for q in lb.rglob(".tmp-*")])   # no temporary row file left
        assert len(rows(res)) < 2

        filler.unlink()
        rc, out, err = rerun(res, spec, capsys)
        assert rc == 0, out + err
        st = studies(journal(res))
        check_complete(st, rows(res), trials=2, seeds=2)
        assert any(t.user_attrs.get("stale") for ts in st.values() for t in ts)   # the cut-off trial, retried


# ---------------------------------------------------------------------------- 4. a vanished host
def test_worker_on_another_host_that_vanishes_is_reclaimed(tmp_path):
    spec = spec_file(tmp_path / "host.toml", "t-host", trials=3, seeds=1, steps=200)
    res = tmp_path / "res"
    env = {**ENV, "MIXZOO_SWEEP_GRACE": "3", "MIXZOO_SWEEP_HEARTBEAT": "0.2"}
    a = subprocess.Popen(sweep_cmd(res, spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**env, "MIXZOO_HOSTNAME": "host-a"})
    b = subprocess.Popen(sweep_cmd(res, spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**env, "MIXZOO_HOSTNAME": "host-b"})
    try:
        t = wait_for(lambda: running(res, "host-a"), a)
        assert t is not None, a.communicate()[0]
        os.kill(a.pid, signal.SIGSTOP)           # no exit, no signal to see: only its heartbeat stops
        out_b, _ = b.communicate(timeout=180)
        assert b.returncode == 0, out_b
        st = studies(journal(res))
        (ts,) = [ts for ts in st.values() if t._trial_id in {x._trial_id for x in ts}]
        (lost,) = [x for x in ts if x._trial_id == t._trial_id]
        assert lost.state.name == "FAIL" and lost.user_attrs.get("stale") and "host-a" in lost.user_attrs["reason"]
        (retry,) = [x for x in ts if x.user_attrs.get("retry_of") == t.number]   # rerun once
        assert retry.state.name == "COMPLETE" and retry.user_attrs["owner"].startswith("host-b|")
        # the retry draws what the lost trial drew, the same; the host may have stopped before or between its draws
        assert {k: retry.params.get(k) for k in lost.params} == lost.params, (retry.params, lost.params)
        assert f"reaped stale trial {t.number}" in out_b
        check_complete(st, rows(res), trials=3, seeds=1)
        n = {k: len(v) for k, v in st.items()}
    finally:
        os.kill(a.pid, signal.SIGCONT)
    # the host comes back: its late result is ignored, nothing runs twice
    out_a, _ = a.communicate(timeout=180)
    assert a.returncode == 0, out_a
    assert "reclaimed by another worker meanwhile" in out_a or "already finished elsewhere; ignored" in out_a, out_a
    assert "Traceback" not in out_a
    st = studies(journal(res))
    assert {k: len(v) for k, v in st.items()} == n
    check_complete(st, rows(res), trials=3, seeds=1)


# ---------------------------------------------------------------------------- 5. SIGTERM
def test_an_interrupt_waits_for_the_journal_append_under_way(tmp_path):
    from mixzoo.sweeps.run import interrupts_raise
    from mixzoo.sweeps.storage import journal_file_class, uninterrupted
    path = tmp_path / "j.log"
    backend = journal_file_class()(str(path))
    done = False
    with interrupts_raise(), pytest.raises(engine.Terminated):
        with uninterrupted():                  # as an append holds the journal's lock
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)                   # the handler runs meanwhile, and waits
            backend.append_logs([{"op_code": 0, "study_name": "s", "directions": [1]}])
            done = True
    assert done and sound(path) and not Path(str(path) + ".lock").exists()


SWALLOWS_SIGTERM = '''
import os, signal

from torch import nn

from mixzoo.registry import register_mixer

SENT = []


@register_mixer("swallower", search_space={"lr": ("log", 1e-3, 1e-2)})
class Swallower(nn.Module):
    """A linear mixer whose first forward sends this process SIGTERM and swallows what the handler
    raises, as code that clears every error does (torch's C++ import of NumPy, for one)."""

    def __init__(self, d_model, *, num_heads=1, layer_idx=0):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        if not SENT:
            SENT.append(1)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(1000))        # the handler runs here, between bytecodes
            except BaseException:
                pass
        return self.proj(x)
'''


def test_a_swallowed_sigterm_still_stops_the_worker_at_its_next_validation(tmp_path, capsys):
    """The SIGTERM's exception is lost in the code it landed in: the worker still stops at its next
    validation, gives the trial back and exits 143, rather than training the sweep to its end."""
    plugin = tmp_path / "swallower.py"
    plugin.write_text(SWALLOWS_SIGTERM)
    spec = tmp_path / "sw.toml"
    write_spec(spec, name="t-swallow", models=["swallower"], trials=2, seeds=1, extra='[pruner]\nkind = "none"\n')
    res = tmp_path / "res"
    rc = main(["--results", str(res), "--plugin", str(plugin), "--device", "cpu", "sweep", str(spec)])
    err = capsys.readouterr().err
    assert rc == 143, err
    assert "terminated (SIGTERM); rerun the same command to resume" in err
    every = [x for ts in studies(journal(res)).values() for x in ts]
    assert [x.user_attrs.get("reason") for x in every if x.state.name == "FAIL"] == ["interrupted (SIGTERM); retried"]
    assert sorted(x.state.name for x in every) == ["FAIL", "WAITING", "WAITING"]   # given back, and slot 1 untouched
    assert not (res / "leaderboard").exists() or rows(res) == []


def test_sigterm_gives_trials_back_and_exits_143(tmp_path, capsys):
    spec = spec_file(tmp_path / "term.toml", "t-term", trials=2, seeds=2, steps=200)
    res = tmp_path / "res"
    p = subprocess.Popen(sweep_cmd(res, spec, workers=2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV, start_new_session=True)
    try:
        t = wait_for(lambda: running(res), p)
        assert t is not None, p.communicate()
        p.send_signal(signal.SIGTERM)            # to the sweep command alone, as a scheduler does
        out, err = p.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 143, out + err
    assert err.count("terminated (SIGTERM); rerun the same command to resume") == 1, err
    assert "Traceback" not in out + err
    st = studies(journal(res))
    every = [x for ts in st.values() for x in ts]
    assert not [x for x in every if x.state.name == "RUNNING"]
    given = [x for x in every if x.user_attrs.get("reason") == "interrupted (SIGTERM); retried"]
    assert t.number in [x.number for x in given] and all(x.state.name == "FAIL" and x.user_attrs["stale"] for x in given)
    for x in given:
        assert [y.state.name for y in every if y.user_attrs.get("retry_of") == x.number] == ["WAITING"]
    n_rows = len(rows(res))

    rc, out, err = rerun(res, spec, capsys)
    assert rc == 0, out + err
    check_complete(studies(journal(res)), rows(res), trials=2, seeds=2)
    assert len(rows(res)) == 2 and n_rows <= 2


def test_an_interrupt_landing_in_the_claim_gives_the_trial_won_back(tmp_path):
    """SIGTERM arriving while the RUNNING record of a claim is appended (so raised as the append
    ends, before the claim returns): the trial just won is still given back, not left RUNNING."""
    from types import SimpleNamespace

    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from mixzoo.sweeps import storage as st
    s = JournalStorage(JournalFileBackend(str(tmp_path / "j.log")))
    optuna.create_study(storage=s, study_name="claim")
    sid = s.get_study_id_from_name("claim")
    engine.ensure_slots(s, sid, [{"slot": 0, "kind": "search"}, {"slot": 1, "kind": "search"}])

    class Signalled:
        """The storage, with a SIGTERM delivered during the append that moves a trial to RUNNING."""
        def __getattr__(self, name):
            return getattr(s, name)

        def set_trial_state_values(self, trial_id, state, values=None):
            with st.uninterrupted():       # what the journal file's append holds around its write
                ok = s.set_trial_state_values(trial_id, state=state, values=values)
                if state.name == "RUNNING":
                    st.interrupt(engine.Terminated())
            return ok
    ctx = SimpleNamespace(storage=Signalled(), log=lambda msg: None)
    got: list = []
    with pytest.raises(engine.Terminated):
        with engine.given_back_on_interrupt(ctx, sid, got):
            engine.claim_many(ctx.storage, s.get_all_trials(sid), 2, into=got)
    st.clear_interrupt()
    trials = s.get_all_trials(sid)
    assert [t.number for t in got] == [0]
    assert not [t for t in trials if t.state.name == "RUNNING"]
    assert [(t.user_attrs.get("retry_of"), t.state.name) for t in trials if "retry_of" in t.user_attrs] == [(0, "WAITING")]


def test_a_run_failing_from_a_swallowed_interrupt_is_given_back_not_failed(tmp_path, capsys, monkeypatch):
    """SIGTERM landing in a library that turns it into its own error (the run then fails with that
    error): the trial is given back for the rerun, as an interrupt that came through is, never told
    FAIL holding its slot; the rerun completes the sweep."""
    from mixzoo import api
    from mixzoo.sweeps import storage as st
    spec = spec_file(tmp_path / "swallow.toml", "t-swallow", trials=2, seeds=2)
    res = tmp_path / "res"
    real = api.run_spec
    calls = []

    def wrapped(*a, **k):
        calls.append(1)
        try:
            st.interrupt(engine.Terminated())     # what the SIGTERM handler does
        except engine.Terminated:
            raise RuntimeError("error return without exception set") from None
    monkeypatch.setattr(api, "run_spec", wrapped)
    rc, out, err = rerun(res, spec, capsys)
    assert rc == 143 and calls == [1], out + err
    every = [x for ts in studies(journal(res)).values() for x in ts]
    assert not [x for x in every if x.state.name in ("RUNNING", "COMPLETE")]
    failed = [x for x in every if x.state.name == "FAIL"]
    assert len(failed) == 1 and failed[0].user_attrs["stale"], [x.user_attrs for x in failed]
    assert failed[0].user_attrs["reason"] == "interrupted (SIGTERM); retried"
    monkeypatch.setattr(api, "run_spec", real)
    rc, out, err = rerun(res, spec, capsys)
    assert rc == 0, out + err
    check_complete(studies(journal(res)), rows(res), trials=2, seeds=2)
