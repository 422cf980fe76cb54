"""``mixzoo check-zoo`` on the CPU: the cells it expands to, bad input, a tiny real run through
worker processes that lands rows, and a failing cell reported as such."""
from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest
import torch
from torch import nn

from mixzoo import registry, zoo
from mixzoo.cli import main


def test_matrix_covers_every_mechanism_task_family_and_recipe(capsys):
    assert main(["check-zoo", "--list"]) == 0
    out = capsys.readouterr().out
    cells = zoo.build_cells(None, None, "1e-3,3e-3", 300, 64)
    assert f"{len(cells)} cells" in out
    assert {c.mechanism for c in cells} == {m[0] for m in zoo.MECHANISMS}
    assert {c.model for c in cells} >= {"lla", "parallax", "softmax", "mesa", "gdn", "mamba", "gla", "hyena"}
    assert {c.task for c in cells} == {"mqar", "mad-recall", "mad-fuzzy-recall", "mad-noisy-recall",
                                       "mad-selective-copy", "mad-compression", "mad-memorization",
                                       "icl-regression", "state-tracking"}
    assert {c.recipe for c in cells} == {"zoology", "based", "mad"}
    widths = {128 // c.hp.get("num_heads", 16) for c in cells}
    assert min(widths) == 8 and max(widths) == 128
    assert len(cells) == len(zoo.MECHANISMS) * len(zoo.SETTINGS) * 2


@pytest.mark.parametrize("argv", [["--models", "nope"], ["--settings", "nope"], ["--lrs", "x"],
                                  ["--steps", "0"], ["--workers", "0"]])
def test_bad_input_exits_2(argv, capsys, tmp_path):
    assert main(["--results", str(tmp_path), "check-zoo", *argv]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_tiny_matrix_runs_in_workers_and_lands_rows(tmp_path, capsys):
    out = tmp_path / "zoo.json"
    rc = main(["--results", str(tmp_path / "res"), "--device", "cpu", "check-zoo", "--models", "softmax,linear",
               "--settings", "state-tracking", "--lrs", "3e-3", "--steps", "4", "--batch-size", "4",
               "--workers", "2", "--out", str(out)])
    assert rc == 0
    cells = json.loads(out.read_text())
    assert [(c["mechanism"], c["state"]) for c in cells] == [("softmax", "COMPLETE"), ("linear", "COMPLETE")]
    assert all(c["backend"] and c["peak_mib"] for c in cells)
    rows = ds.dataset(tmp_path / "res" / "leaderboard", format="parquet", partitioning="hive").to_table()
    assert sorted(rows.column("model").to_pylist()) == ["linear", "softmax"]
    assert "2 of 2 cells COMPLETE" in capsys.readouterr().out


class Raises(nn.Module):
    def __init__(self, d_model, *, num_heads=1, layer_idx=0):
        super().__init__()
        self.p = nn.Linear(d_model, d_model)

    def forward(self, x):
        raise RuntimeError("kernel refused this width")


def test_failing_cell_is_reported_not_raised(tmp_path):
    registry.register_mixer("zoo-raises", search_space={})(Raises)
    try:
        cell = zoo.build_cells("softmax", "state-tracking", "1e-3", 4, 4)[0]
        cell.model = "zoo-raises"
        got = zoo.run_cell(cell, str(tmp_path), "cpu")
    finally:
        registry._MIXERS.pop("zoo-raises", None)
    assert got.state == "FAIL" and "RuntimeError: kernel refused this width" in got.reason
    assert "FAIL" in zoo.line(got)


def test_mamba1_cell_skipped_without_mamba_ssm(tmp_path):
    cell = zoo.build_cells("mamba1", "state-tracking", "1e-3", 4, 4)[0]
    got = zoo.run_cell(cell, str(tmp_path), "cpu")
    assert got.state == "skip" and "mamba-ssm" in got.reason
    assert torch.cuda.is_available() or not any(tmp_path.iterdir())


FAKE_WORKER = r'''
import json, sys
cells, out = json.load(open(sys.argv[1])), sys.argv[2]
with open(out, "a") as f:
    for c in cells:
        if c["setting"] == "crash":
            raise SystemExit(9)                      # dies inside this cell, reports nothing
        poisoned = c["lr"] == 1.0 and "respawned" not in c["reason"]
        c["state"] = "FAIL" if poisoned else "COMPLETE"
        c["reason"] = "AcceleratorError: CUDA error: an illegal memory access" if poisoned else ""
        f.write(json.dumps(c) + "\n")
        if poisoned:
            raise SystemExit(3)
'''


def test_dead_workers_are_replaced_for_the_cells_they_left(tmp_path, monkeypatch):
    """A worker that a kernel fault poisoned (exit 3) or that died inside a cell is replaced by a
    fresh one for the cells it had not reported; every cell gets exactly one result."""
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setattr(zoo, "WORKER", [zoo.sys.executable, str(script)])
    mk = lambda setting, lr: zoo.Cell("m", "softmax", {}, setting, "mqar", {}, "zoology", {}, lr)
    shard_a = [mk("a", 0.1), mk("a", 1.0), mk("b", 0.1), mk("b", 0.2)]     # fault at the second cell
    shard_b = [mk("crash", 0.1), mk("c", 0.1)]                              # dies in the first cell
    done = zoo._run_shards([shard_a, shard_b], tmp_path / "res", "cpu")
    got = {(c.setting, c.lr): (c.state, c.reason) for c in done}
    assert len(done) == 6 and len(got) == 6
    assert got[("a", 1.0)][0] == "FAIL" and "illegal memory access" in got[("a", 1.0)][1]
    assert got[("crash", 0.1)] == ("FAIL", "worker exited with code 9 during this cell")
    assert all(got[k][0] == "COMPLETE" for k in [("a", 0.1), ("b", 0.1), ("b", 0.2), ("c", 0.1)])


def test_shards_keep_mechanisms_together_unless_workers_outnumber_them():
    cells = zoo.build_cells("softmax,lla,gdn", None, "1e-3,3e-3", 10, 4)
    two = zoo.make_shards(cells, 2)
    assert len(two) == 2 and sum(map(len, two)) == len(cells)
    assert all(len({c.mechanism for c in sh}) <= 2 for sh in two)
    assert sum(len({c.mechanism for c in sh}) for sh in two) == 3        # no mechanism split
    six = zoo.make_shards(cells, 6)
    assert len(six) == 6 and all(len({c.mechanism for c in sh}) == 1 for sh in six)
    assert sorted(zoo._key(c) for sh in six for c in sh) == sorted(zoo._key(c) for c in cells)
    assert max(map(len, six)) - min(map(len, six)) <= 1


def test_optimizer_reaches_every_cell_and_the_row(tmp_path):
    """check-zoo --optimizer muon: each cell trains with Muon and its row says so."""
    import pyarrow.dataset as ds
    cells = zoo.build_cells("softmax,gdn", None, "1e-3", 4, 4, optimizer="muon")
    assert {c.hp["optimizer"] for c in cells} == {"muon"}
    got = zoo.run_cell(zoo.build_cells("softmax", "state-tracking", "1e-3", 4, 4, optimizer="muon")[0],
                       str(tmp_path), "cpu")
    assert got.state == "COMPLETE", got.reason
    rows = ds.dataset(tmp_path / "leaderboard", format="parquet", partitioning="hive").to_table().to_pylist()
    assert [r["optimizer"] for r in rows] == ["muon"]
