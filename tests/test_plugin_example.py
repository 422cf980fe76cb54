"""The researcher's path: the example plugin passes check-mixer, trains through ``mixzoo run``
and lands leaderboard rows beside the built-ins."""
from __future__ import annotations

from pathlib import Path

from mixzoo.cli import main

PLUGIN = str(Path(__file__).resolve().parents[1] / "examples" / "sliding_window.py")


def test_example_plugin_checks_trains_and_lands_rows(tmp_path, capsys):
    assert main(["--plugin", PLUGIN, "check-mixer", "swa"]) == 0
    results = str(tmp_path / "r")
    common = ["--preset", "demo", "--steps", "6", "--hp", "n_train=64", "--hp", "n_val=32", "--hp", "n_test=32",
              "--hp", "d_model=32"]
    assert main(["--results", results, "--plugin", PLUGIN, "run", "mqar", "--model", "swa", *common]) == 0
    assert main(["--results", results, "run", "mqar", "--model", "softmax", *common]) == 0
    from mixzoo.leaderboard import read_table
    rows = read_table(results).to_pylist()
    by_model = {r["model"]: r for r in rows}
    assert set(by_model) == {"swa", "softmax"}
    swa = by_model["swa"]
    assert swa["backend"] == "sdpa-masked" and swa["task"] == "mqar" and swa["state"] == "COMPLETE"
    assert swa["params"] > 0 and swa["state_size"] > 0
