"""Stacked sweeps (``stack = K``): a worker takes K trials of a study at a time and trains them as one
stacked model; each is still its own Optuna trial, with the numbers of training it alone (the
tolerances of tests/test_stacked.py), and a killed worker's whole batch is reclaimed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from test_sweeps_helpers import journal, rows, studies, write_spec

from mixzoo.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")     # tests/conftest.py

ENQ = 'enqueue = [{ lr = 3e-3, weight_decay = 0.1 }, { lr = 1e-2, weight_decay = 0.0 }, ' \
      '{ lr = 5e-3, weight_decay = 0.1 }]\n[pruner]\nkind = "none"\n'


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def _sweep(tmp_path, name, stack, extra=ENQ, trials=3, seeds=2):
    spec = write_spec(tmp_path / f"{name}.toml", name="t-stack", models=["softmax"], trials=trials, seeds=seeds,
                      extra=f"stack = {stack}\n" + extra)
    res = tmp_path / name
    assert main(["--results", str(res), "--device", "cpu", "sweep", str(spec)]) == 0
    st = studies(journal(res))
    search = next(v for k, v in st.items() if not k.endswith(":final"))
    return res, st, {t.user_attrs["slot"]: t for t in search}


def _one_row_per_seed(res, seeds):
    keys = Counter((r["study"], r["seed"]) for r in rows(res))
    assert set(keys.values()) == {1} and sorted(s for _, s in keys) == list(range(seeds)), keys


def test_stacked_sweep_gives_the_values_of_one_trial_at_a_time(tmp_path, capsys):
    res1, st1, one = _sweep(tmp_path, "one", 1)
    res3, st3, three = _sweep(tmp_path, "three", 3)
    assert list(st1) == list(st3)                      # stack is not part of the study's identity
    assert sorted(one) == sorted(three) == [0, 1, 2]
    for slot in one:
        a, b = one[slot], three[slot]
        assert a.params == b.params and a.state.name == b.state.name == "COMPLETE"
        assert _close(a.value, b.value), (slot, a.value, b.value)
        assert "step_mode" not in a.user_attrs
        assert b.user_attrs["step_mode"] == "stacked" and b.user_attrs["stack"] == 3
    # the final seeds (2) of the best configuration were stacked too: one row per (study, seed)
    _one_row_per_seed(res1, 2)
    _one_row_per_seed(res3, 2)
    r1 = {r["seed"]: r for r in rows(res1)}
    r3 = {r["seed"]: r for r in rows(res3)}
    for s in (0, 1):
        assert r1[s]["trial"] == r3[s]["trial"] and r1[s]["hparams_json"] == r3[s]["hparams_json"]
        assert r1[s]["spec_hash"] == r3[s]["spec_hash"]
        assert _close(r1[s]["metric_value"], r3[s]["metric_value"])
        assert json.loads(r1[s]["spec_json"])["train"]["step_mode"] == "eager"
        assert json.loads(r3[s]["spec_json"])["train"]["step_mode"] == "stacked"
    assert "not used" not in capsys.readouterr().out


def test_space_with_a_non_stackable_knob_falls_back_once(tmp_path, capsys):
    extra = '[pruner]\nkind = "none"\n[search.softmax]\nrope = ["cat", [true, false]]\n'
    res, st, search = _sweep(tmp_path, "fb", 3, extra=extra, trials=3, seeds=1)
    assert sorted(search) == [0, 1, 2] and all(t.state.name == "COMPLETE" for t in search.values())
    assert all("step_mode" not in t.user_attrs for t in search.values())     # one trial at a time
    out = capsys.readouterr().out
    assert out.count("stack = 3 not used for its search trials: its search space varies rope") == 1, out
    log = next((res / "sweeps" / "logs").glob("*.log")).read_text()
    assert log.count("not used for its search trials") == 1
    _one_row_per_seed(res, 1)


def test_a_one_choice_entry_of_a_non_stackable_knob_still_stacks(tmp_path, capsys):
    # ["cat", [1]] fixes the knob for every trial (the figures' conv_size = 1): it does not vary
    extra = '[pruner]\nkind = "none"\n[search.softmax]\nrope = ["cat", [false]]\n'
    res, st, search = _sweep(tmp_path, "one-choice", 3, extra=extra, trials=3, seeds=1)
    assert sorted(search) == [0, 1, 2] and all(t.state.name == "COMPLETE" for t in search.values())
    assert all(t.user_attrs.get("step_mode") == "stacked" and t.params["rope"] is False for t in search.values())
    assert "not used" not in capsys.readouterr().out
    _one_row_per_seed(res, 1)


def test_sigkill_of_a_worker_holding_a_stacked_batch_then_rerun(tmp_path):
    spec = write_spec(tmp_path / "kill.toml", name="t-stack-kill", models=["softmax"], trials=3, seeds=2,
                      extra='stack = 3\ndefault_budget = "slow"\n' + ENQ + '[budgets.slow.train]\nsteps = 200\n')
    res = tmp_path / "res"
    env = {**os.environ, "MIXZOO_SWEEP_POLL": "0.3", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mixzoo", "--results", str(res), "--device", "cpu", "sweep", str(spec)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    path, held, t0 = res / "sweeps" / "optuna-journal.log", [], time.time()
    while time.time() - t0 < 120 and p.poll() is None and len(held) < 3:
        if path.exists():
            held = [t for ts in studies(journal(res)).values() for t in ts
                    if t.state.name == "RUNNING" and "stack" in t.user_attrs]
        time.sleep(0.05)
    assert len(held) == 3, p.communicate()[0]              # the whole batch was running
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    assert len({t.user_attrs["owner"] for t in held}) == 1

    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    st = studies(journal(res))
    search = next(v for k, v in st.items() if not k.endswith(":final"))
    stale = sorted(t.number for t in search if t.user_attrs.get("stale"))
    assert stale == sorted(t.number for t in held)          # all three reclaimed
    live = [t for t in search if not t.user_attrs.get("stale")]
    assert sorted(t.user_attrs["slot"] for t in live) == [0, 1, 2]      # the budget met exactly
    assert all(t.state.name == "COMPLETE" and t.user_attrs.get("retry_of") is not None for t in live)
    assert all(t.state.is_finished() for ts in st.values() for t in ts)
    _one_row_per_seed(res, 2)


def test_pruning_works_per_trial_inside_a_stacked_batch(tmp_path, capsys):
    spec = write_spec(tmp_path / "prune.toml", name="t-stack-prune", models=["softmax"], trials=2, seeds=1,
                      extra='stack = 2\n[pruner]\nkind = "threshold"\nlower = 2.0\n')
    res = tmp_path / "res"
    assert main(["--results", str(res), "--device", "cpu", "sweep", str(spec)]) == 1   # every trial pruned
    assert "completed no trial (2 pruned, 0 failed of 2)" in capsys.readouterr().err
    (trials,) = studies(journal(res)).values()
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"]
    for t in trials:
        assert t.user_attrs["stack"] == 2 and t.user_attrs["step_mode"] == "stacked"
        assert list(t.intermediate_values) == [10]   # the trainer's global step of the first validation
        assert t.user_attrs["reason"].startswith("pruned at step 10")
    assert rows(res) == []
