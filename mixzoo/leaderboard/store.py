"""The append-only Parquet store: ``<results>/leaderboard/suite=<s>/task=<t>/<run_id>.parquet``, and
beside it the runs' curves, ``<results>/curves/suite=<s>/task=<t>/<run_id>.parquet``.

Each finished run writes one file (and its curves first), under a temporary name, then renamed,
so a reader never sees half a file. Reading unifies the schemas of all files (older files with
fewer columns load, the missing columns are null) and skips a damaged file with a warning.

One schema for every reader. pandas and pyarrow (``pd.read_parquet(<results>/leaderboard)``,
``pyarrow.dataset``) take a dataset's schema from its *first* file in path order and drop the
columns that file lacks; polars does the same. Two things make every column readable as is:

1. every file is written with the whole declared schema (:func:`~.schema.declared_schema`: the core
   columns and a nullable typed column for every knob and hyperparameter the registry knows), so
   files written by one version agree column for column;
2. a *schema anchor*, ``leaderboard/suite=!schema/task=!schema/schema.parquet``: a file of zero rows
   whose schema is the union of every file's, rewritten (under a lock, renamed into place) whenever
   a file brings a column it lacks (a plugin's knob, a mechanism added later). ``!`` sorts before
   every suite name, so the anchor is the first file every reader sees, and its schema is the
   dataset's: a column a file lacks reads as null. It has no rows, so it adds none to any query;
   under pandas the partition columns are categoricals that list ``!schema`` among their categories.

The same union schema is also written as ``leaderboard/_common_metadata`` (the Parquet convention
Dask and Spark read). DuckDB needs neither: ``read_parquet(..., union_by_name=true)``.
"""
from __future__ import annotations

import contextlib
import os
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .schema import CORE, CURVES, PARTITION_KEYS, schema_for

ANCHOR_PART = "!schema"           # the anchor's partition value: sorts before any suite name
ANCHOR_NAME = "schema.parquet"
COMMON_METADATA = "_common_metadata"


def leaderboard_dir(results: str | Path) -> Path:
    return Path(results) / "leaderboard"


def curves_dir(results: str | Path) -> Path:
    return Path(results) / "curves"


def anchor_path(results: str | Path) -> Path:
    root = leaderboard_dir(results)
    for k in PARTITION_KEYS:
        root = root / f"{k}={ANCHOR_PART}"
    return root / ANCHOR_NAME


def _partition_dir(root: Path, row: dict) -> Path:
    d = root
    for k in PARTITION_KEYS:
        v = str(row[k])
        if "/" in v or v in ("", ".", "..") or v.startswith("!"):
            raise ValueError(f"bad partition value {k}={v!r}")
        d = d / f"{k}={v}"
    return d


