"""The store: one declared schema in every file, a column a file lacks read as null by
pandas, pyarrow.dataset and DuckDB; ``load()``; the curves table written with the rows and drawn in
the report; views that say what was chosen (every searched hyperparameter, one setting label)."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_input_checks import _row  # noqa: E402

from mixzoo import api  # noqa: E402
from mixzoo.cli import main  # noqa: E402
from mixzoo.leaderboard import load, load_curves, read_table, write_rows  # noqa: E402
from mixzoo.leaderboard.store import anchor_path  # noqa: E402
from mixzoo.leaderboard.views import best_view  # noqa: E402
from mixzoo.spec import known_columns  # noqa: E402

TINY = dict(steps=4, eval_every=2, batch_size=8, n_train=32, n_val=16, n_test=16, d_model=16, n_layers=1,
            num_heads=1)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two tiny real runs (lla over 2 seeds, softmax) on the demo MQAR."""
    res = tmp_path_factory.mktemp("spec-store") / "results"
    rc = main(["--results", str(res), "--device", "cpu", "run", "mqar", "--model", "lla", "--preset", "demo",
               "--seed", "0", "--seed", "1", *[x for k, v in TINY.items() for x in ("--hp", f"{k}={v}")]])
    assert rc == 0
    api.run("mqar", "softmax", preset="demo", hparams=TINY, results=res, device="cpu", command="test")
    return res


def test_rows_carry_the_whole_spec_and_every_knob(store, capsys):
    capsys.readouterr()
    rows = sorted(read_table(store).to_pylist(), key=lambda r: (r["model"], r["seed"]))
    lla0, lla1, sm = rows
    spec = json.loads(lla0["spec_json"])
    assert spec["mixer_knobs"] == {"ridge": 1.0, "learn_ridge": False, "rope": True, "backend": "auto",
                                 "solve": "auto"}
    assert spec["train"]["steps"] == 4 and spec["backbone"]["d_model"] == 16 and spec["seed"] == 0
    from mixzoo.spec import RunSpec
    assert RunSpec.from_json(lla0["spec_json"]).hash == lla0["spec_hash"]
    assert lla0["spec_hash"] != lla1["spec_hash"] and lla0["config_hash"] == lla1["config_hash"]
    # a mechanism knob at its default is recorded: in hparams_json and its typed column
    assert json.loads(lla0["hparams_json"])["ridge"] == 1.0 and lla0["hp_ridge"] == 1.0
    assert lla0["hp_lr"] == 1e-3 and lla0["hp_steps"] == 4 and sm["hp_ridge"] is None
    assert lla0["setting"] == sm["setting"] == "V=32, L=32, kv=4" and lla0["schema_version"] == 6
    assert lla0["kernels"] is None and sm["kernels"] is None          # the CPU runs no backbone kernel
    assert list(json.loads(lla0["search_space_json"])) == ["lr", "weight_decay", "ridge"]


def test_every_file_has_the_declared_columns(store):
    want = {c for c in known_columns()}
    for p in (store / "leaderboard").rglob("*.parquet"):
        names = set(pq.read_schema(p).names)
        assert want <= names, sorted(want - names)[:5]
    assert {"knob_N", "knob_d_x", "hp_allow_neg_eigval", "hp_muon_lr"} <= want      # other tasks', mechanisms'


def test_a_column_the_first_file_lacks_reads_as_null_everywhere(tmp_path):
    """A plugin's knob (``gamma``) in a later run: pandas and pyarrow take the schema of the first
    file in path order, which lacks it; the anchor makes it the store's."""
    res = tmp_path / "r"
    cols = known_columns()
    write_rows(res, [_row(run_id="aaa-s0", model="softmax")], columns=cols)
    write_rows(res, [_row(run_id="bbb-s0", model="zoo", hp_gamma=0.9, hparams_json='{"gamma": 0.9}')], columns=cols)
    first = sorted(p for p in (res / "leaderboard").rglob("*.parquet") if "!schema" not in str(p))[0]
    assert "hp_gamma" not in pq.read_schema(first).names and first.name == "aaa-s0.parquet"
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(res / "leaderboard", engine="pyarrow")
    assert len(df) == 2 and sorted(df["hp_gamma"].fillna(-1)) == [-1, 0.9]        # was KeyError: hp_gamma
    assert set(df["task"].astype(str)) == {"mqar"}
    t = ds.dataset(res / "leaderboard", format="parquet", partitioning="hive").to_table()
    assert t.num_rows == 2 and sorted(t["hp_gamma"].to_pylist(), key=str) == [0.9, None]
    assert pq.read_schema(res / "leaderboard" / "_common_metadata").field("hp_gamma").type == "double"
    got = load(res)
    assert len(got) == 2 and str(got["seed"].dtype) == "Int64" and "hp_gamma" in got and "knob_N" in got
    try:
        import duckdb
    except ImportError:
        return
    n = duckdb.connect().execute(
        "SELECT count(*), count(hp_gamma) FROM read_parquet(?, hive_partitioning=true, union_by_name=true)",
        [str(res / "leaderboard" / "**" / "*.parquet")]).fetchone()
    assert n == (2, 1)


