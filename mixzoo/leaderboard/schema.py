"""The leaderboard's declared, versioned Arrow schema.

A row is one (run, seed) result on the test split. Core columns are fixed here; task knobs
become typed columns ``knob_<name>`` and mechanism knobs ``hp_<name>`` (all nullable), and
every knob and hyperparameter is also kept whole in ``knobs_json`` / ``hparams_json``.
New columns are only ever added, nullable; ``schema_version`` says which set a file has.
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 3

# Partition keys: encoded in the directory path (suite=<s>/task=<t>/), not in the files.
PARTITION_KEYS = ("suite", "task")

CORE = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("suite", pa.string()),
    ("task", pa.string()),
    ("task_version", pa.int32()),
    ("preset", pa.string()),
    ("model", pa.string()),
    ("backend", pa.string()),
    ("recipe", pa.string()),
    ("seed", pa.int64()),
    ("metric_name", pa.string()),
    ("metric_value", pa.float64()),
    ("higher_is_better", pa.bool_()),
    ("val_metric_value", pa.float64()),
    ("state", pa.string()),              # COMPLETE | FAIL | PRUNED
    ("state_reason", pa.string()),
    ("study", pa.string()),
    ("trial", pa.int64()),
    ("knobs_json", pa.string()),
    ("hparams_json", pa.string()),
    ("metrics_json", pa.string()),       # every test metric, slices included
    ("val_metrics_json", pa.string()),
    ("lr", pa.float64()),
    ("weight_decay", pa.float64()),
    ("optimizer", pa.string()),          # adamw | muon (schema 2)
    ("schedule", pa.string()),           # cosine | wsd (schema 2)
    ("diagnostics_json", pa.string()),   # the mechanism's diagnostics at the last validation (schema 2)
    ("batch_size", pa.int64()),
    ("steps", pa.int64()),
    ("best_step", pa.int64()),
    ("d_model", pa.int64()),
    ("n_layers", pa.int64()),
    ("num_heads", pa.int64()),
    ("params", pa.int64()),
    ("state_size", pa.int64()),
    ("wall_time_s", pa.float64()),
    ("train_time_s", pa.float64()),
    ("steps_per_s", pa.float64()),
    ("tokens_per_s", pa.float64()),
    ("peak_mem_bytes", pa.int64()),
    ("git_sha", pa.string()),
    ("git_dirty", pa.bool_()),
    ("mixzoo_version", pa.string()),
    ("python", pa.string()),
    ("torch", pa.string()),
    ("triton", pa.string()),
    ("fla", pa.string()),
    ("device_name", pa.string()),
    ("hostname", pa.string()),
    ("command", pa.string()),
    ("allow_noncausal", pa.bool_()),     # given --allow-noncausal: the causality check did not gate the run (schema 3)
])


def arrow_type(value) -> pa.DataType:
    if value is None:   # typed by the first file that has a value; null merges with any type
        return pa.null()
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def schema_for(row: dict) -> pa.Schema:
    """CORE plus the typed knob_/hp_ columns present in ``row``."""
    extra = [pa.field(k, arrow_type(v)) for k, v in row.items()
             if (k.startswith("knob_") or k.startswith("hp_")) and k not in CORE.names]
    return pa.schema(list(CORE) + extra)
