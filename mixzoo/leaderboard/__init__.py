"""The Parquet leaderboard: schema, store, views. Knows nothing of training."""
from .schema import CORE, CURVES, SCHEMA_VERSION, declared_schema, schema_for
from .store import (
    curves_dir,
    files,
    leaderboard_dir,
    load,
    load_curves,
    read_curves,
    read_table,
    write_rows,
)

__all__ = ["CORE", "CURVES", "SCHEMA_VERSION", "curves_dir", "declared_schema", "files", "leaderboard_dir", "load",
           "load_curves", "read_curves", "read_table", "schema_for", "write_rows"]
