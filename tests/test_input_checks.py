"""Input checked once where it enters, before anything is trained or written: bad input is one
stderr line ``mixzoo: error: ...`` naming the bad value and what is allowed, exit code 2, and no
file under the results directory. Typed hyperparameters, a constructor refusing its knobs, flags
that contradict ``--hp``, an unusable ``--results``, duplicate registrations, the causality check
before every run, zoology-style plugins, the leaderboard's ``--where`` and export format, global
options after the command, and the listing of boolean task knobs."""
from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from mixzoo import api, registry
from mixzoo.cli import main
from mixzoo.errors import UsageError
from mixzoo.leaderboard import CORE, read_table, write_rows

PLUGIN = str(Path(__file__).resolve().parent / "zoology_style_mixer.py")
TINY = ["--preset", "demo", "--steps", "4", "--hp", "n_train=32", "--hp", "n_val=16", "--hp", "n_test=16",
        "--hp", "d_model=16", "--hp", "eval_every=2", "--hp", "n_layers=1"]


@pytest.fixture(autouse=True, scope="module")
def _forget_plugins():
    """The zoology-style plugin registers two mechanisms when a test loads it: drop them after this
    module, so later tests that walk every registered mechanism see only their own."""
    yield
    for name in ("zoology-conv", "zoology-conv-strict"):
        registry._MIXERS.pop(name, None)


