"""Where a sweep's Optuna studies live: a journal file (one host) or an RDB URL (several hosts).

A storage argument is either a database URL (``postgresql://user:pw@host/db``, ``mysql://...``)
or a journal file (a plain path, or ``journal:PATH``). The default is a journal file under the
results directory. A password in a URL is masked (``***``) everywhere it is shown or stored.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import UsageError

DEFAULT_JOURNAL = "sweeps/optuna-journal.log"
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


def open_storage(storage: str):
    """An Optuna storage for ``storage`` (see :func:`resolve`); UsageError when unreachable."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not is_rdb(storage):
        from optuna.storages.journal import JournalFileBackend, JournalStorage
        path = Path(storage.removeprefix("journal:"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(path)))
        except OSError as e:
            raise UsageError(f"cannot open journal storage {str(path)!r}: {e.strerror or e}")
    kwargs: dict = {"pool_pre_ping": True}
    if storage.lower().startswith(("postgresql", "postgres")):
        kwargs["connect_args"] = {"connect_timeout": 10}
    elif storage.lower().startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30.0}
    try:
        return optuna.storages.RDBStorage(storage, engine_kwargs=kwargs, skip_compatibility_check=False)
    except ImportError as e:
        cause = e.__cause__ if isinstance(e.__cause__, ImportError) else e
        name = getattr(cause, "name", None) or "its driver"
        raise UsageError(f"storage {mask(storage)!r} needs the database driver {name!r}, which is not installed; "
                         f"allowed: pip install 'mixzoo[postgres]', or a journal file")
    except Exception as e:  # sqlalchemy OperationalError, ArgumentError, ...
        first = scrub(str(getattr(e, "orig", None) or e), storage).strip().splitlines()
        why = first[0] if first else type(e).__name__
        raise UsageError(f"cannot reach storage {mask(storage)!r}: {why}")
