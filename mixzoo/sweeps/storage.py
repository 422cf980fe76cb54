"""Where a sweep's Optuna studies live: a journal file (one host) or an RDB URL (several hosts).

A storage argument is either a database URL (``postgresql://user:pw@host/db``, ``mysql://...``)
or a journal file (a plain path, or ``journal:PATH``). The default is a journal file under the
results directory. A password in a URL is masked (``***``) everywhere it is shown or stored.

Faults the storage itself absorbs (see README "Sweeps", reliability):

* a journal whose last record was cut by a crash mid-write is repaired before Optuna reads it
  (the record dropped, the damaged file kept beside it); damage followed by valid records is
  refused (UsageError: one line, exit code 2), nothing changed;
* a journal append that fails (a full disk) is undone, so no half record is left for the next
  append to glue onto, and surfaces as :class:`StorageError`;
* a database call that fails on a lost connection (a server restart) is retried with backoff
  for ``MIXZOO_STORAGE_RETRY_S`` seconds (default 300), then surfaces as :class:`StorageError`;
* two processes opening a new database at once both try to create Optuna's tables: the one
  that loses that race opens it again once the other has committed them.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError

DEFAULT_JOURNAL = "sweeps/optuna-journal.log"
RETRY_ENV = "MIXZOO_STORAGE_RETRY_S"
DEFAULT_RETRY_S = 300.0
EXIT_STORAGE = 75   # EX_TEMPFAIL: the storage (or the results disk) failed; rerunning resumes


class StorageError(Exception):
    """The sweep can no longer write (or reach) its storage or its results directory: a database
    down for longer than the retry window, a full disk under the journal or the leaderboard. The
    worker stops with this one-line message (exit code 75); rerunning the same command resumes."""
RDB_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite", "mariadb")
# scheme://user:password@ -> scheme://user:***@ (also inside longer text, e.g. a command line)
_CRED = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?P<tail>@)")


def mask(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _CRED.sub(lambda m: f"{m['head']}***{m['tail']}", str(text))


def _password(url: str) -> str | None:
    m = _CRED.search(url)
    return m["pw"] if m and m["pw"] else None


def scrub(text: str, url: str | None) -> str:
    """Mask URLs in ``text`` and also any bare occurrence of ``url``'s password."""
    out = mask(text)
    pw = _password(url or "")
    if pw:
        from urllib.parse import unquote
        for p in {pw, unquote(pw)}:
            if p:
                out = out.replace(p, "***")
    return out


def is_rdb(url: str) -> bool:
    return "://" in url and url.split("://", 1)[0].split("+", 1)[0].lower() in RDB_SCHEMES


def resolve(storage: str | None, results: str | Path) -> str:
    """The storage string to use: the given one, or the default journal under ``results``."""
    if not storage:
        return f"journal:{Path(results) / DEFAULT_JOURNAL}"
    if "://" in storage and not is_rdb(storage):
        scheme = storage.split("://", 1)[0]
        raise UsageError(f"unsupported storage scheme {scheme!r} in {mask(storage)!r}; allowed: "
                         f"{', '.join(RDB_SCHEMES[:3])} URLs, or a journal file path (journal:PATH)")
    if is_rdb(storage):
        return storage
    return storage if storage.startswith("journal:") else f"journal:{storage}"


def check_parallel(storage: str, workers: int) -> None:
    if storage.lower().startswith("sqlite") and workers > 1:
        raise UsageError(f"storage {mask(storage)!r} is SQLite, which cannot serve {workers} parallel "
                         f"workers; allowed: a journal file (the default) or a PostgreSQL URL")


def retry_window() -> float:
    """Seconds a worker keeps retrying an unreachable database (env ``MIXZOO_STORAGE_RETRY_S``)."""
    v = os.environ.get(RETRY_ENV)
    if v is None or not v.strip():
        return DEFAULT_RETRY_S
    try:
        s = float(v)
    except ValueError:
        s = -1.0
    if not s >= 0:
        raise UsageError(f"{RETRY_ENV}={v!r} is not allowed; allowed: a number of seconds >= 0")
    return s


