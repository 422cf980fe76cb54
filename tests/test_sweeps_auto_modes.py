"""A sweep's default step modes: on a CUDA device runs are graphed and ``stack = "auto"`` stacks
by the run's size (``train.packing.stack_per_step``); on a CPU they are eager, one at a time; an
explicit ``stack`` or ``[train] step_mode`` is kept. (The GPU side of the numbers:
tests/gpu/test_throughput_gpu.py; here the choice itself, with a context that says CUDA.)"""
from __future__ import annotations

import pytest
from test_sweeps_helpers import write_spec

from mixzoo.cli import main
from mixzoo.sweeps import engine
from mixzoo.sweeps.spec import load
from mixzoo.train.packing import stack_per_step


def _ctx(cuda: bool):
    return engine.Context(storage=None, storage_url="", results="", device="cuda" if cuda else "cpu",
                          command=None, log=lambda s: None, trainer_log=lambda s: None, cuda=cuda)


def _unit(tmp_path, extra: str = "", train_extra: str = "", settings: str = "[{ L = 32, kv = 2 }]"):
    p = write_spec(tmp_path / "s.toml", name="t-auto", models=["softmax"], trials=2, seeds=2, extra=extra,
                   settings=settings)
    if train_extra:
        p.write_text(p.read_text().replace("[train]\n", "[train]\n" + train_extra + "\n", 1))
    return load(str(p)).units[0]


def test_stack_per_step_is_16_at_mad_s_baseline_and_fewer_for_larger_runs():
    assert stack_per_step(128, 128, 128) == 16
    assert stack_per_step(128, 512, 128) == 4            # mqar L = 512 at width 128
    assert stack_per_step(64, 32, 64) == 16              # small runs: capped
    assert stack_per_step(256, 2048, 256) == 1


def test_on_a_gpu_the_default_is_graphed_and_stacked_by_size(tmp_path):
    u = _unit(tmp_path)
    assert u.stack is None                               # "auto"
    gpu, cpu = _ctx(True), _ctx(False)
    spec = u.run_spec()
    want = stack_per_step(spec.train_config().batch_size, spec.make_task().seq_len, spec.model_config().d_model)
    assert engine.stack_size(gpu, u, "final", {}) == want > 1
    assert engine.stack_size(cpu, u, "final", {}) == 1
    assert engine.as_run_here(gpu, u, spec).train["step_mode"] == "graphed"
    assert engine.as_run_here(cpu, u, spec) is spec
    assert engine._stacked_mode(gpu, u) == "stacked+graphed" and engine._stacked_mode(cpu, u) == "stacked"
    # not part of what a run computes: the study and the config hash are the same either way
    assert engine.as_run_here(gpu, u, spec).config_hash == spec.config_hash


def test_explicit_stack_and_step_mode_are_kept(tmp_path):
    u = _unit(tmp_path, extra="stack = 1\n", train_extra='step_mode = "eager"')
    gpu = _ctx(True)
    assert engine.stack_size(gpu, u, "final", {}) == 1
    assert engine.as_run_here(gpu, u, u.run_spec()).train["step_mode"] == "eager"
    assert engine._stacked_mode(gpu, u) == "stacked"
    u3 = _unit(tmp_path, extra="stack = 3\n")
    assert engine.stack_size(gpu, u3, "final", {}) == 3 and engine.stack_size(_ctx(False), u3, "final", {}) == 3


@pytest.mark.parametrize("bad", ["0", "x", "-2"])
def test_bad_stack_exits_2(tmp_path, capsys, bad):
    p = write_spec(tmp_path / "s.toml", name="t-auto", models=["softmax"], trials=2, seeds=2)
    assert main(["--results", str(tmp_path / "r"), "sweep", str(p), "--stack", bad]) == 2
    assert "--stack" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_stack_auto_from_the_command_line_and_the_spec(tmp_path):
    p = write_spec(tmp_path / "s.toml", name="t-auto", models=["softmax"], trials=2, seeds=2, extra='stack = "auto"\n')
    assert load(str(p)).units[0].stack is None
    assert load(str(p), stack=2).units[0].stack == 2
    p2 = write_spec(tmp_path / "s2.toml", name="t-auto", models=["softmax"], trials=2, seeds=2, extra='stack = "many"\n')
    with pytest.raises(Exception, match="stack"):
        load(str(p2))
