"""Specs and bad input: every built-in spec expands under every preset; malformed specs,
unknown mechanisms or knobs, bad options and storages answer exit code 2 with one clear line."""
from __future__ import annotations

import pytest
from test_sweeps_helpers import write_spec

from mixzoo.cli import main
from mixzoo.sweeps.spec import builtin_names, load
from mixzoo.sweeps.storage import mask, resolve, scrub


@pytest.mark.parametrize("name", ["mqar", "mad", "mad-hard", "icl-regression", "state-tracking", "ttr"])
def test_builtin_specs_expand_under_every_preset(name):
    assert name in builtin_names()
    for preset in ("smoke", "small", "paper"):
        spec = load(name, preset)
        assert spec.preset == preset
        if name == "ttr":
            assert not spec.units and spec.ttr
            continue
        assert spec.units and len({u.study for u in spec.units}) == len(spec.units)
        assert all(len(u.seeds) == 3 and u.trials >= 1 and u.space for u in spec.units)
    smoke, paper = load(name, "smoke"), load(name, "paper")
    if name != "ttr":
        assert len(paper.units) > len(smoke.units)
        assert max(u.fixed["steps"] for u in smoke.units) <= 40


def test_mqar_small_is_softmax_and_lla():
    spec = load("mqar", "small")
    assert {u.model for u in spec.units} == {"softmax", "lla"}
    assert load("mqar").preset == "small"


def _err(capsys, argv) -> str:
    assert main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    assert lines[0].startswith("mixzoo: error:") and "Traceback" not in cap.err
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    res = str(tmp_path / "res")
    sweep = ["--results", res, "sweep"]
    assert "unknown spec 'nope'" in _err(capsys, [*sweep, "nope"])
    (tmp_path / "broken.toml").write_text("name = [\n")
    assert "not valid TOML" in _err(capsys, [*sweep, str(tmp_path / "broken.toml")])
    ok = write_spec(tmp_path / "ok.toml", name="t", models=["softmax"], trials=1, seeds=1)
    line = _err(capsys, [*sweep, str(ok), "--models", "nosuch"])
    assert "'nosuch'" in line and "softmax" in line and "lla" in line
    line = _err(capsys, [*sweep, str(ok), "--budget", "huge"])
    assert "'huge'" in line
    bad_knob = write_spec(tmp_path / "k.toml", name="t", models=["softmax"], trials=1, seeds=1,
                          settings="[{ L = 32, colour = 2 }]")
    line = _err(capsys, [*sweep, str(bad_knob)])
    assert "'colour'" in line and "kv" in line
    bad_val = write_spec(tmp_path / "v.toml", name="t", models=["softmax"], trials=1, seeds=1,
                         settings="[{ L = 33, kv = 2 }]")
    assert "L=33" in _err(capsys, [*sweep, str(bad_val)])
    bad_space = write_spec(tmp_path / "s.toml", name="t", models=["softmax"], trials=1, seeds=1,
                           extra='[search.softmax]\nlr = ["log", 0, 1]\n')
    assert "search-space entry" in _err(capsys, [*sweep, str(bad_space)])
    bad_hp = write_spec(tmp_path / "h.toml", name="t", models=["softmax"], trials=1, seeds=1,
                        extra='[search.softmax]\nwarp = ["float", 0, 1]\n')
    line = _err(capsys, [*sweep, str(bad_hp)])
    assert "'warp'" in line and "lr" in line
    (tmp_path / "top.toml").write_text('modles = ["softmax"]\n[tasks.mqar]\n')
    line = _err(capsys, [*sweep, str(tmp_path / "top.toml")])
    assert "'modles'" in line and "models" in line
    bad_trials = write_spec(tmp_path / "n.toml", name="t", models=["softmax"], trials=0, seeds=1)
    assert "trials = 0" in _err(capsys, [*sweep, str(bad_trials)])
    assert "--workers 0" in _err(capsys, [*sweep, str(ok), "--workers", "0"])
    line = _err(capsys, [*sweep, str(ok), "--storage", "sqlite:///x.db", "--workers", "2"])
    assert "SQLite" in line
    line = _err(capsys, [*sweep, str(ok), "--storage", "redis://u:pw123@h/0"])
    assert "unsupported storage scheme" in line and "pw123" not in line
    line = _err(capsys, ["--results", res, "compare", "mqar", "--models", "softmax", "--axis", "colour=1,2"])
    assert "'colour'" in line
    assert "nosuch" in _err(capsys, ["--results", res, "compare", "nosuch", "--models", "softmax", "--axis", "L=32"])
    assert not (tmp_path / "res" / "leaderboard").exists()


def test_passwords_are_masked():
    url = "postgresql://ann:p%40ss-w0rd@db.example:5432/mixzoo"
    assert mask(url) == "postgresql://ann:***@db.example:5432/mixzoo"
    assert "p%40ss" not in mask(f"mixzoo sweep mqar --storage {url} --workers 2")
    assert scrub("auth failed for p@ss-w0rd", url) == "auth failed for ***"
    assert resolve(None, "/r") == "journal:/r/sweeps/optuna-journal.log"
    assert resolve("/tmp/j.log", "/r") == "journal:/tmp/j.log"
    assert resolve(url, "/r") == url