def say(line: str, stream=None) -> None:
    """Write ``line`` and its newline in one write, then flush (stderr by default).

    A sweep's workers share the coordinator's stdout and stderr. ``print`` writes the text and the
    newline separately, and with PYTHONUNBUFFERED (our GPU scripts set it) each is its own system
    call: two workers' lines then run into one. One write of a line under PIPE_BUF is atomic."""
    stream = sys.stderr if stream is None else stream
    stream.write(line + "\n")
    stream.flush()


def _stderr(msg: str) -> None:
    say(f"mixzoo: {msg}")


def open_storage(storage: str, *, log: Callable[[str], None] | None = None, retry_s: float = 0.0):
    """An Optuna storage for ``storage`` (see :func:`resolve`); UsageError when unreachable.

    A journal is checked (and a torn last record repaired, see :func:`check_journal`) first. A
    database that cannot be reached is retried for ``retry_s`` seconds, then StorageError: the
    window of the workers a sweep starts, whose URL the coordinator's own connection has vouched
    for. With ``retry_s`` 0 (the command a user typed) a wrong or unreachable URL is a
    UsageError at once. ``log`` gets the one-line notes (a journal repaired, a database lost and
    back); default stderr.
    """
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    log = log or _stderr
    if not is_rdb(storage):
        from optuna.storages.journal import JournalStorage
        path = Path(storage.removeprefix("journal:"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            check_journal(path, log)
            return JournalStorage(journal_file_class()(str(path)))
        except OSError as e:
            raise UsageError(f"cannot open journal storage {str(path)!r}: {e.strerror or e}")
    kwargs: dict = {"pool_pre_ping": True}
    if storage.lower().startswith(("postgresql", "postgres")):
        kwargs["connect_args"] = {"connect_timeout": 10}
    elif storage.lower().startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30.0}
    window = retry_window()
    deadline, delay, races = time.monotonic() + retry_s, 0.25, 0
    while True:
        try:
            s = retrying_rdb_class()(storage, engine_kwargs=kwargs, skip_compatibility_check=False)
            s.retry_s, s.log = window, log
            return s
        except ImportError as e:
            cause = e.__cause__ if isinstance(e.__cause__, ImportError) else e
            name = getattr(cause, "name", None) or "its driver"
            raise UsageError(f"storage {mask(storage)!r} needs the database driver {name!r}, which is not installed; "
                             f"allowed: pip install 'mixzoo[postgres]', or a journal file")
        except Exception as e:  # sqlalchemy OperationalError, ArgumentError, ...
            if _schema_race(e) and races < SCHEMA_RACE_TRIES:
                # another process is creating the tables of this (new) database right now; once its
                # transaction commits, Optuna's create_all finds them and skips them
                races += 1
                time.sleep(random.uniform(0.05, 0.25) * races)
                continue
            if _transient(e) and retry_s > 0:
                if time.monotonic() + delay < deadline:
                    time.sleep(delay)
                    delay = min(2 * delay, 5.0)
                    continue
                raise StorageError(f"storage {mask(storage)} unreachable for {retry_s:.0f} s ({_why(e, storage)}); "
                                   f"this worker stopped; rerun the same command once it is back "
                                   f"({RETRY_ENV} sets how long to wait)") from e
            raise UsageError(f"cannot reach storage {mask(storage)!r}: {_why(e, storage)}")


def _why(e: BaseException, url: str | None) -> str:
    """The first line of the database's own message (the DBAPI error), passwords masked."""
    first = scrub(str(getattr(e, "orig", None) or getattr(e.__cause__, "orig", None) or e.__cause__ or e),
                  url).strip().splitlines()
    return first[0].strip() if first else type(e).__name__


# ---------------------------------------------------------------------------- interrupts
_held = 0                               # main thread: depth of the sections an interrupt must not cut
_pending: BaseException | None = None   # the interrupt that arrived meanwhile
_requested: type[BaseException] | None = None   # the interrupt a signal asked for, kept until cleared


@contextlib.contextmanager
def uninterrupted():
    """A section that Ctrl-C or SIGTERM must not cut (a journal append holding the journal's lock:
    cut, it leaves the lock behind and every worker waits 30 s for it to expire). An interrupt
    that arrives meanwhile, through :func:`interrupt`, is raised when the section ends."""
    global _held, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if _held == 0 and _pending is not None:
            exc, _pending = _pending, None
            raise exc


def interrupt(exc: BaseException) -> None:
    """What a signal handler calls: raise ``exc`` now, or when the :func:`uninterrupted` section
    under way ends. It is also kept for :func:`raise_if_interrupted`."""
    global _pending, _requested
    _requested = _requested or type(exc)
    if _held:
        _pending = _pending or exc
        return
    raise exc


def raise_if_interrupted() -> None:
    """Raise (again) the interrupt a signal asked for, if one did. An exception raised from a signal
    handler goes wherever the main thread is, and code there may swallow it: torch's C++ import of
    NumPy clears any error, so a SIGTERM landing in that import, at a worker's first trial, was lost
    and the worker trained on. The sweep's worker calls this at its safe points (before it claims,
    at each validation), so such an interrupt still stops it, at the next one."""
    if _requested is not None and not _held:
        raise _requested()


def clear_interrupt() -> None:
    """Forget an interrupt asked for (a command starting, or done with it, in this process)."""
    global _pending, _requested
    _pending = _requested = None


# ---------------------------------------------------------------------------- journal file
def _record_problem(line: bytes) -> str | None:
    """What is wrong with one journal line (None: a sound record)."""
    if not line.endswith(b"\n"):
        return "incomplete record (no end of line)"
    try:
        rec = json.loads(line)
    except ValueError:
        return "not a JSON record"
    if not isinstance(rec, dict) or "op_code" not in rec:
        return "not a journal record"
    return None


def _scan(path: Path) -> dict | None:
    """The first bad line of the journal: its byte offset, record number, the problem, and how
    many lines (sound ones) follow it; None when every line is a sound record."""
    bad, pos = None, 0
    with open(path, "rb") as f:
        for n, line in enumerate(f):
            if bad is None:
                why = _record_problem(line)
                if why is not None:
                    bad = {"pos": pos, "record": n + 1, "why": why, "after": 0, "sound_after": 0}
            else:
                bad["after"] += 1
                bad["sound_after"] += _record_problem(line) is None
            pos += len(line)
    if bad is not None:
        bad["size"] = pos
    return bad


def check_journal(path: Path, log: Callable[[str], None] = _stderr) -> None:
    """Make the journal at ``path`` safe for Optuna to read and append to, before it opens it.

    Optuna's JournalFileBackend silently skips a last line without an end of line, but its next
    append glues a record onto that half record, and every later read of the file then fails
    with a JSONDecodeError. So: a bad *last* record (a crash mid-write) is dropped, the damaged
    file is kept as ``<name>.damaged-<time>`` beside it, and one line says so. A bad record with
    lines after it is not a torn write: UsageError naming the byte offset and how to recover;
    nothing is changed.
    """
    if not path.is_file() or path.stat().st_size == 0 or _scan(path) is None:
        return
    from optuna.storages.journal import JournalFileSymlinkLock
    # A half line may be another worker's append in progress: look again holding the journal's
    # lock (the one Optuna's appends take; a lock left by a killed writer expires after 30 s).
    lock = JournalFileSymlinkLock(str(path))
    with uninterrupted():
        lock.acquire()
        try:
            bad = _scan(path)
            if bad is None:
                return
            pos = bad["pos"]
            if bad["after"]:
                raise UsageError(
                f"journal {str(path)!r} is damaged at byte {pos} (record {bad['record']}: {bad['why']}), with "
                    f"{bad['sound_after']} valid record(s) after it; nothing was changed. To recover, restore a "
                    f"copy of the file, or keep the {bad['record'] - 1} records before the damage with "
                    f"'cp {path} {path}.bak && truncate -s {pos} {path}' (the sweep then reruns what was recorded "
                    f"after it)")
            backup = _repair(path, pos)
        finally:
            lock.release()
    log(f"journal {path}: dropped its incomplete last record ({bad['size'] - pos} bytes at byte {pos}, "
        f"a write cut short); the damaged file is kept as {backup.name}")


def _repair(path: Path, keep: int) -> Path:
    """Keep the first ``keep`` bytes of ``path`` (written to a temporary name, then renamed over
    it) and the damaged file under a new name; the path of that copy."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup, i = path.with_name(f"{path.name}.damaged-{stamp}"), 1
    while backup.exists():
        i += 1
        backup = path.with_name(f"{path.name}.damaged-{stamp}-{i}")
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            left = keep
            while left:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    break
                dst.write(chunk)
                left -= len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        try:
            os.link(path, backup)          # the damaged bytes, as they are, under the new name
        except OSError:
            import shutil
            btmp = path.with_name(f".{backup.name}.tmp-{uuid.uuid4().hex}")
            try:
                shutil.copyfile(path, btmp)
                os.replace(btmp, backup)
            finally:
                btmp.unlink(missing_ok=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return backup


@functools.cache
def journal_file_class():
    """:class:`JournalFile` (built on first use: Optuna is imported only then)."""
    from optuna.storages.journal import JournalFileBackend

    class JournalFile(JournalFileBackend):
        """Optuna's journal file whose failed append leaves nothing behind.

        Optuna writes a record with a buffered write; on a full disk part of it lands in the file and
        the rest is lost, and the next append (once space is freed) glues onto that half record,
        damaging the journal mid-file. Here an append that fails is truncated back to where it began
        (under the journal's lock, so no other writer is in between) and surfaces as StorageError;
        and Ctrl-C or SIGTERM waits until the append is done and the lock released.
        """

        def append_logs(self, logs: list[dict]) -> None:
            data = ("\n".join(json.dumps(x, separators=(",", ":")) for x in logs) + "\n").encode("utf-8")
            with uninterrupted():
                try:
                    self._lock.acquire()
                except OSError as e:    # the lock is a symlink beside the journal: a full disk may refuse it
                    raise StorageError(f"cannot lock the sweep journal {self._file_path}: {e.strerror or e}; "
                                       f"free space (or fix the disk) and rerun the same command to resume") from e
                try:
                    self._append(data)
                finally:
                    self._lock.release()

        def _append(self, data: bytes) -> None:
            fd = os.open(self._file_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError as e:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                    raise StorageError(f"cannot write the sweep journal {self._file_path}: {e.strerror or e}; "
                                       f"free space (or fix the disk) and rerun the same command to resume") from e
            finally:
                os.close(fd)

    return JournalFile


# ---------------------------------------------------------------------------- database
SCHEMA_RACE_TRIES = 20   # attempts to open a database whose tables another process is creating


def _chain_has(e: BaseException, test: Callable) -> bool:
    """True when ``test(x, sqlalchemy.exc)`` holds for an exception ``x`` anywhere in ``e``'s chain
    (Optuna wraps SQLAlchemy's errors in its own); False without SQLAlchemy."""
    try:
        import sqlalchemy.exc as sa
    except ImportError:
        return False
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if test(x, sa):
            return True
        x = x.__cause__ or x.__context__
    return False


def _schema_race(e: BaseException) -> bool:
    """True when opening a database failed because another process was creating Optuna's tables
    in it at the same moment (two sweeps, or a sweep and a reader, started on a new database):
    PostgreSQL's ``duplicate key value violates unique constraint "pg_type_typname_nsp_index"``
    or ``relation ... already exists``, MySQL's ``Table ... already exists``, or the same row of
    Optuna's version table inserted twice. Opening again, after the other side's commit, works."""
    def race(x, sa) -> bool:
        if not isinstance(x, sa.DBAPIError):
            return False
        text = str(x.orig if x.orig is not None else x).lower()
        return ("already exists" in text
                or (isinstance(x, sa.IntegrityError) and ("duplicate" in text or "unique" in text)))
    return _chain_has(e, race)


def _transient(e: BaseException) -> bool:
    """True for a lost or refused database connection (the server restarting, down, or out of
    connections), anywhere in ``e``'s chain."""
    return _chain_has(e, lambda x, sa: isinstance(x, (sa.OperationalError, sa.InterfaceError, sa.DisconnectionError,
                                                      sa.TimeoutError))
                      or (isinstance(x, sa.DBAPIError) and x.connection_invalidated))


@functools.cache
def retrying_rdb_class():
    """:class:`RetryingRDBStorage` (built on first use: SQLAlchemy is imported only then)."""
    from optuna.storages import RDBStorage

    class RetryingRDBStorage(RDBStorage):
        """Optuna's RDBStorage whose calls outlive a database restart.

        ``pool_pre_ping`` (set in :func:`open_storage`) replaces a pooled connection that died while
        idle, but a call made while the server is down, or on a connection the restart cut
        mid-call, still raises. Optuna has no retry of its own, and its heartbeat and
        RetryFailedTrialCallback only act inside ``study.optimize`` and only fail the trial (the
        engine claims trials itself, for the journal too, and wants the trial kept). So each call
        that fails on a lost connection is retried here with exponential backoff for ``retry_s``
        seconds, then raises StorageError. Only the outermost call retries (Optuna's methods call
        each other). A retried write whose first attempt did commit is harmless to the engine: a
        state already set reads as a lost race, an attribute is set twice, a trial enqueued twice
        is a duplicate slot the engine retires.
        """

        retry_s: float = 0.0
        log: Callable[[str], None] | None = None
        _local = threading.local()
        _outage = threading.Lock()
        _down_since: float | None = None

        def _call(self, fn, *args, **kwargs):
            if getattr(self._local, "depth", 0):
                return fn(self, *args, **kwargs)
            self._local.depth = 1
            try:
                deadline, delay = None, 0.25
                while True:
                    try:
                        out = fn(self, *args, **kwargs)
                    except Exception as e:
                        if not _transient(e):
                            raise
                        now = time.monotonic()
                        deadline = deadline or now + self.retry_s
                        self._down(e)
                        if now >= deadline:
                            raise StorageError(
                                f"storage {mask(self.url)} unreachable for {self.retry_s:.0f} s ({_why(e, self.url)}); "
                                f"this worker stopped; rerun the same command once it is back "
                                f"({RETRY_ENV} sets how long to wait)") from e
                        with contextlib.suppress(Exception):
                            self.remove_session()
                        time.sleep(min(delay, max(deadline - now, 0.0)))
                        delay = min(2 * delay, 5.0)
                        continue
                    if self._down_since is not None:
                        self._up()
                    return out
            finally:
                self._local.depth = 0

        def _down(self, e: BaseException) -> None:
            with self._outage:
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    (self.log or _stderr)(f"storage {mask(self.url)} unreachable ({_why(e, self.url)}); "
                                          f"retrying for up to {self.retry_s:.0f} s")

        def _up(self) -> None:
            with self._outage:
                if self._down_since is not None:
                    (self.log or _stderr)(f"storage reachable again after {time.monotonic() - self._down_since:.1f} s")
                    self._down_since = None

    def _retrying(name: str):
        inner = getattr(RDBStorage, name)

        def call(self, *args, **kwargs):
            return self._call(inner, *args, **kwargs)
        call.__name__ = call.__qualname__ = name
        call.__doc__ = inner.__doc__
        return call

    # every method that talks to the database, including the private ones Optuna's _CachedStorage calls
    for _name in ("create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
                  "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
                  "get_study_system_attrs", "get_trial_user_attrs", "get_trial_system_attrs", "get_all_studies",
                  "create_new_trial", "_create_new_trial", "set_trial_param", "_set_trial_param", "get_trial_param",
                  "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr",
                  "set_trial_system_attr", "get_trial_id_from_study_id_trial_number", "get_trial_number_from_id",
                  "get_trial", "get_all_trials", "_get_trials", "get_best_trial", "_get_best_trial_id", "get_n_trials",
                  "get_trial_params", "record_heartbeat", "_get_stale_trial_ids"):
        if hasattr(RetryingRDBStorage, _name):
            setattr(RetryingRDBStorage, _name, _retrying(_name))
    return RetryingRDBStorage
