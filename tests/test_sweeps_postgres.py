"""A smoke sweep with 2 worker processes against a real PostgreSQL server on loopback.

The server comes from Debian's packages (``.ci/run`` installs them); it is started here as the
``postgres`` user in a temporary directory on a free port. Skipped only outside CI
(``CI`` unset) when PostgreSQL is not installed.
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_sweeps_helpers import write_spec

PASSWORD = "s3cret-Pw9"


def _bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A PostgreSQL server of Debian's packages, in a temporary directory, on a free loopback port."""
    url: str
    bindir: Path
    data: Path
    log: Path
    port: int
    sock: Path
    as_pg: list[str]

    def pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.as_pg, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), *args],
                       check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.pg_ctl("-w", "-t", "60", "-o", f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 "
                    f"-c fsync=off", "start")

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])


@contextlib.contextmanager
def postgres_server(prefix: str = "mixzoo-pg-"):
    """A started server (as the ``postgres`` user when root), stopped and removed afterwards; skipped
    outside CI where PostgreSQL is not installed, a failure in CI."""
    bindir = _bin()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("CI: PostgreSQL is not installed (.ci/run installs Debian's postgresql package)")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    pytest.importorskip("psycopg")
    root = os.geteuid() == 0
    d = Path(tempfile.mkdtemp(prefix=prefix))
    (d / "sock").mkdir()
    (d / "pw").write_text(PASSWORD + "\n")
    if root:
        pg = pwd.getpwnam("postgres")
        for p in (d, d / "sock", d / "pw"):
            os.chown(p, pg.pw_uid, pg.pw_gid)
    port = _free_port()
    srv = Server(url=f"postgresql://mixzoo:{PASSWORD}@127.0.0.1:{port}/postgres", bindir=bindir, data=d / "data",
                 log=d / "log", port=port, sock=d / "sock", as_pg=["runuser", "-u", "postgres", "--"] if root else [])
    subprocess.run([*srv.as_pg, str(bindir / "initdb"), "-D", str(srv.data), "-U", "mixzoo", "--auth=scram-sha-256",
                    f"--pwfile={d / 'pw'}", "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
    srv.start()
    try:
        yield srv
    finally:
        subprocess.run([*srv.as_pg, str(bindir / "pg_ctl"), "-D", str(srv.data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_url():
    with postgres_server() as srv:
        yield srv.url


def test_two_workers_on_postgres(tmp_path, postgres_url):
    import optuna

    from mixzoo.leaderboard import read_table
    spec = write_spec(tmp_path / "pg.toml", name="t-pg", models=["softmax"], trials=3, seeds=3,
                      extra='[pruner]\nkind = "none"\n')
    res = tmp_path / "res"
    cmd = [sys.executable, "-m", "mixzoo", "--results", str(res), "--device", "cpu", "sweep", str(spec),
           "--storage", postgres_url, "--workers", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MIXZOO_SWEEP_POLL": "0.3"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert PASSWORD not in out and "mixzoo:***@127.0.0.1" in out
    # both workers claimed work; every search trial and every final seed ran exactly once
    logs = list((res / "sweeps" / "logs").glob("*.log"))
    text = "".join(p.read_text() for p in logs)
    assert PASSWORD not in text
    starts = Counter(line.split(" start ", 1)[1].split(":")[0] for line in text.splitlines() if " start " in line)
    assert len(starts) == 3 + 3 and set(starts.values()) == {1}, starts
    assert "[w0]" in r.stdout and "[w1]" in r.stdout
    storage = optuna.storages.RDBStorage(postgres_url)
    names = [s.study_name for s in storage.get_all_studies()]
    assert len(names) == 2
    for s in storage.get_all_studies():
        ts = storage.get_all_trials(s._study_id)
        want = 3 if not s.study_name.endswith(":final") else 3
        assert len(ts) == want and all(t.state.name == "COMPLETE" for t in ts)
        assert sorted(t.user_attrs["slot"] for t in ts) == list(range(want))
    rows = read_table(res).to_pylist()
    assert sorted(r["seed"] for r in rows) == [0, 1, 2]
    assert len({r["study"] for r in rows}) == 1 and len({r["trial"] for r in rows}) == 1
    assert all(PASSWORD not in (r["command"] or "") for r in rows)


def test_unreachable_postgres_is_a_usage_error(tmp_path, capsys):
    from mixzoo.cli import main
    spec = write_spec(tmp_path / "pg.toml", name="t-pg", models=["softmax"], trials=1, seeds=1)
    url = f"postgresql://mixzoo:{PASSWORD}@127.0.0.1:{_free_port()}/postgres"
    assert main(["--results", str(tmp_path / "res"), "sweep", str(spec), "--storage", url]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mixzoo: error: cannot reach storage")
    assert PASSWORD not in cap.err + cap.out and "***" in err
    assert not (tmp_path / "res" / "leaderboard").exists()


def test_processes_opening_a_new_database_at_once_all_open_it(postgres_url):
    """Two sweeps (or a sweep and a reader) started on a new database both create Optuna's tables;
    PostgreSQL lets one commit and fails the others on pg_type's unique index. Each must open the
    database anyway. Six openers at once on a fresh database, three times (without the retry in
    open_storage, five of the six failed on every round here)."""
    import threading

    import psycopg

    from mixzoo.sweeps.storage import open_storage
    for i in range(3):
        name = f"race{i}_{os.getpid()}"
        with psycopg.connect(postgres_url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        url = postgres_url.rsplit("/", 1)[0] + f"/{name}"
        errors: list[str] = []
        gate = threading.Barrier(6)

        def open_one(url=url, errors=errors, gate=gate):
            try:
                gate.wait()
                s = open_storage(url, log=errors.append)
                try:
                    assert s.get_all_studies() == []
                finally:
                    s.engine.dispose()
            except BaseException as e:  # noqa: BLE001 - reported below, with the database's message
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=open_one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert errors == [], errors
