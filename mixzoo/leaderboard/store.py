"""The append-only Parquet store: ``<results>/leaderboard/suite=<s>/task=<t>/<run_id>.parquet``.

Each finished run writes one file, first under a temporary name, then renamed, so a reader
never sees half a file. Reading unifies the schemas of all files (older files with fewer
columns load, the missing columns are null) and skips a damaged file with a warning.
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .schema import CORE, PARTITION_KEYS, schema_for


def leaderboard_dir(results: str | Path) -> Path:
    return Path(results) / "leaderboard"


def _partition_dir(root: Path, row: dict) -> Path:
    d = root
    for k in PARTITION_KEYS:
        v = str(row[k])
        if "/" in v or v in ("", ".", ".."):
            raise ValueError(f"bad partition value {k}={v!r}")
        d = d / f"{k}={v}"
    return d


def write_rows(results: str | Path, rows: list[dict]) -> Path:
    """Write the rows of one run (one or more seeds of one suite/task) as one file."""
    if not rows:
        raise ValueError("no rows to write")
    root = leaderboard_dir(results)
    d = _partition_dir(root, rows[0])
    for r in rows[1:]:
        if _partition_dir(root, r) != d:
            raise ValueError("rows of one file must share suite and task")
    keys = {}
    for r in rows:
        keys.update(r)
    schema = schema_for(keys)
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    table = pa.table(cols, schema=schema)
    table = table.drop_columns(list(PARTITION_KEYS))
    d.mkdir(parents=True, exist_ok=True)
    name = f"{rows[0]['run_id']}.parquet"
    tmp = d / f".tmp-{uuid.uuid4().hex}-{name}"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, d / name)
    finally:
        if tmp.exists():
            tmp.unlink()
    return d / name


def files(results: str | Path) -> list[Path]:
    root = leaderboard_dir(results)
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith("."))


def _partition_values(path: Path, root: Path) -> dict[str, str]:
    vals = {}
    for part in path.relative_to(root).parts[:-1]:
        if "=" in part:
            k, v = part.split("=", 1)
            vals[k] = v
    return vals


def read_table(results: str | Path, warn=None) -> pa.Table:
    """All rows of the store as one Arrow table (empty, with CORE columns, when none)."""
    warn = warn or (lambda msg: print(f"mixzoo: warning: {msg}", file=sys.stderr))
    root = leaderboard_dir(results)
    tables = []
    for p in files(results):
        try:
            t = pq.read_table(p)
        except Exception as e:
            warn(f"skipping damaged leaderboard file {p}: {type(e).__name__}: {e}")
            continue
        for k, v in _partition_values(p, root).items():
            if k not in t.column_names:
                t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
        tables.append((p, t))
    # One file whose column types cannot merge with the others' is skipped, not fatal.
    schema, kept = CORE, []
    for p, t in tables:
        try:
            schema = pa.unify_schemas([schema, t.schema], promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as e:
            warn(f"skipping leaderboard file {p}: its column types clash with other files: {e}")
            continue
        kept.append((p, t))
    if not kept:
        return CORE.empty_table()
    # put CORE columns first, in declared order
    names = CORE.names + [n for n in schema.names if n not in CORE.names]
    schema = pa.schema([schema.field(n) for n in names])
    out = []
    for p, t in kept:
        try:
            out.append(_conform(t, schema))
        except (pa.ArrowTypeError, pa.ArrowInvalid) as e:
            warn(f"skipping leaderboard file {p}: {type(e).__name__}: {e}")
    return pa.concat_tables(out) if out else CORE.empty_table()


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = []
    for f in schema:
        if f.name in t.column_names:
            cols.append(t.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(t.num_rows, f.type))
    return pa.table(cols, schema=schema)
