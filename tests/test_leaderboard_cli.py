"""``mixzoo leaderboard show|export|plot`` over a store with real runs and a damaged file."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_leaderboard_store import full_store, real_store, rows_of  # noqa: E402

from mixzoo.cli import main  # noqa: E402
from mixzoo.leaderboard.views import best_view, print_rows, print_summary  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return full_store(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return real_store(tmp_path_factory.getbasetemp())


def lb(results, *args) -> int:
    return main(["--results", str(results), "leaderboard", *args])


def test_show_default_is_the_best_table_and_survives_a_damaged_file(full, capsys):
    assert lb(full, "show") == 0
    out, err = capsys.readouterr()
    assert "Best configuration per mechanism and task setting" in out
    assert "test (mean ± std)" in out and "kv=2" in out and "mad-recall" in out
    assert "crashed-run.parquet" in err and "warning" in err


@pytest.mark.parametrize("args, expect, absent", [
    (["--view", "pivot", "--task", "mqar", "--axis", "kv"], ["mqar: mechanisms against kv", "kv=2", "kv=4"], []),
    (["--view", "mad"], ["MAD score", "In-Context", "Compress", "(4/6 tasks)"], ["mqar"]),
    (["--view", "rank"], ["Ranking per task", "ttr", "mse↓"], []),
    (["--view", "rows", "--model", "lla", "--where", "kv=4"], ["lla", "COMPLETE"], ["softmax", "kv=2"]),
    (["--suite", "mad", "--model", "softmax,lla"], ["mad-fuzzy-recall"], ["mqar", "mamba"]),
    (["--task", "mqar", "--where", "kv=2"], ["softmax", "lla"], ["mad-recall", "kv=4"]),
])
def test_show_views_and_filters(full, capsys, args, expect, absent):
    assert lb(full, "show", *args) == 0
    out = capsys.readouterr().out
    for s in expect:
        assert s in out, s
    for s in absent:
        assert s not in out, s


@pytest.mark.parametrize("args, message", [
    (["--task", "nope"], "no rows with task 'nope'; present:"),
    (["--model", "lla,nope"], "no rows with model 'nope'"),
    (["--view", "pivot", "--task", "mqar", "--axis", "size"], "unknown axis 'size' for task 'mqar'; allowed: L, V"),
    (["--where", "kv"], "--where 'kv' is not KEY=VALUE"),
])
def test_bad_input_is_one_line_and_exit_2(full, capsys, args, message):
    assert lb(full, "show", *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_empty_store(tmp_path, capsys):
    assert lb(tmp_path / "none", "show") == 0
    assert "leaderboard is empty" in capsys.readouterr().out


def test_export_csv_and_markdown(real, tmp_path, capsys):
    rows = rows_of(real)
    want = {(r["setting"], r["model"]): r for r in best_view(rows).records}
    out = tmp_path / "best.csv"
    assert lb(real, "export", "--out", str(out)) == 0
    got = list(csv.DictReader(out.open()))
    assert len(got) == len(want)
    for g in got:
        w = want[(g["setting"], g["model"])]
        assert float(g["test_mean"]) == w["test_mean"] and float(g["test_std"]) == w["test_std"]
        assert int(g["n_seeds"]) == w["n_seeds"] and json.loads(g["hparams_json"]) == json.loads(w["hparams_json"])
    md = tmp_path / "pivot.md"
    assert lb(real, "export", "--view", "pivot", "--axis", "kv", "--format", "md", "--out", str(md)) == 0
    text = md.read_text()
    assert text.startswith("### mqar: mechanisms against kv") and "| model | kv=2 | kv=4 |" in text
    assert " ± " in text and not list(tmp_path.glob(".tmp-*"))
    assert lb(real, "export") == 2 and "needs --out" in capsys.readouterr().err


def test_plot_every_kind_with_a_damaged_file(full, tmp_path, capsys):
    curves = tmp_path / "curves.json"
    curves.write_text(json.dumps({"curves": {"linear": [1.0, 0.5, 0.4, 0.6], "lla": [1.0, 0.2, 0.1, 0.3]},
                                  "segment_len": 2}))
    figs = tmp_path / "figs"
    assert lb(full, "plot", "--out", str(figs)) == 0
    out, err = capsys.readouterr()
    assert "crashed-run.parquet" in err
    names = sorted(p.name for p in figs.iterdir())
    assert {"tasks-bars.png", "mqar-kv.png", "mad-recall-vocab_size.png"} <= set(names)
    assert lb(full, "plot", "--kind", "ttr", "--out", str(figs)) == 0                 # curves from the store
    assert lb(full, "plot", "--kind", "ttr", "--curves", str(curves), "--out", str(figs / "given.png")) == 0
    for p in figs.iterdir():
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 10_000, p
    assert not list(figs.glob(".tmp-*"))


def test_plot_api(real, tmp_path):
    from mixzoo.errors import UsageError
    from mixzoo.leaderboard import read_table
    from mixzoo.leaderboard.plot import plot_metric_vs_axis, plot_ttr_curves
    t = read_table(real)
    p = plot_metric_vs_axis(t, task="mqar", axis="kv", out=tmp_path, models=["lla"])
    assert p == tmp_path / "mqar-kv.png" and p.read_bytes()[:8] == PNG
    p = plot_ttr_curves({"a": [0.5, 0.25, 0.125, 0.0, float("nan")]}, tmp_path / "t.png", segment_len=2)
    assert p.read_bytes()[:8] == PNG
    with pytest.raises(UsageError, match="unknown axis 'nope'"):
        plot_metric_vs_axis(t, task="mqar", axis="nope", out=tmp_path)


def test_print_rows_and_summary_still_serve_run_and_demo(real, capsys):
    rows = rows_of(real)
    print_rows(rows[:2])
    print_summary(rows, task="mqar")
    out = capsys.readouterr().out
    assert out.count("mqar") >= 4 and "test (mean ± std)" in out
