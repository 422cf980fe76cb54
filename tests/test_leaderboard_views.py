"""The views' numbers against values computed by hand from the rows of real tiny runs."""
from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_leaderboard_store import MAD, clone, full_store, real_store, rows_of  # noqa: E402

from mixzoo.leaderboard.views import (  # noqa: E402
    best_view,
    build_views,
    filter_rows,
    mad_view,
    pivot_view,
    rank_view,
)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return rows_of(real_store(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    from mixzoo.leaderboard import read_table
    return read_table(full_store(tmp_path_factory.getbasetemp()), warn=lambda m: None).to_pylist()


def by_hand(rows: list[dict]) -> dict[tuple, dict]:
    """(task, knobs_json, model) -> the best config on validation, its test mean/std/n."""
    configs: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["state"] == "COMPLETE":
            configs.setdefault((r["task"], r["knobs_json"], r["model"], r["hparams_json"]), []).append(r)
    per: dict[tuple, list] = {}
    for (task, knobs, model, hp), rs in configs.items():
        vals = [r["val_metric_value"] for r in rs if r["val_metric_value"] is not None]
        val = statistics.mean(vals) if vals else float("nan")
        sign = 1 if rs[0]["higher_is_better"] else -1
        per.setdefault((task, knobs, model), []).append((-sign * val, -len(rs), hp, rs))
    out = {}
    for key, cands in per.items():
        _, _, hp, rs = min(cands, key=lambda c: c[:3])
        test = [r["metric_value"] for r in rs]
        out[key] = {"hparams_json": hp, "mean": statistics.mean(test), "n": len(test), "configs": len(cands),
                    "std": statistics.stdev(test) if len(test) > 1 else float("nan"),
                    "val": -sign * min(cands, key=lambda c: c[:3])[0]}
    return out


def test_best_view_equals_hand_computation_on_real_runs(real):
    want = by_hand(real)
    v = best_view(real)
    assert len(v.records) == len(want) == 4          # 2 settings x 2 mechanisms
    for rec in v.records:
        w = want[(rec["task"], rec["knobs_json"], rec["model"])]
        assert rec["hparams_json"] == w["hparams_json"]
        assert rec["test_mean"] == pytest.approx(w["mean"], abs=1e-12)
        assert rec["test_std"] == pytest.approx(w["std"], abs=1e-12)
        assert rec["val_mean"] == pytest.approx(w["val"], abs=1e-12)
        assert (rec["n_seeds"], rec["n_configs"]) == (w["n"], w["configs"])
    assert {r["n_configs"] for r in v.records if r["model"] == "softmax"} == {2}
    # one label per setting, stored with the row: the task's first three knobs (then any off its default)
    assert {r["setting"] for r in v.records} == {"V=16, L=16, kv=2", "V=16, L=16, kv=4"}


def test_best_is_chosen_on_validation_and_reported_on_test(real):
    t = {k: v for k, v in real[0].items()}
    rows = []
    for hp, vals, tests in (('{"lr": 1}', (0.9, 0.8), (0.1, 0.2)), ('{"lr": 2}', (0.2, 0.3), (0.95, 0.99))):
        rows += [clone(t, hparams_json=hp, seed=s, val_metric_value=v, metric_value=x, run_id=f"{hp}{s}")
                 for s, v, x in zip((0, 1), vals, tests)]
    rows.append(clone(t, hparams_json='{"lr": 3}', seed=0, val_metric_value=1.0, metric_value=1.0, state="PRUNED"))
    (rec,) = best_view(rows).records
    assert rec["hparams_json"] == '{"lr": 1}' and rec["n_configs"] == 2
    assert rec["test_mean"] == pytest.approx(0.15) and rec["test_std"] == pytest.approx(statistics.stdev([0.1, 0.2]))
    # lower is better: the smaller validation mean wins
    low = [clone(r, higher_is_better=False) for r in rows]
    (rec,) = best_view(low).records
    assert rec["hparams_json"] == '{"lr": 2}' and rec["test_mean"] == pytest.approx(0.97)


def test_reruns_failures_and_old_task_versions(real):
    t = real[0]
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    new = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    rows = [clone(t, seed=0, metric_value=0.1, val_metric_value=0.5, created_at=old, run_id="a-s0"),
            clone(t, seed=0, metric_value=0.3, val_metric_value=0.5, created_at=new, run_id="b-s0"),  # rerun wins
            clone(t, seed=1, metric_value=0.5, val_metric_value=0.5, created_at=old, run_id="a-s1"),
            clone(t, seed=2, metric_value=float("nan"), val_metric_value=0.5, run_id="c-s2"),       # not finite
            clone(t, seed=3, metric_value=0.9, val_metric_value=0.9, state="FAIL", run_id="d-s3"),
            clone(t, seed=4, metric_value=0.9, val_metric_value=0.9, task_version=0, run_id="e-s4")]
    (rec,) = best_view(rows).records
    assert rec["n_seeds"] == 2 and rec["test_mean"] == pytest.approx(0.4)
    assert rec["run_ids"] == "b-s0,a-s1"


def test_pivot_cells_are_the_best_configs(real):
    want = by_hand(real)
    (v,) = build_views(real, "pivot", task="mqar", axis="kv")
    assert v.title == "mqar: mechanisms against kv"
    assert {r["model"] for r in v.records} == {"softmax", "lla"}
    for rec in v.records:
        for kv in (2, 4):
            key = next(k for k in want if k[2] == rec["model"] and json.loads(k[1])["kv"] == kv)
            assert rec[f"kv={kv}"] == pytest.approx(want[key]["mean"])
            assert rec[f"kv={kv} n"] == want[key]["n"]
    # the default axis is the knob that varies
    assert pivot_view(real, "mqar").records[0]["axis"] == "kv"


def test_mad_score_is_mean_over_settings_then_tasks(full):
    want = by_hand(full)
    v = mad_view(full)
    assert {r["model"] for r in v.records} == {"softmax", "lla"}
    for rec in v.records:
        per_task = []
        for task in MAD:
            settings = [w["mean"] for (t, _k, m), w in want.items() if t == task and m == rec["model"]]
            assert len(settings) == rec[f"{task} settings"] == 2
            per_task.append(100 * statistics.mean(settings))
            assert rec[task] == pytest.approx(per_task[-1])
        assert rec["mad_score"] == pytest.approx(statistics.mean(per_task))
        assert rec["tasks"] == 4 and rec["mad-compression"] is None
    assert v.records[0]["model"] == "lla"            # lla was given +0.05 everywhere
    assert any("4/6 MAD tasks" in n for n in v.notes)
    # the chosen config is the better one on validation (lr=1e-3 is 0.1 better on both splits)
    assert v.records[0]["mad-recall"] == pytest.approx(100 * statistics.mean([0.35 + 0.02 + 0.005, 0.35 + 0.005]))


def test_rank_per_task_respects_direction(full):
    v = rank_view(full)
    ttr = {r["model"]: r for r in v.records if r["task"] == "ttr"}
    assert ttr["lla"]["rank"] == 1 and ttr["linear"]["rank"] == 2 and ttr["lla"]["higher_is_better"] is False
    mqar = sorted((r for r in v.records if r["task"] == "mqar"), key=lambda r: r["rank"])
    assert [r["rank"] for r in mqar][0] == 1
    assert mqar[0]["score"] >= mqar[-1]["score"]
    want = by_hand(full)
    for r in mqar:
        assert r["score"] == pytest.approx(statistics.mean(
            w["mean"] for (t, _k, m), w in want.items() if t == "mqar" and m == r["model"]))
    # the old-schema file's mechanism covers one setting of two
    assert next(r for r in mqar if r["model"] == "mamba")["settings"] == 1
    assert any("fewer settings" in n for n in v.notes)


def test_filters(real):
    assert {r["knob_kv"] for r in filter_rows(real, where={"kv": "4"})} == {4}
    assert filter_rows(real, where={"kv": "3"}) == []
    assert {r["model"] for r in filter_rows(real, models=["lla"])} == {"lla"}
    assert filter_rows(real, suite="mad") == [] and len(filter_rows(real, task="mqar")) == len(real)
    v = best_view(filter_rows(real, where={"kv": "4"}))
    # the same label whatever else is on screen (it read "L=16, V=16, filler=vocab" once filtered)
    assert len(v.records) == 2 and {r["setting"] for r in v.records} == {"V=16, L=16, kv=4"}


def test_old_rows_without_knob_columns_filter_by_knobs_json(full):
    old = [r for r in full if r["model"] == "mamba"]
    assert old and all(r["knob_kv"] is None for r in old)
    kv = json.loads(old[0]["knobs_json"])["kv"]
    assert {r["model"] for r in filter_rows(full, task="mqar", where={"kv": str(kv)})} == {"softmax", "lla", "mamba"}
    assert "mamba" not in {r["model"] for r in filter_rows(full, task="mqar", where={"kv": str(6 - kv)})}
