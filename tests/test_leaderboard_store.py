"""A leaderboard built from real tiny CPU runs, shared by the leaderboard tests; and the store
read as is by pandas and DuckDB, old files, damaged files."""
from __future__ import annotations

import copy
import json
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mixzoo.leaderboard import read_table, write_rows

# MQAR: 2 settings (kv); softmax at 2 learning rates, LLA at 1; 2 seeds each; all really trained.
SEEDS = [0, 1]
HP = dict(steps=8, d_model=8, num_heads=1, batch_size=16, n_train=64, n_val=32, n_test=32, eval_every=4)
GRID = [(m, lr, kv) for kv in (2, 4) for m, lr in (("softmax", 3e-2), ("softmax", 1e-3), ("lla", 3e-2))]
MAD = ("mad-recall", "mad-fuzzy-recall", "mad-selective-copy", "mad-memorization")   # 4 of the 6

_CACHE: dict[str, Path] = {}


def real_store(base: Path) -> Path:
    """A results dir with the GRID's rows (built once per test session)."""
    if "real" not in _CACHE:
        from mixzoo.api import run
        res = base / "real-results"
        for model, lr, kv in GRID:
            run("mqar", model, knobs=dict(V=16, L=16, kv=kv), hparams=dict(HP, lr=lr), seeds=SEEDS, results=res,
                device="cpu", command=f"test: mqar {model} lr={lr} kv={kv}")
        _CACHE["real"] = res
    return _CACHE["real"]


def rows_of(results: Path) -> list[dict]:
    return read_table(results).to_pylist()


def clone(row: dict, **over) -> dict:
    """A copy of ``row`` without its knob columns, with ``over`` applied."""
    r = {k: copy.deepcopy(v) for k, v in row.items() if not k.startswith("knob_")}
    r.update(over)
    return r


def add_mad_rows(results: Path, template: dict) -> list[dict]:
    """MAD rows made from a real row's columns, with chosen numbers (the MAD tasks are not
    registered yet): 4 tasks x 2 settings x 2 mechanisms x 2 configs x 2 seeds."""
    out = []
    for ti, task in enumerate(MAD):
        for vocab in (16, 32):
            for mi, model in enumerate(("softmax", "lla")):
                for ci, lr in enumerate((1e-3, 1e-4)):
                    run = uuid.uuid4().hex[:12]
                    rows = []
                    for seed in (0, 1):
                        base = 0.3 + 0.1 * ti + 0.05 * mi - 0.1 * ci + (0.02 if vocab == 16 else 0.0)
                        rows.append(clone(template, suite="mad", task=task, model=model, seed=seed,
                                          run_id=f"{run}-s{seed}", study=None, trial=None,
                                          knobs_json=json.dumps({"seq_len": 64, "vocab_size": vocab}),
                                          hparams_json=json.dumps({"lr": lr, "weight_decay": 0.0}), lr=lr,
                                          metric_value=base + 0.01 * seed, val_metric_value=base - 0.01 * seed,
                                          command=f"test: synthetic {task}", knob_vocab_size=vocab,
                                          knob_seq_len=64))
                    write_rows(results, rows)
                    out += rows
    return out


def add_ttr_rows(results: Path, template: dict) -> None:
    """Training-free rows carrying per-position MSE arrays in metrics_json."""
    rows = []
    for i, (model, scale) in enumerate((("linear", 1.0), ("lla", 0.2))):
        curve = [scale * (1.0 + (p % 16)) ** -0.7 for p in range(64)]
        rows.append(clone(template, suite="ttr", task="ttr", model=model, seed=0, run_id=f"ttr{i}-s0",
                          metric_name="mse", higher_is_better=False, metric_value=sum(curve) / 64,
                          val_metric_value=None, knobs_json=json.dumps({"segment": 16, "L": 64}),
                          metrics_json=json.dumps({"mse": sum(curve) / 64, "mse_per_position": curve})))
    write_rows(results, rows[:1])
    write_rows(results, rows[1:])


def damage(results: Path) -> Path:
    """A half-written file, as a crash would leave it, among the good ones."""
    good = sorted((results / "leaderboard" / "suite=mqar" / "task=mqar").glob("*.parquet"))[0]
    bad = good.parent / "crashed-run.parquet"
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    return bad


def full_store(base: Path) -> Path:
    """The real store plus MAD and ttr rows, an old-schema file, a pruned row and a damaged file."""
    if "full" not in _CACHE:
        res = base / "full-results"
        shutil.copytree(real_store(base), res)
        rows = rows_of(res)
        t = rows[0]
        add_mad_rows(res, t)
        add_ttr_rows(res, t)
        # an older file: only the first columns of the schema, no knob_/hp_ columns
        old_cols = ["schema_version", "run_id", "created_at", "suite", "task", "task_version", "model", "backend",
                    "seed", "metric_name", "metric_value", "higher_is_better", "val_metric_value", "state",
                    "knobs_json", "hparams_json"]
        first = [r for r in rows if r["run_id"].rsplit("-s", 1)[0] == t["run_id"].rsplit("-s", 1)[0]]
        old = [{k: clone(r, run_id=f"old-s{r['seed']}", model="mamba")[k] for k in old_cols} for r in first]
        table = pa.Table.from_pylist(old).drop_columns(["suite", "task"])
        pq.write_table(table, res / "leaderboard" / "suite=mqar" / "task=mqar" / "old-s0.parquet")
        # a pruned trial that would win if it counted
        write_rows(res, [clone(t, run_id="pruned-s0", state="PRUNED", metric_value=1.0, val_metric_value=1.0,
                               hparams_json=json.dumps({"lr": 9.0}))])
        damage(res)
        _CACHE["full"] = res
    return _CACHE["full"]