def usage_error(capsys, argv: list[str], *needles: str) -> str:
    """Run ``mixzoo argv``: exit code 2 and exactly one stderr line holding every needle."""
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (rc, out[-2000:], err)
    assert len(lines) == 1 and lines[0].startswith("mixzoo: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def nothing_under(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.rglob("*")))


# -- 1. typed, checked hyperparameters --------------------------------------------------------

@pytest.mark.parametrize("hp,needles", [
    ("lr=abc", ["--hp lr='abc': not a float"]),
    ("batch_size=abc", ["--hp batch_size='abc': not an int"]),
    ("batch_size=1.5", ["--hp batch_size='1.5': not an int"]),
    ("learn_ridge=maybe", ["--hp learn_ridge='maybe': not a bool", "true, false"]),
    ("early_stop=soon", ["--hp early_stop='soon': not a float or none"]),
    ("ridge=-1", ["'lla'", "ridge=-1.0", "(0, 700]"]),          # the constructor refuses it
    ("ridge=0", ["'lla'", "ridge=0.0"]),
])
def test_bad_hyperparameter_values_exit_2_before_training(tmp_path, capsys, hp, needles):
    res = tmp_path / "r"
    usage_error(capsys, ["--results", str(res), "--device", "cpu", "run", "mqar", "--model", "lla", *TINY,
                         "--hp", hp], *needles)
    assert nothing_under(res)


def test_values_are_coerced_to_the_declared_types():
    got = api.coerce_hparams("lla", {"lr": 1, "steps": "3", "batch_size": 8.0, "early_stop": "none",
                                     "sparse_head": "no", "compile": True, "ridge": 2, "learn_ridge": "yes",
                                     "rope": 0, "mlp_mult": "2", "norm": "rmsnorm"})
    assert got == {"lr": 1.0, "steps": 3, "batch_size": 8, "early_stop": None, "sparse_head": False,
                   "compile": True, "ridge": 2.0, "learn_ridge": True, "rope": False, "mlp_mult": 2.0,
                   "norm": "rmsnorm"}
    assert [type(got[k]) for k in ("lr", "steps", "batch_size", "ridge", "mlp_mult")] == [float, int, int, float, float]
    with pytest.raises(UsageError, match=r"hparams steps=2\.5: not an int"):
        api.coerce_hparams("lla", {"steps": 2.5})
    with pytest.raises(UsageError, match=r"hparams learn_ridge=2: not a bool"):
        api.coerce_hparams("lla", {"learn_ridge": 2})


def test_python_api_checks_the_same_keys(tmp_path):
    res = tmp_path / "r"
    with pytest.raises(UsageError, match=r"lr='abc': not a float"):
        api.run("mqar", "lla", preset="demo", hparams={"lr": "abc", "steps": 2}, results=res, device="cpu")
    with pytest.raises(UsageError, match=r"mechanism 'lla' refused its settings: ValueError: ridge=-1"):
        api.run("mqar", "lla", preset="demo", hparams={"ridge": -1, "steps": 2}, results=res, device="cpu")
    assert nothing_under(res)


# -- 2. conflicting flags -----------------------------------------------------------------------

@pytest.mark.parametrize("flag,hp", [
    (["--steps", "1"], "steps=7"), (["--lr", "0.01"], "lr=0.02"), (["--batch-size", "4"], "batch_size=8"),
    (["--d-model", "32"], "d_model=16"), (["--optimizer", "muon"], "optimizer=adamw"),
    (["--schedule", "wsd"], "schedule=cosine"),
])
def test_a_flag_and_hp_disagreeing_exit_2_naming_both(tmp_path, capsys, flag, hp):
    res = tmp_path / "r"
    usage_error(capsys, ["--results", str(res), "--device", "cpu", "run", "mqar", "--model", "softmax",
                         "--preset", "demo", *flag, "--hp", hp], f"{flag[0]} {flag[1]}", f"--hp {hp}")
    assert nothing_under(res)


def test_a_flag_and_hp_agreeing_is_no_conflict(tmp_path, capsys):
    # they agree (1e-2 == 0.01), so the run gets as far as the results check
    target = tmp_path / "file"
    target.write_text("x")
    usage_error(capsys, ["--results", str(target), "run", "mqar", "--model", "softmax", "--lr", "0.01",
                         "--hp", "lr=1e-2", "--steps", "3", "--hp", "steps=3"], "is a file")


# -- 3. --results that cannot hold results -------------------------------------------------------

@pytest.mark.parametrize("command", [
    ["run", "mqar", "--model", "softmax", "--preset", "demo", "--steps", "1"],
    ["demo", "--steps", "1"],
    ["check-zoo", "--models", "linear", "--settings", "state-tracking", "--lrs", "1e-3", "--steps", "1",
     "--batch-size", "2"],
])
@pytest.mark.parametrize("how", ["file", "under-a-file", "unwritable"])
def test_results_that_is_a_file_or_unwritable_exits_2(tmp_path, capsys, monkeypatch, command, how):
    f = tmp_path / "results.txt"
    f.write_text("not a directory")
    if how == "file":
        res, needle = f, "is a file, not a directory"
    elif how == "under-a-file":
        res, needle = f / "sub", "is a file, not a directory"
    else:
        res, needle = tmp_path / "locked", "cannot be written"
        res.mkdir()
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: Path(p) != res and real(p, mode, *a, **k))
    usage_error(capsys, ["--results", str(res), "--device", "cpu", *command], f"--results {str(res)!r}", needle)
    assert f.read_text() == "not a directory"
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["results.txt"] + (["locked"] if how == "unwritable" else []))


def test_check_results_dir_accepts_a_new_or_writable_directory(tmp_path):
    assert api.check_results_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()          # creates nothing
    assert api.check_results_dir(tmp_path) == tmp_path


# -- 4. duplicate registration -----------------------------------------------------------------

DUP_MIXER = '''
from torch import nn
from mixzoo.registry import register_mixer

@register_mixer({name!r})
class Dup(nn.Module):
    def __init__(self, d_model, *, num_heads=1, layer_idx=0):
        super().__init__()
        self.p = nn.Linear(d_model, d_model)
        self.backend = "torch"

    def forward(self, x):
        return self.p(x)
'''

DUP_TASK = '''
from dataclasses import dataclass
from mixzoo.registry import register_task
from mixzoo.tasks.base import Task

@register_task("mqar")
@dataclass
class MyMQAR(Task):
    pass
'''


def test_a_plugin_reusing_a_builtin_name_is_refused(tmp_path, capsys):
    p = tmp_path / "steal_softmax.py"
    p.write_text(DUP_MIXER.format(name="softmax"))
    usage_error(capsys, ["--plugin", str(p), "models", "softmax"], "mechanism 'softmax' is already registered",
                "mixzoo.models.softmax", str(p))
    assert registry.get_mixer("softmax").impl.__module__ == "mixzoo.models.softmax"
    t = tmp_path / "steal_mqar.py"
    t.write_text(DUP_TASK)
    usage_error(capsys, ["--plugin", str(t), "tasks"], "task 'mqar' is already registered", "mixzoo.tasks.mqar")
    assert registry.get_task("mqar").__module__ == "mixzoo.tasks.mqar"


