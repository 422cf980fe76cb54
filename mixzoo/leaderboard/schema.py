"""The leaderboard's declared, versioned Arrow schema, and the curves table's.

A row is one (run, seed) result on the test split. Core columns are fixed here (:data:`CORE`); task
knobs become typed columns ``knob_<name>`` and hyperparameters ``hp_<name>`` (trainer and backbone
keys and mechanism knobs, flat as ``--hp`` names them; all nullable), and every knob and
hyperparameter is also kept whole in ``knobs_json`` / ``hparams_json`` and the whole run spec in
``spec_json``. New columns are only ever added, nullable; ``schema_version`` says which set a file
has.

The typed ``knob_``/``hp_`` columns are declared by the writer's caller from the registry (every
registered task's knobs, every trainer/backbone key, every registered mechanism's knobs:
:func:`mixzoo.spec.known_columns`) and every file is written with all of them
(:func:`declared_schema`): so a knob that one run leaves unset is a null in its file, not a column
missing from it. A column a file does not have (a mechanism registered later, a plugin) reads as
null for every reader by the store's schema anchor (see ``store.py``).
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 6   # 5: gpu; 6: kernels

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
    ("gpu", pa.string()),                # the GPU trained on as the host names it (CUDA_VISIBLE_DEVICES entry; schema 5)
    ("kernels", pa.string()),            # mixzoo's backbone kernels that ran, e.g. "rmsnorm,rope,swiglu"; null: none (schema 6)
    ("hostname", pa.string()),
    ("command", pa.string()),
    ("allow_noncausal", pa.bool_()),     # given --allow-noncausal: the causality check did not gate the run (schema 3)
    ("setting", pa.string()),            # the task setting's label, the same text in every view (schema 4)
    ("spec_json", pa.string()),          # the whole run spec: task, knobs, mechanism, backbone, trainer, seed (schema 4)
    ("spec_hash", pa.string()),          # its content hash (schema 4)
    ("config_hash", pa.string()),        # the content hash without the seed: one per configuration (schema 4)
    ("search_space_json", pa.string()),  # what was searched: the study's space, else the mechanism's registered one (schema 4)
])

# The curves table, <results>/curves/suite=<s>/task=<t>/<run>.parquet: one row per (run id, step,
# metric), long, so that any metric or diagnostic fits one fixed schema. ``run_id`` is the row's.
CURVES_VERSION = 1
CURVES = pa.schema([
    ("run_id", pa.string()),
    ("model", pa.string()),
    ("seed", pa.int64()),
    ("step", pa.int64()),
    ("metric", pa.string()),             # train_loss, val/<metric>, diag/layer<i>/<name>, steps_per_s, train_time_s
    ("value", pa.float64()),
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


_BY_TYPES = {frozenset({bool}): pa.bool_(), frozenset({int}): pa.int64(), frozenset({float}): pa.float64(),
             frozenset({int, float}): pa.float64(), frozenset({str}): pa.string(),
             frozenset({str, bool}): pa.string()}      # TrainConfig.compile: a mode name (a bool is read as one)


def arrow_type_for(types: tuple[type, ...]) -> pa.DataType | None:
    """The column type of a declared Python type (None among them: nullable, as every column is)."""
    return _BY_TYPES.get(frozenset(t for t in types if t is not type(None)))


def declared_schema(columns: dict[str, tuple[type, ...]] | None = None) -> pa.Schema:
    """CORE plus the declared typed columns (``knob_<k>``, ``hp_<k>`` -> Python types), sorted."""
    extra = []
    for name in sorted(columns or {}):
        t = arrow_type_for(columns[name])
        if t is not None and name not in CORE.names:
            extra.append(pa.field(name, t))
    return pa.schema(list(CORE) + extra)


def schema_for(row: dict, columns: dict[str, tuple[type, ...]] | None = None) -> pa.Schema:
    """The declared schema, plus the knob_/hp_ columns of ``row`` it does not declare (typed by value)."""
    base = declared_schema(columns)
    extra = [pa.field(k, arrow_type(v)) for k, v in row.items()
             if (k.startswith("knob_") or k.startswith("hp_")) and k not in base.names]
    return pa.schema(list(base) + extra)