def _write_atomic(table: pa.Table, path: Path) -> Path:
    """``table`` as Parquet at ``path``: a temporary name, then renamed (nothing left on failure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _array(values: list, field: pa.Field) -> tuple[pa.Array, pa.Field]:
    """The column at its declared type; a value that does not fit it types the column itself."""
    try:
        return pa.array(values, type=field.type), field
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        arr = pa.array(values)
        return arr, pa.field(field.name, arr.type)


def rows_table(rows: list[dict], columns: dict[str, tuple[type, ...]] | None = None) -> pa.Table:
    """The rows as one table of the declared schema (partition keys included)."""
    keys: dict = {}
    for r in rows:
        keys.update(r)
    schema = schema_for(keys, columns)
    arrays, fields = [], []
    for f in schema:
        arr, fld = _array([r.get(f.name) for r in rows], f)
        arrays.append(arr)
        fields.append(fld)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


# -- curves ----------------------------------------------------------------------------------

def curves_table(rows: list[dict]) -> pa.Table | None:
    """The ``history`` of each row (a list of {step, train_loss, <val metric>, diag/..., ...}) as the
    long curves table; None when no row has one."""
    out: dict[str, list] = {f.name: [] for f in CURVES}
    for r in rows:
        for h in r.get("history") or []:
            step = h.get("step")
            for k, v in h.items():
                if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                name = k if k in ("train_loss", "steps_per_s", "train_time_s") or k.startswith("diag/") else f"val/{k}"
                for col, val in (("run_id", r.get("run_id")), ("model", r.get("model")), ("seed", r.get("seed")),
                                 ("step", step), ("metric", name), ("value", float(v))):
                    out[col].append(val)
    if not out["run_id"]:
        return None
    return pa.table(out, schema=CURVES)


# -- the schema anchor ---------------------------------------------------------------------------

@contextlib.contextmanager
def _locked(d: Path):
    """An exclusive lock on the directory ``d`` (flock on its descriptor: no lock file is left)."""
    try:
        import fcntl
    except ImportError:         # not POSIX: no lock (a concurrent new column may be lost from the anchor)
        yield
        return
    fd = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)            # releases the lock


def _union(old: pa.Schema, new: pa.Schema) -> pa.Schema:
    try:
        return pa.unify_schemas([old, new], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):    # a clash: the anchor keeps its own type
        return pa.schema(list(old) + [f for f in new if f.name not in old.names])


def anchor_schema(results: str | Path) -> pa.Schema | None:
    p = anchor_path(results)
    if not p.is_file():
        return None
    try:
        return pq.read_schema(p)
    except Exception:
        return None


def update_anchor(results: str | Path, schema: pa.Schema) -> None:
    """Make the anchor's schema (and ``_common_metadata``) hold every column of ``schema``."""
    root = leaderboard_dir(results)
    root.mkdir(parents=True, exist_ok=True)
    have = anchor_schema(results)
    if have is not None and all(n in have.names for n in schema.names):
        return
    with _locked(root):
        have = anchor_schema(results)           # again, under the lock: another writer may have added
        want = schema if have is None else _union(have, schema)
        if have is not None and want.names == have.names:
            return
        want = pa.schema([f for f in want if f.name not in PARTITION_KEYS])
        _write_atomic(want.empty_table(), anchor_path(results))
        tmp = root / f".tmp-{uuid.uuid4().hex}-{COMMON_METADATA}"
        try:
            pq.write_metadata(want, tmp)
            os.replace(tmp, root / COMMON_METADATA)
        finally:
            if tmp.exists():
                tmp.unlink()


# -- writing ----------------------------------------------------------------------------------

def write_rows(results: str | Path, rows: list[dict], columns: dict[str, tuple[type, ...]] | None = None) -> Path:
    """Write the rows of one run (one or more seeds of one suite/task) as one file, with the declared
    ``columns`` (``knob_<k>``/``hp_<k>`` -> Python types; :func:`mixzoo.spec.known_columns`), and
    the rows' curves (their ``history``, if any) into the curves table first."""
    if not rows:
        raise ValueError("no rows to write")
    root = leaderboard_dir(results)
    d = _partition_dir(root, rows[0])
    for r in rows[1:]:
        if _partition_dir(root, r) != d:
            raise ValueError("rows of one file must share suite and task")
    table = rows_table(rows, columns).drop_columns(list(PARTITION_KEYS))
    name = f"{rows[0]['run_id']}.parquet"
    curves = curves_table(rows)
    curve_file = None
    if curves is not None:
        curve_file = _write_atomic(curves, _partition_dir(curves_dir(results), rows[0]) / name)
    try:
        update_anchor(results, table.schema)
        return _write_atomic(table, d / name)
    except BaseException:
        if curve_file is not None:       # no curves without their row
            with contextlib.suppress(OSError):
                curve_file.unlink()
        raise


# -- reading ----------------------------------------------------------------------------------

def _is_anchor(path: Path, root: Path) -> bool:
    return f"{PARTITION_KEYS[0]}={ANCHOR_PART}" in path.relative_to(root).parts


def files(results: str | Path) -> list[Path]:
    root = leaderboard_dir(results)
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith(".") and not _is_anchor(p, root))


