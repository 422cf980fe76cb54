"""The typed run spec: built and validated once where input enters (the command line,
a run spec file, a sweep spec, the Python API), frozen, complete (every mechanism knob with its
value or default), hashed, and written whole into the row; one ``KEY=VALUE`` syntax with its
aliases; the vocabulary of presets and budgets, ``--models`` everywhere. No test here trains
except through the shared tiny store of test_store_schema."""
from __future__ import annotations

import dataclasses
import json

import pytest
from test_sweeps_helpers import write_spec

from mixzoo.cli import build_parser, main
from mixzoo.commands import run_spec_of
from mixzoo.errors import UsageError
from mixzoo.spec import RunSpec, build, known_columns, setting_label


def one_error(capsys, argv, *needles) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("mixzoo: error: "), (rc, err)
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


def cli_spec(*argv) -> RunSpec:
    return run_spec_of(build_parser().parse_args(["run", *argv]))


# -- the spec itself -----------------------------------------------------------------------------

def test_spec_is_frozen_complete_and_hashed():
    s = build("mqar", "lla", preset="demo", hparams={"lr": "3e-3", "steps": 5})
    # every constructor knob, the ones left at their default included (read from the signature)
    assert dict(s.mixer_knobs) == {"ridge": 1.0, "learn_ridge": False, "rope": True, "backend": "auto",
                                 "solve": "auto"}
    assert s.train["lr"] == 0.003 and s.train["steps"] == 5 and "wd_anneal_gamma" in s.train
    assert s.backbone["d_model"] == 64 and s.backbone["short_conv"] == 0 and s.task_knobs["V"] == 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 3
    with pytest.raises(TypeError):
        s.train["lr"] = 1.0
    # a content hash: the preset is a label, the seed is content but not configuration
    same = build("mqar", "lla", knobs=dict(s.task_knobs), hparams={"lr": 0.003, "steps": 5.0})
    assert same.hash == s.hash and same.task_preset is None and hash(same) == hash(s)
    other = s.with_seed(1)
    assert other.hash != s.hash and other.config_hash == s.config_hash
    assert s.with_hparams({"ridge": 2}).config_hash != s.config_hash
    # the row's spec_json rebuilds (and re-validates) the same spec
    back = RunSpec.from_json(s.to_json())
    assert back == s and back.hash == s.hash
    assert s.hparams()["ridge"] == 1.0 and s.setting == "V=32, L=32, kv=4"


def test_spec_json_is_validated_when_read_back():
    d = build("mqar", "softmax").to_dict()
    d["train"]["lr"] = "fast"
    with pytest.raises(UsageError, match=r"spec_json train.lr='fast': not a float"):
        RunSpec.from_json(json.dumps(d))
    d = build("mqar", "softmax").to_dict()
    d["task_version"] = 999
    with pytest.raises(UsageError, match="version 999"):
        RunSpec.from_json(json.dumps(d))


def test_a_knob_the_flat_namespace_cannot_reach_is_reachable_by_section():
    # hyena's own short_conv is shadowed by the backbone's short_conv in the flat namespace
    s = cli_spec("mqar", "--model", "hyena", "--set", "mixer.short_conv=5", "--hp", "short_conv=2")
    assert s.mixer_knobs["short_conv"] == 5 and s.backbone["short_conv"] == 2


def test_setting_label_is_one_text_per_setting():
    assert setting_label("mqar", build("mqar", "softmax", preset="demo").task_knobs) == "V=32, L=32, kv=4"
    knobs = dict(build("mqar", "softmax", knobs={"filler": "zero"}).task_knobs)
    assert setting_label("mqar", knobs) == "V=8192, L=64, kv=4, filler=zero"


def test_known_columns_cover_every_registered_knob_and_key():
    cols = known_columns()
    assert cols["hp_ridge"][0] is float and cols["hp_lr"][0] is float and cols["hp_steps"] == (int,)
    assert cols["hp_optimizer"] == (str,) and cols["knob_kv"] == (int,) and cols["knob_N"] == (int,)
    assert cols["hp_allow_neg_eigval"] == (bool,) and "hp_l_max" not in cols


# -- the command line: one KEY=VALUE syntax -----------------------------------------------------