def test_a_copy_of_a_plugin_loaded_beside_it_is_refused_naming_the_first(tmp_path, capsys):
    a, b = tmp_path / "a" / "dupmix.py", tmp_path / "b" / "dupmix.py"       # the same file name, twice
    for p in (a, b):
        p.parent.mkdir()
        p.write_text(DUP_MIXER.format(name="inputs-dupmix"))
    try:
        usage_error(capsys, ["--plugin", str(a), "--plugin", str(b), "models", "inputs-dupmix"],
                    "mechanism 'inputs-dupmix' is already registered by plugin file", str(a), str(b))
        assert main(["--plugin", str(a), "models", "inputs-dupmix"]) == 0     # the first, again: loaded once
    finally:
        registry._MIXERS.pop("inputs-dupmix", None)


def test_registering_in_python_refuses_a_taken_name_and_the_pop_pattern_still_works():
    class A(nn.Module):
        pass

    class B(nn.Module):
        pass
    with pytest.raises(UsageError, match="mechanism 'lla' is already registered by module mixzoo.models.lla"):
        registry.register_mixer("lla")(A)
    try:
        registry.register_mixer("inputs-throwaway")(A)
        registry.register_mixer("inputs-throwaway")(A)      # the same class again: fine
        with pytest.raises(UsageError, match="inputs-throwaway"):
            registry.register_mixer("inputs-throwaway")(B)
        registry._MIXERS.pop("inputs-throwaway")
        registry.register_mixer("inputs-throwaway")(B)      # once popped, the name is free
        assert registry.get_mixer("inputs-throwaway").cls is B
    finally:
        registry._MIXERS.pop("inputs-throwaway", None)


# -- 5. causality checked before every run ---------------------------------------------------------

class Leaky(nn.Module):
    """Sees the future: a reversed cumulative sum."""

    def __init__(self, d_model, *, num_heads=1, layer_idx=0):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.backend = "torch"

    def forward(self, x):
        return self.proj(x.flip(1).cumsum(1).flip(1) / x.shape[1])


@pytest.fixture
def leaky():
    registry.register_mixer("inputs-leaky", search_space={})(Leaky)
    yield "inputs-leaky"
    registry._MIXERS.pop("inputs-leaky", None)


def test_a_leaky_mechanism_is_refused_unless_allowed_and_the_row_says_so(tmp_path, capsys, leaky):
    res = tmp_path / "r"
    usage_error(capsys, ["--results", str(res), "--device", "cpu", "run", "mqar", "--model", leaky, *TINY],
                "'inputs-leaky' is not causal", "--allow-noncausal")
    assert nothing_under(res)
    assert main(["--results", str(res), "--device", "cpu", "run", "mqar", "--model", leaky, *TINY,
                 "--allow-noncausal"]) == 0
    capsys.readouterr()
    (row,) = read_table(res).to_pylist()
    assert row["allow_noncausal"] is True and row["state"] == "COMPLETE" and row["schema_version"] >= 3
    with pytest.raises(UsageError, match="not causal"):
        api.run("mqar", leaky, preset="demo", hparams={"steps": 2}, results=None, device="cpu")


# -- 6 and 8. zoology-style plugins; global options after the command ------------------------------

def test_zoology_style_plugin_runs_with_global_options_after_the_command(tmp_path, capsys):
    before, res = tmp_path / "before", tmp_path / "after"
    rc = main(["--results", str(before), "run", "mqar", "--model", "zoology-conv", *TINY,
               "--results", str(res), "--device", "cpu", "--plugin", PLUGIN])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert not before.exists()                  # the value after the command wins
    (row,) = read_table(res).to_pylist()
    assert row["state"] == "COMPLETE" and row["backend"] == "ZoologyConv" and row["allow_noncausal"] is False
    assert row["params"] > 0 and row["device_name"] == "cpu"