def _partition_values(path: Path, root: Path) -> dict[str, str]:
    vals = {}
    for part in path.relative_to(root).parts[:-1]:
        if "=" in part:
            k, v = part.split("=", 1)
            vals[k] = v
    return vals


def _read_dir(root: Path, paths: list[Path], base: pa.Schema, warn, what: str) -> pa.Table:
    tables = []
    for p in paths:
        try:
            t = pq.read_table(p)
        except Exception as e:
            warn(f"skipping damaged {what} file {p}: {type(e).__name__}: {e}")
            continue
        for k, v in _partition_values(p, root).items():
            if k not in t.column_names:
                t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
        tables.append((p, t))
    # One file whose column types cannot merge with the others' is skipped, not fatal.
    schema, kept = base, []
    for p, t in tables:
        try:
            schema = pa.unify_schemas([schema, t.schema], promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as e:
            warn(f"skipping {what} file {p}: its column types clash with other files: {e}")
            continue
        kept.append((p, t))
    if not kept:
        return base.empty_table()
    names = base.names + [n for n in schema.names if n not in base.names]
    schema = pa.schema([schema.field(n) for n in names])
    out = []
    for p, t in kept:
        try:
            out.append(_conform(t, schema))
        except (pa.ArrowTypeError, pa.ArrowInvalid) as e:
            warn(f"skipping {what} file {p}: {type(e).__name__}: {e}")
    return pa.concat_tables(out) if out else base.empty_table()


def read_table(results: str | Path, warn=None) -> pa.Table:
    """All rows of the store as one Arrow table (empty, with CORE columns, when none); every column
    the store's anchor declares is there, null where a file lacks it."""
    warn = warn or (lambda msg: print(f"mixzoo: warning: {msg}", file=sys.stderr))
    root = leaderboard_dir(results)
    t = _read_dir(root, files(results), CORE, warn, "leaderboard")
    anchor = anchor_schema(results)
    if anchor is not None:
        for f in anchor:
            if f.name not in t.column_names:
                t = t.append_column(pa.field(f.name, f.type), pa.nulls(t.num_rows, f.type))
    return t


def curve_files(results: str | Path) -> list[Path]:
    root = curves_dir(results)
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith("."))


def read_curves(results: str | Path, *, run_ids=None, task: str | None = None, warn=None) -> pa.Table:
    """The curves table (suite, task, run_id, model, seed, step, metric, value), of the given row
    ids (or all) and task (or all)."""
    warn = warn or (lambda msg: print(f"mixzoo: warning: {msg}", file=sys.stderr))
    root = curves_dir(results)
    paths = [p for p in curve_files(results) if task is None or f"task={task}" in p.relative_to(root).parts]
    base = pa.schema([pa.field(k, pa.string()) for k in PARTITION_KEYS] + list(CURVES))
    t = _read_dir(root, paths, base, warn, "curves")
    if run_ids is not None:
        import pyarrow.compute as pc
        t = t.filter(pc.is_in(t["run_id"], value_set=pa.array(sorted(set(run_ids)), pa.string())))
    return t


def _pandas(t: pa.Table):
    """As a pandas DataFrame with nullable integer and boolean columns (no int -> float surprise)."""
    import pandas as pd
    mapping = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    return t.to_pandas(types_mapper=mapping.get)


def load(results: str | Path = "mixzoo-results", warn=None):
    """The whole store as a pandas DataFrame: one row per (run, seed), every column of the declared
    schema (nullable integers and booleans), damaged files skipped with a warning."""
    return _pandas(read_table(results, warn=warn))


def load_curves(results: str | Path = "mixzoo-results", *, run_ids=None, task: str | None = None, warn=None):
    """The runs' curves as a pandas DataFrame (suite, task, run_id, model, seed, step, metric, value);
    join to :func:`load` on ``run_id``."""
    return _pandas(read_curves(results, run_ids=run_ids, task=task, warn=warn))


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    cols = []
    for f in schema:
        if f.name in t.column_names:
            cols.append(t.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(t.num_rows, f.type))
    return pa.table(cols, schema=schema)
