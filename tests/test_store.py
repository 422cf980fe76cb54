import datetime as dt
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mixzoo.leaderboard import CORE, files, read_table, write_rows
from mixzoo.leaderboard.schema import schema_for


def _row(**over):
    r = {name: None for name in CORE.names}
    r.update(schema_version=1, run_id="abc-s0", created_at=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
             suite="mqar", task="mqar", task_version=1, model="lla", backend="torch", seed=0,
             metric_name="accuracy", metric_value=0.75, higher_is_better=True, val_metric_value=0.7,
             state="COMPLETE", knobs_json=json.dumps({"V": 64}), hparams_json="{}", steps=10,
             params=123, knob_V=64, knob_filler="vocab", hp_ridge=1.5)
    r.update(over)
    return r


def test_row_round_trips_with_its_schema(results):
    row = _row()
    path = write_rows(results, [row, _row(run_id="abc-s1", seed=1, metric_value=0.5)])
    assert path.parent.name == "task=mqar" and path.parent.parent.name == "suite=mqar"
    raw = pq.read_table(path)
    assert "suite" not in raw.column_names            # partition keys live in the path
    assert raw.schema.field("knob_V").type == pa.int64()
    assert raw.schema.field("hp_ridge").type == pa.float64()
    t = read_table(results)
    assert t.num_rows == 2
    back = t.to_pylist()[0]
    for k, v in row.items():
        assert back[k] == v, k
    for f in schema_for(row):
        assert t.schema.field(f.name).type == f.type


def test_no_temporary_files_left_and_bad_partition_rejected(results):
    write_rows(results, [_row()])
    # the row's file, and the store's schema (its anchor and _common_metadata); nothing temporary
    assert sorted(p.name for p in (results / "leaderboard").rglob("*") if p.is_file()) == \
        ["_common_metadata", "abc-s0.parquet", "schema.parquet"]
    with pytest.raises(ValueError):
        write_rows(results, [_row(task="../x")])
    with pytest.raises(ValueError):
        write_rows(results, [_row(), _row(task="other")])


def test_older_files_and_damaged_files(results):
    write_rows(results, [_row()])
    # an older file without the knob/hp columns still loads, with nulls
    old = {k: v for k, v in _row(run_id="old-s0").items() if not k.startswith(("knob_", "hp_"))}
    write_rows(results, [old])
    bad = results / "leaderboard" / "suite=mqar" / "task=mqar" / "broken.parquet"
    bad.write_bytes(b"PAR1 not really")
    warnings = []
    t = read_table(results, warn=warnings.append)
    assert t.num_rows == 2 and len(files(results)) == 3
    assert len(warnings) == 1 and "broken.parquet" in warnings[0]
    by_id = {r["run_id"]: r for r in t.to_pylist()}
    assert by_id["old-s0"]["knob_V"] is None and by_id["abc-s0"]["knob_V"] == 64


def test_empty_store(results):
    t = read_table(results)
    assert t.num_rows == 0 and t.schema.names == CORE.names
