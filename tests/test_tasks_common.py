"""Contract checks shared by every built-in task: determinism, disjoint splits, knobs."""
import dataclasses

import pytest
import torch

from mixzoo.cli import main as cli_main
from mixzoo.errors import UsageError
from mixzoo.registry import tasks
from mixzoo.tasks.base import leakage

SMALL = {
    "mqar": dict(V=64, L=64, kv=4),
    "mad-recall": dict(V=16, L=32),
    "mad-noisy-recall": dict(V=32, L=32),
    "mad-fuzzy-recall": dict(V=16, L=64),
    "mad-selective-copy": dict(V=16, L=64, n_copy=8),
    "mad-compression": dict(V=16, L=32),
    "mad-memorization": dict(V=256, L=32),
    "state-tracking": dict(N=12),
    "icl-regression": dict(L=16, S=4, d_x=4, d_y=4, n_queries=4),
    "ttr": dict(d=4, L=32, S=8),
}


def test_every_task_is_covered():
    assert set(SMALL) <= set(tasks())
    for name in ("mad-recall", "mad-fuzzy-recall", "mad-noisy-recall", "mad-selective-copy",
                 "mad-compression", "mad-memorization"):
        assert tasks()[name].suite == "mad"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_deterministic_and_disjoint(name):
    t = tasks()[name](**SMALL[name])
    a, b = t.generate("train", 64, 3), t.generate("train", 64, 3)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and torch.equal(a.mask, b.mask)
    other = t.generate("train", 64, 4)
    assert not torch.equal(a.inputs, other.inputs)
    val, test = t.generate("val", 64, 3), t.generate("test", 64, 3)
    for x in (val, test):
        assert x.inputs.shape[1] == t.seq_len == a.inputs.shape[1]
        assert x.mask.any(1).all(), "every example has a supervised position"
    assert leakage(a, test) == 0.0 and leakage(a, val) == 0.0 and leakage(val, test) == 0.0
    if t.kind == "classification":
        assert a.inputs.dtype == torch.long and a.targets.dtype == torch.long
        assert int(a.inputs.max()) < t.vocab_size and int(a.inputs.min()) >= 0
        sup = a.targets[a.mask]
        assert int(sup.min()) >= 0 and int(sup.max()) < t.vocab_size
        assert (a.targets[~a.mask] == -100).all()
    for v in a.slices.values():
        assert v.shape == (64,)


def test_leakage_detects_overlap():
    t = tasks()["mad-compression"](V=4, L=2)       # 3 possible sequences: overlap certain
    assert leakage(t.generate("train", 50, 0), t.generate("test", 50, 0)) == 1.0


@pytest.mark.parametrize("name", sorted(SMALL))
def test_knobs_declare_help_and_range(name):
    cls = tasks()[name]
    for f in dataclasses.fields(cls):
        m = f.metadata
        assert m.get("help"), f"{name}.{f.name} has no help"
        if not isinstance(f.default, bool | str):
            assert m.get("lo") is not None and m.get("hi") is not None, f"{name}.{f.name} has no range"
        if isinstance(f.default, str):
            assert f.default in m["choices"]
    for preset in cls.presets:
        cls.from_knobs(preset=preset)          # every preset validates


@pytest.mark.parametrize("name,knob", [("mad-recall", "L=33"), ("mad-selective-copy", "n_copy=200"),
                                       ("state-tracking", "N=1"), ("icl-regression", "S=5"),
                                       ("mad-fuzzy-recall", "k_motif=9"), ("ttr", "S=3")])
def test_bad_knob_is_a_usage_error(name, knob):
    k, v = knob.split("=")
    with pytest.raises(UsageError):
        tasks()[name].from_knobs({k: v})


def test_cli_lists_tasks_and_rejects_bad_knob(capsys):
    assert cli_main(["tasks", "mad-recall", "ttr"]) == 0
    out = capsys.readouterr().out
    assert "mad-recall" in out and "class_accuracy" in out and "train_targets" in out
    assert cli_main(["ttr", "--segment", "7", "--seq-len", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "S=7" in err[0]