def test_set_hp_and_model_knobs_are_one_syntax():
    s = cli_spec("mqar", "--model", "lla:learn_ridge=yes", "--set", "kv=8", "--set", "lr=3e-3",
                 "--set", "ridge=2", "--set", "mixer.rope=false", "--set", "backbone.d_model=32",
                 "--hp", "model.num_heads=4", "--set", "train.steps=9", "--recipe", "based")
    assert s.task_knobs["kv"] == 8 and s.train["lr"] == 0.003 and s.train["steps"] == 9
    assert dict(s.mixer_knobs) == {"ridge": 2.0, "learn_ridge": True, "rope": False, "backend": "auto",
                                 "solve": "auto"}
    assert s.backbone["d_model"] == 32 and s.backbone["num_heads"] == 4 and s.backbone["short_conv"] == 3
    # a task knob and a trainer key of one name: --set means the task's, --hp the trainer's
    s = cli_spec("mad-memorization", "--model", "softmax", "--set", "n_train=64", "--hp", "n_train=32")
    assert s.task_knobs["n_train"] == 64 and s.train["n_train"] == 32


@pytest.mark.parametrize("argv,needles", [
    (["--set", "bogus=1"], ["unknown knob 'bogus'", "kv", "ridge"]),
    (["--hp", "kv=8"], ["unknown hyperparameter 'kv' for lla"]),
    (["--set", "mixer.ridge=abc"], ["--set ridge='abc': not a float"]),
    (["--set", "train.nope=1"], ["unknown train key 'nope'"]),
    (["--set", "lr=0.01", "--hp", "lr=0.02"], ["--set lr=0.01", "--hp lr=0.02", "give one of them"]),
    (["--hp", "ridge=3", "--model", "lla:ridge=2"], ["--hp ridge=3", "--model lla: ridge=2"]),
    (["--steps", "1", "--set", "train.steps=7"], ["--steps 1", "--set train.steps=7"]),
])
def test_bad_key_values_exit_2_before_anything(tmp_path, capsys, argv, needles):
    res = tmp_path / "r"
    one_error(capsys, ["--results", str(res), "run", "mqar", "--model", "lla", *argv], *needles)
    assert not res.exists()


def test_run_spec_file_with_overrides_and_its_bad_values(tmp_path, capsys):
    f = tmp_path / "run.toml"
    f.write_text('task = "mqar"\ntask_preset = "demo"\nmodel = "lla"\nrecipe = "based"\nseed = 2\n'
                 '[mixer_knobs]\nridge = 3\n[train]\nsteps = 40\nlr = 0.01\n[backbone]\nd_model = 32\n')
    s = cli_spec("--spec", str(f), "--steps", "7")
    assert (s.task, s.model, s.recipe, s.seed, s.task_preset) == ("mqar", "lla", "based", 2, "demo")
    assert s.mixer_knobs["ridge"] == 3.0 and s.train["steps"] == 7 and s.train["lr"] == 0.01
    assert s.backbone["d_model"] == 32 and s.backbone["short_conv"] == 3
    js = tmp_path / "row.json"                    # a row's spec_json is a spec file too
    js.write_text(s.to_json())
    assert cli_spec("--spec", str(js)).hash == s.hash
    bad = tmp_path / "bad.toml"
    bad.write_text('task = "mqar"\nmodel = "lla"\n[train]\nlr = "abc"\n')
    one_error(capsys, ["--results", str(tmp_path / "r"), "run", "--spec", str(bad)], str(bad), "lr='abc'")
    bad.write_text('task = "mqar"\nmodel = "lla"\ncolour = 1\n')
    one_error(capsys, ["run", "--spec", str(bad)], "unknown key 'colour'", "task_knobs")
    assert not (tmp_path / "r").exists()


# -- sweeps: specs typed at load, studies named by the spec's hash -----------------------------------

def test_sweep_spec_values_are_typed_when_loaded(tmp_path, capsys):
    ok = write_spec(tmp_path / "ok.toml", name="t", models=["lla"], trials=1, seeds=1)
    bad = tmp_path / "bad.toml"
    bad.write_text(ok.read_text().replace("steps = 20", 'steps = "many"'))
    one_error(capsys, ["--results", str(tmp_path / "r"), "sweep", str(bad), "--list"], "steps='many'", "an int")
    bad.write_text('enqueue = [{ ridge = "big" }]\n' + ok.read_text())
    one_error(capsys, ["--results", str(tmp_path / "r"), "sweep", str(bad), "--list"],
              "enqueue ridge='big'", "a float")
    assert not (tmp_path / "r").exists()


