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
