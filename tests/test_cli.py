import subprocess
import sys
import time

import pytest

from mixzoo.cli import main


def test_help_is_fast_and_light():
    code = ("import sys, time; t=time.time(); from mixzoo.cli import build_parser; build_parser(); "
            "print(time.time()-t); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False"            # no heavy import for --help
    t = time.time()
    subprocess.run([sys.executable, "-m", "mixzoo", "--help"], capture_output=True, check=True)
    assert time.time() - t < 3.0        # generous: CI machines are loaded


@pytest.mark.parametrize("argv,needle", [
    (["run", "nope", "--model", "lla"], "unknown task 'nope'"),
    (["run", "mqar", "--model", "nope"], "unknown mechanism 'nope'"),
    (["run", "mqar", "--model", "lla", "--set", "L=63"], "L=63"),
    (["run", "mqar", "--model", "lla", "--set", "kv=40"], "kv=40"),
    (["run", "mqar", "--model", "lla", "--set", "bogus=1"], "unknown knob 'bogus'"),
    (["run", "mqar", "--model", "lla", "--set", "L=abc"], "cannot read 'abc'"),
    (["run", "mqar", "--model", "lla", "--hp", "nonsense=3"], "unknown hyperparameter 'nonsense'"),
    (["run", "mqar", "--model", "lla", "--preset", "nope"], "unknown preset 'nope'"),
    (["--plugin", "/nonexistent.py", "tasks"], "plugin file"),
    (["tasks", "nope"], "unknown task 'nope'"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(argv, needle, tmp_path, capsys):
    res = tmp_path / "r"
    assert main(["--results", str(res), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not res.exists()


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "mqar", "--seed", "x"])
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["run"]) == 2           # no task (and no --spec): one line too
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a TASK" in err[0]


def test_tasks_and_models_list(capsys):
    assert main(["tasks", "mqar"]) == 0
    out = capsys.readouterr().out
    assert "mqar" in out and "kv" in out and "presets" in out
    assert main(["models", "lla", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "lla" in out and "softmax" in out and "sdpa" in out


def test_run_writes_rows_and_show_prints_them(tmp_path, capsys):
    res = tmp_path / "r"
    rc = main(["--results", str(res), "run", "mqar", "--model", "softmax", "--preset", "demo",
               "--steps", "6", "--hp", "n_train=64", "--hp", "n_val=32", "--hp", "n_test=32",
               "--hp", "eval_every=3", "--hp", "d_model=16", "--seed", "0", "--seed", "1"])
    assert rc == 0
    from mixzoo.leaderboard import read_table
    t = read_table(res).to_pylist()
    assert sorted(r["seed"] for r in t) == [0, 1]
    r = t[0]
    assert r["task"] == "mqar" and r["model"] == "softmax" and r["backend"] == "sdpa"
    assert r["knob_L"] == 32 and r["knob_kv"] == 4 and r["steps"] == 6 and 0 <= r["metric_value"] <= 1
    assert r["command"].startswith("mixzoo ") and r["params"] > 0 and r["torch"]
    capsys.readouterr()
    assert main(["--results", str(res), "leaderboard", "show"]) == 0
    assert "softmax" in capsys.readouterr().out