def test_study_identity_is_the_resolved_spec(tmp_path):
    from mixzoo.sweeps.spec import load
    p1 = write_spec(tmp_path / "a.toml", name="t", models=["lla"], trials=1, seeds=1)
    p2 = tmp_path / "b.toml"          # the same, with a trainer default written out
    p2.write_text(p1.read_text().replace("[train]\n", "[train]\neval_batch_size = 256\n"))
    (u1,), (u2,) = load(str(p1)).units, load(str(p2)).units
    assert u1.fixed != u2.fixed and u1.study == u2.study
    assert u1.run_spec().config_hash == u2.run_spec().config_hash
    assert u1.setting_label == "V=32, L=32, kv=2"


# -- one vocabulary ----------------------------------------------------------------------------------

def test_budget_is_named_apart_from_the_task_preset(capsys):
    assert main(["sweep", "mqar", "--budget", "smoke", "--list"]) == 0
    out, err = capsys.readouterr()
    assert "mqar [smoke]" in out and err == ""
    assert main(["sweep", "mqar", "--preset", "smoke", "--list"]) == 0      # the old spelling, one release
    out, err = capsys.readouterr()
    assert "mqar [smoke]" in out and "--preset is deprecated; use --budget" in err
    one_error(capsys, ["compare", "mqar", "--models", "softmax", "--axis", "kv=2,4", "--preset", "huge"],
              "unknown preset 'huge' of task mqar", "demo", "a budget is --budget: paper, small, smoke")


def test_models_everywhere_and_knob_aliases(capsys, monkeypatch):
    p = build_parser()
    assert p.parse_args(["ttr", "--models", "lla,mesa"]).mechanisms == "lla,mesa"
    assert p.parse_args(["ttr", "--mechanisms", "lla"]).mechanisms == "lla"
    assert "--mechanisms is deprecated; use --models" in capsys.readouterr().err
    assert p.parse_args(["leaderboard", "show", "--models", "a,b"]).model == "a,b"
    assert p.parse_args(["check-mixer", "--set", "rope=false"]).knob == ["rope=false"]
    assert p.parse_args(["check-mixer", "--knob", "rope=false"]).knob == ["rope=false"]
    import mixzoo.check
    seen = []
    monkeypatch.setattr(mixzoo.check, "check_mixer", lambda n, knobs, **kw: seen.append((n, knobs)) or [])
    assert main(["check-mixer", "gdn:allow_neg_eigval=true", "--models", "linear,softmax", "linear:feature_map=identity",
                 "--set", "chunk_size=8", "--device", "cpu"]) == 0
    assert "check-mixer: 3 mechanism(s)" in capsys.readouterr().out
    assert seen == [("gdn", {"chunk_size": 8, "allow_neg_eigval": True}),
                    ("linear", {"chunk_size": 8, "feature_map": "identity"}), ("softmax", {"chunk_size": 8})]
    one_error(capsys, ["check-mixer", "linear:feature_map"], "'feature_map' is not KEY=VALUE")


def test_each_leaderboard_action_has_its_own_help(capsys):
    for action, has, lacks in (("show", "--view", "--kind"), ("plot", "--kind", "--view"),
                               ("export", "--format", "--kind"), ("report", "--out", "--where")):
        with pytest.raises(SystemExit) as e:
            main(["leaderboard", action, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and f"leaderboard {action}" in out and has in out and lacks not in out, out
    with pytest.raises(SystemExit):
        main(["leaderboard"])
    assert "required" in capsys.readouterr().err


def test_the_hash_names_the_mlp_s_derived_width(monkeypatch):
    # the inner width is derived from (d_model, mlp, mlp_mult) by a rule; a change of the rule is another run
    from mixzoo.models import backbones
    mad = lambda: build("mad-recall", "softmax", knobs={}, preset=None, hparams={}, recipe="mad", label="t").hash  # noqa: E731
    zoo = lambda: build("mqar", "softmax", knobs={}, preset=None, hparams={}, recipe="zoology", label="t").hash  # noqa: E731
    before = mad(), zoo()
    monkeypatch.setattr(backbones, "mlp_hidden", lambda d, kind, mult: 341)
    assert mad() != before[0] and zoo() == before[1]       # no MLP (zoology): nothing derived to hash