def test_zoology_style_plugin_without_kwargs_gets_l_max_and_no_num_heads(tmp_path, capsys):
    res = tmp_path / "r"
    rc = main(["run", "mqar", "--model", "zoology-conv-strict", *TINY, "--hp", "gain=2", "--hp", "bias=no",
               "--results", str(res), "--device", "cpu", "--plugin", PLUGIN])
    assert rc == 0, capsys.readouterr().err
    (row,) = read_table(res).to_pylist()
    assert row["backend"] == "ZoologyConvStrict" and row["state"] == "COMPLETE"
    assert row["hp_gain"] == 2.0 and isinstance(row["hp_gain"], float) and row["hp_bias"] is False
    assert "l_max" not in json.loads(row["hparams_json"])
    capsys.readouterr()
    res2 = tmp_path / "r2"
    usage_error(capsys, ["run", "mqar", "--model", "zoology-conv-strict", *TINY, "--hp", "gain=0",
                         "--results", str(res2), "--plugin", PLUGIN],
                "'zoology-conv-strict' refused its settings: ValueError: gain=0.0; must be > 0")
    usage_error(capsys, ["run", "mqar", "--model", "zoology-conv-strict", *TINY, "--hp", "gain=big",
                         "--results", str(res2), "--plugin", PLUGIN], "--hp gain='big': not a float")
    assert nothing_under(res2)


def test_check_mixer_passes_zoology_style_plugins_with_plugin_after_the_command(capsys):
    assert main(["check-mixer", "zoology-conv", "zoology-conv-strict", "--plugin", PLUGIN]) == 0
    out = capsys.readouterr().out
    assert out.count("pass  backend        no 'backend' attribute: backend defaults to the class name") == 2
    assert "'ZoologyConvStrict'" in out and "all 2 passed" in out


# -- 7. leaderboard --where and export formats ------------------------------------------------------

def _row(**over):
    r = {name: None for name in CORE.names}
    r.update(schema_version=3, run_id="abc-s0", created_at=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
             suite="mqar", task="mqar", task_version=1, model="lla", backend="torch", seed=0,
             metric_name="accuracy", metric_value=0.75, higher_is_better=True, val_metric_value=0.7,
             state="COMPLETE", knobs_json=json.dumps({"V": 64, "kv": 4}), hparams_json="{}", steps=10,
             params=123, knob_V=64, knob_kv=4)
    r.update(over)
    return r


def test_leaderboard_where_with_an_unknown_knob_and_export_with_an_unknown_format(tmp_path, capsys):
    res = tmp_path / "r"
    write_rows(res, [_row()])
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    usage_error(capsys, ["--results", str(res), "leaderboard", "show", "--where", "bogus=1"],
                "--where bogus=1", "knob 'bogus'", "V, kv")
    usage_error(capsys, ["--results", str(res), "leaderboard", "export", "--where", "nope=3", "--out",
                         str(tmp_path / "t.csv")], "knob 'nope'")
    usage_error(capsys, ["--results", str(res), "leaderboard", "export", "--out", str(tmp_path / "f.xyz")],
                "'.xyz'", ".csv, .md")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    # a known knob still filters, an explicit format still overrides the suffix
    assert main(["--results", str(res), "leaderboard", "show", "--where", "kv=4"]) == 0
    assert main(["--results", str(res), "leaderboard", "export", "--format", "md", "--out",
                 str(tmp_path / "f.xyz")]) == 0
    assert (tmp_path / "f.xyz").read_text().startswith("### ")


# -- 9. boolean task knobs listed with their values -------------------------------------------------

def test_tasks_lists_booleans_as_true_false(capsys):
    assert main(["tasks", "icl-regression"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "noisy_train_queries" in ln)
    assert "{true, false}" in line and "None" not in out


# -- the check itself is cheap and leaves the RNG alone -----------------------------------------------

def test_probe_builds_once_checks_causality_and_keeps_the_rng():
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    info = api.probe_mixer("softmax", {}, 32, 2, seq_len=1024)
    assert info["checked"] and info["leak"] is not None and info["has_backend"]
    assert torch.equal(torch.rand(3), want)