@pytest.fixture(scope="session")
def real_results(tmp_path_factory):
    return real_store(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def full_results(tmp_path_factory):
    return full_store(tmp_path_factory.getbasetemp())


def test_real_runs_landed(real_results):
    rows = rows_of(real_results)
    assert len(rows) == len(GRID) * len(SEEDS)
    assert {r["state"] for r in rows} == {"COMPLETE"}
    assert {r["knob_kv"] for r in rows} == {2, 4}


def test_store_reads_as_is_with_pandas_and_duckdb(full_results):
    pd = pytest.importorskip("pandas")
    duckdb = pytest.importorskip("duckdb")
    ours = read_table(full_results, warn=lambda m: None).to_pylist()
    good = [p for p in (full_results / "leaderboard").rglob("*.parquet") if p.name != "crashed-run.parquet"]
    # pandas, straight from the files (hive keys come from the directory names)
    df = pd.concat([pd.read_parquet(p).assign(**{k: v for k, v in (part.split("=", 1) for part in p.parts
                                                                     if "=" in part)}) for p in good])
    assert len(df) == len(ours)
    assert set(df["task"]) == {r["task"] for r in ours}
    # DuckDB with hive partitioning and union_by_name over the whole tree (damaged file left out by list)
    con = duckdb.connect()
    got = con.execute(
        "SELECT suite, task, model, count(*) AS n, avg(metric_value) AS m FROM read_parquet(?, hive_partitioning=true, "
        "union_by_name=true) WHERE state = 'COMPLETE' GROUP BY ALL ORDER BY ALL", [[str(p) for p in good]]).fetchall()
    want = {}
    for r in ours:
        if r["state"] == "COMPLETE":
            want.setdefault((r["suite"], r["task"], r["model"]), []).append(r["metric_value"])
    assert {(s, t, m): n for s, t, m, n, _ in got} == {k: len(v) for k, v in want.items()}
    for s, t, m, _, mean in got:
        assert mean == pytest.approx(sum(want[(s, t, m)]) / len(want[(s, t, m)]))
    # the old file's missing columns read as NULL in DuckDB too
    nulls = con.execute("SELECT count(*) FROM read_parquet(?, hive_partitioning=true, union_by_name=true) "
                        "WHERE model = 'mamba' AND knob_kv IS NULL", [[str(p) for p in good]]).fetchone()[0]
    assert nulls == len(SEEDS)


def test_duckdb_and_pandas_read_the_clean_store_whole(real_results):
    duckdb = pytest.importorskip("duckdb")
    glob = str(real_results / "leaderboard" / "**" / "*.parquet")
    n, tasks = duckdb.connect().execute(
        "SELECT count(*), list(DISTINCT task) FROM read_parquet(?, hive_partitioning=true, union_by_name=true)",
        [glob]).fetchone()
    assert n == len(GRID) * len(SEEDS) and tasks == ["mqar"]
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(real_results / "leaderboard")            # the directory, hive keys from the path
    assert len(df) == n and set(df["task"].astype(str)) == {"mqar"} and set(df["suite"].astype(str)) == {"mqar"}


def test_damaged_file_is_named_in_the_warning(full_results):
    warnings = []
    t = read_table(full_results, warn=warnings.append)
    assert t.num_rows > 0
    assert len(warnings) == 1 and "crashed-run.parquet" in warnings[0]
    with pytest.raises(pa.ArrowInvalid):
        pq.read_table(full_results / "leaderboard" / "suite=mqar" / "task=mqar" / "crashed-run.parquet")


def test_a_knob_that_is_none_in_one_file_and_set_in_another(tmp_path, real_results):
    t = rows_of(real_results)[0]
    write_rows(tmp_path, [clone(t, run_id="a-s0", knob_extra=None)])
    write_rows(tmp_path, [clone(t, run_id="b-s0", knob_extra=3)])
    got = {r["run_id"]: r["knob_extra"] for r in read_table(tmp_path).to_pylist()}
    assert got == {"a-s0": None, "b-s0": 3}


def test_a_file_whose_column_types_clash_is_skipped_with_a_warning(tmp_path, real_results):
    t = rows_of(real_results)[0]
    write_rows(tmp_path, [clone(t, run_id="a-s0", knob_extra=3)])
    write_rows(tmp_path, [clone(t, run_id="b-s0", knob_extra="three")])
    warnings = []
    got = read_table(tmp_path, warn=warnings.append).to_pylist()
    assert len(got) == 1 and len(warnings) == 1 and "column types clash" in warnings[0]
