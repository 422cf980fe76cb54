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
    text = capsys.readouterr().out
    assert "kv=2" in text and "kv=4" in text and "± " in text
    assert out.is_file() and out.stat().st_size > 1000
    lb = rows(res)
    assert sorted((r["knob_kv"], r["knob_L"], r["seed"]) for r in lb) == [(2, 32, 0), (4, 32, 0)]
    assert len({r["study"] for r in lb}) == 2
