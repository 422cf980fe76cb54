"""Sweeps in one process on the journal storage: a NaN trial, pruning, rerun idempotency."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
from test_sweeps_helpers import journal, rows, studies, write_plugin, write_spec

from mixzoo.cli import main


def test_nan_trial_is_failed_and_sweep_goes_on(tmp_path, capsys):
    plugin = write_plugin(tmp_path / "nanmix_plugin.py")
    spec = write_spec(tmp_path / "nan.toml", name="t-nan", models=["nanmix"], trials=3, seeds=2,
                      extra='enqueue = [{ poison = 1 }, { poison = 0 }, { poison = 0 }]\n'
                            '[pruner]\nkind = "none"\n')
    res = tmp_path / "res"
    argv = ["--results", str(res), "--plugin", str(plugin), "--device", "cpu", "sweep", str(spec)]
    assert main(argv) == 0
    st = studies(journal(res))
    search = next(v for k, v in st.items() if not k.endswith(":final"))
    final = next(v for k, v in st.items() if k.endswith(":final"))
    states = sorted((t.user_attrs["slot"], t.state.name) for t in search)
    assert states == [(0, "FAIL"), (1, "COMPLETE"), (2, "COMPLETE")]
    bad = next(t for t in search if t.state.name == "FAIL")
    assert bad.params["poison"] == 1 and "non-finite" in bad.user_attrs["reason"]
    assert sorted(t.state.name for t in final) == ["COMPLETE", "COMPLETE"]
    lb = rows(res)
    assert sorted(r["seed"] for r in lb) == [0, 1]
    assert {r["state"] for r in lb} == {"COMPLETE"}
    best = {r["trial"] for r in lb}
    assert len(best) == 1 and best <= {1, 2}
    assert all(json.loads(r["hparams_json"])["poison"] == 0 for r in lb)
    assert all(r["study"] and not r["study"].endswith(":final") for r in lb)
    # every trial, the failed one with its reason, in the sweep's trial table
    tr = pq.read_table(res / "sweeps" / "trials" / "t-nan.parquet").to_pylist()
    failed = [t for t in tr if t["state"] == "FAIL"]
    assert len(failed) == 1 and "non-finite" in failed[0]["reason"]
    out = capsys.readouterr().out
    assert "FAIL (non-finite" in out and "done" in out

    # a rerun finds everything done: no new trial, no new row
    assert main(argv) == 0
    assert {k: len(v) for k, v in studies(journal(res)).items()} == {k: len(v) for k, v in st.items()}
    assert len(rows(res)) == 2


def test_pruning_reports_at_global_step(tmp_path, capsys):
    spec = write_spec(tmp_path / "prune.toml", name="t-prune", models=["softmax"], trials=2, seeds=1,
                      extra='[pruner]\nkind = "threshold"\nlower = 2.0\n')
    res = tmp_path / "res"
    # a study that completed no trial (every one pruned) is not success: exit 1, naming the study
    assert main(["--results", str(res), "--device", "cpu", "sweep", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "study t-prune[-]/mqar/softmax/" in err and "completed no trial (2 pruned, 0 failed of 2)" in err
    st = studies(journal(res))
    assert len(st) == 1  # every trial pruned: no final study, no rows
    (trials,) = st.values()
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"]
    for t in trials:
        assert list(t.intermediate_values) == [10]   # the trainer's global step of the first validation
        assert t.user_attrs["reason"].startswith("pruned at step 10")
    assert rows(res) == []
