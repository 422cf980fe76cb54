"""``mixzoo compare``: a sweep over one difficulty axis, then a table and a plot."""
from __future__ import annotations

from test_sweeps_helpers import rows

from mixzoo.cli import main


def test_compare_over_kv(tmp_path, capsys):
    res = tmp_path / "res"
    out = tmp_path / "kv.png"
    argv = ["--results", str(res), "--device", "cpu", "compare", "mqar", "--models", "softmax", "--axis", "kv=2,4",
            "--preset", "smoke", "--set", "L=32", "--trials", "1", "--seeds", "1", "--out", str(out)]
    assert main(argv) == 0
    cap = capsys.readouterr()
    text = cap.out
    assert "kv=2" in text and "kv=4" in text and "± " in text
    # --preset smoke: the old spelling of the budget still works, saying so once on stderr
    assert "names a budget" in cap.err and "use --budget smoke" in cap.err
    assert "kv=2: setting V=64, L=32, kv=2" in text          # the leaderboard's label of each setting
    assert out.is_file() and out.stat().st_size > 1000
    lb = rows(res)
    assert sorted((r["knob_kv"], r["knob_L"], r["seed"]) for r in lb) == [(2, 32, 0), (4, 32, 0)]
    assert len({r["study"] for r in lb}) == 2