def test_the_anchor_keeps_every_column_and_adds_no_row(tmp_path):
    res = tmp_path / "r"
    write_rows(res, [_row(run_id="a-s0", hp_x=1)])
    write_rows(res, [_row(run_id="b-s0", hp_y="z")])
    names = pq.read_schema(anchor_path(res)).names
    assert {"hp_x", "hp_y", "run_id"} <= set(names) and "suite" not in names
    assert pq.read_metadata(anchor_path(res)).num_rows == 0
    assert {r["run_id"] for r in read_table(res).to_pylist()} == {"a-s0", "b-s0"}
    assert not list(res.rglob(".tmp-*"))


def test_curves_are_written_with_the_row_and_readable(store):
    rows = {r["run_id"]: r for r in read_table(store).to_pylist()}
    c = load_curves(store)
    assert set(c["run_id"]) == set(rows)
    lla0 = next(k for k, r in rows.items() if r["model"] == "lla" and r["seed"] == 0)
    mine = c[c["run_id"] == lla0]
    assert set(mine["metric"]) >= {"train_loss", "val/accuracy", "steps_per_s", "diag/layer0/ridge_min"}
    assert sorted(mine[mine["metric"] == "train_loss"]["step"]) == [2, 4]
    assert set(c["task"]) == {"mqar"} and set(c["suite"]) == {"mqar"}
    assert len(load_curves(store, run_ids=[lla0])) == len(mine)
    assert list((store / "curves" / "suite=mqar" / "task=mqar").glob("*.parquet"))


def test_no_curves_without_their_row(tmp_path, monkeypatch):
    from mixzoo.leaderboard import store as st
    real = st._write_atomic

    def fail_rows(table, path):
        if "leaderboard" in path.parts and "!schema" not in str(path):
            raise OSError(28, "No space left on device")
        return real(table, path)
    monkeypatch.setattr(st, "_write_atomic", fail_rows)
    row = _row(run_id="c-s0", history=[{"step": 2, "train_loss": 1.0, "accuracy": 0.5}])
    with pytest.raises(OSError):
        write_rows(tmp_path, [row])
    assert not [p for p in tmp_path.rglob("*.parquet") if "!schema" not in str(p)]
    monkeypatch.setattr(st, "_write_atomic", real)
    write_rows(tmp_path, [row])
    assert load_curves(tmp_path)[["metric", "value"]].values.tolist() == [["train_loss", 1.0], ["val/accuracy", 0.5]]


def test_report_and_plot_draw_the_training_curves(store, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["--results", str(store), "leaderboard", "report", "--out", str(out)]) == 0
    page = out.read_text()
    assert "Training curves" in page and page.count("data:image/png") == 2      # bars, curves (one setting: no axis)
    assert main(["--results", str(store), "leaderboard", "plot", "--kind", "curves", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "mqar-curves.png").read_bytes()[:4] == b"\x89PNG"


# -- views that say what was chosen -------------------------------------------------------------------

def _cfg(run_id, model, recipe_short_conv, lr, val, **extra):
    hp = {"lr": lr, "weight_decay": 0.1, "short_conv": recipe_short_conv, **extra}
    space = {"lr": ["log", 1e-4, 1e-2], "weight_decay": ["cat", [0.0, 0.1]]}
    if model == "lla":
        space["ridge"] = ["log", 0.01, 100.0]
    return _row(run_id=run_id, model=model, hparams_json=json.dumps(hp), val_metric_value=val,
                search_space_json=json.dumps(space), setting="V=64, L=16, kv=4", **{"hp_short_conv": recipe_short_conv})


def test_best_config_lists_the_rows_own_search_space_and_nothing_else():
    rows = [_cfg("s1-s0", "softmax", 3, 1e-3, 0.9), _cfg("s2-s0", "softmax", 0, 2e-3, 0.5),
            _cfg("l1-s0", "lla", 0, 9.44e-4, 0.8, ridge=1.0)]
    recs = {r["model"]: r for r in best_view(rows).records}
    # lla's ridge (never varied, at its default) is what was searched: it is shown
    assert recs["lla"]["config"] == "lr=0.000944, weight_decay=0.1, ridge=1"
    # softmax's own two configurations differ in the recipe's short_conv: its label says so;
    # lla's never mentions another row's recipe (it read "short_conv=0" once one based row existed)
    assert recs["softmax"]["config"] == "lr=0.001, weight_decay=0.1, short_conv=3"
    alone = best_view([rows[2]]).records[0]["config"]
    assert alone == recs["lla"]["config"]          # whatever else is on screen


def test_one_setting_label_in_show_export_and_report(store, tmp_path, capsys):
    label = "V=32, L=32, kv=4"
    assert main(["--results", str(store), "leaderboard", "show"]) == 0
    assert label in capsys.readouterr().out
    out = tmp_path / "b.csv"
    assert main(["--results", str(store), "leaderboard", "export", "--out", str(out)]) == 0
    assert {r["setting"] for r in csv.DictReader(out.open())} == {label}
    md = tmp_path / "b.md"
    assert main(["--results", str(store), "leaderboard", "export", "--view", "rows", "--out", str(md)]) == 0
    assert md.read_text().count(label) == 3
    assert main(["--results", str(store), "leaderboard", "show", "--where", "kv=4", "--models", "lla"]) == 0
    shown = capsys.readouterr().out
    assert label in shown and "ridge=1" in shown
