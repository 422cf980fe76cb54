"""The Parquet leaderboard: schema, store, views. Knows nothing of training."""
from .schema import CORE, SCHEMA_VERSION, schema_for
from .store import files, leaderboard_dir, read_table, write_rows

__all__ = ["CORE", "SCHEMA_VERSION", "files", "leaderboard_dir", "read_table", "schema_for",
           "write_rows"]
