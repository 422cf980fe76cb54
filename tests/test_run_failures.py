"""A mechanism that raises or diverges inside ``mixzoo run``: one stderr line, exit code 1 and a
FAIL row with its reason; bad input (a constructor refusing its knobs included) still exits 2,
Ctrl+C still exits 130."""
from __future__ import annotations

import signal

import pytest
import torch
from torch import nn

from mixzoo import registry
from mixzoo.cli import main
from mixzoo.leaderboard import read_table

NAME = "zoo-failmix"
PREFIX = "mixzoo: run failed:"


class FailMix(nn.Module):
    """A causal running mean that misbehaves on purpose: from its ``after``-th forward call on it
    raises (``mode="raise"``), returns NaN (``"poison"``) or is interrupted (``"interrupt"``);
    ``width < 1`` is refused when built."""

    def __init__(self, d_model, *, num_heads=1, layer_idx=0, mode="ok", after=5, width=1):
        super().__init__()
        if width < 1:
            raise ValueError(f"width={width}; must be >= 1\n(a second line that must not reach the reason)")
        self.proj = nn.Linear(d_model, d_model)
        self.mode, self.after, self.calls = mode, after, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > self.after:
            if self.mode == "raise":
                raise RuntimeError(f"kernel exploded at call {self.calls}\nsecond line of the message")
            if self.mode == "interrupt":
                raise KeyboardInterrupt
        n = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
        y = torch.cumsum(self.proj(x), dim=1) / n
        return y * float("nan") if self.mode == "poison" and self.calls > self.after else y


@pytest.fixture(autouse=True)
def failmix():
    registry.register_mixer(NAME, search_space={"mode": ("cat", ["ok", "raise"])})(FailMix)
    yield
    registry._MIXERS.pop(NAME, None)


# one mixer layer: its forward calls are the training steps plus one per validation pass
TINY = ["--hp", "eval_every=10", "--hp", "batch_size=8", "--hp", "n_train=160", "--hp", "n_val=32",
        "--hp", "n_test=32", "--hp", "d_model=16", "--hp", "n_layers=1", "--hp", "num_heads=1"]


def _run(res, capsys, *hp: str, seeds=("0",)) -> tuple[int, str, str]:
    argv = ["--results", str(res), "--device", "cpu", "run", "mqar", "--model", NAME, "--preset", "demo",
            "--steps", "20", *TINY]
    for h in hp:
        argv += ["--hp", h]
    for s in seeds:
        argv += ["--seed", s]
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _failed_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(PREFIX)]


def test_raising_forward_is_a_fail_row_with_one_stderr_line(tmp_path, capsys):
    res = tmp_path / "r"
    rc, out, err = _run(res, capsys, "mode=raise", "after=15")
    assert rc == 1
    reason = "RuntimeError: kernel exploded at call 16"
    assert _failed_lines(err) == [f"{PREFIX} {NAME} on mqar seed 0: FAIL: {reason}"], err
    assert "Traceback" not in err
    assert out.count("Traceback") == 1 and "second line of the message" in out   # the full trace, once, in the log
    (row,) = read_table(res).to_pylist()
    assert row["state"] == "FAIL" and row["state_reason"] == reason
    assert row["model"] == NAME and row["seed"] == 0 and row["metric_value"] is None
    # calls 1-10 train, 11 validates at step 10, 12-15 train: the 16th (step 15) raised
    assert row["steps"] == 14 and row["params"] > 0 and row["train_time_s"] > 0
    assert row["peak_mem_bytes"] > 0 and row["wall_time_s"] > 0


def test_every_failed_seed_gets_its_line(tmp_path, capsys):
    rc, _, err = _run(tmp_path / "r", capsys, "mode=raise", "after=3", seeds=("0", "1"))
    assert rc == 1
    lines = _failed_lines(err)
    assert [ln.split(":")[2] for ln in lines] == [f" {NAME} on mqar seed 0", f" {NAME} on mqar seed 1"], lines
    assert {r["state"] for r in read_table(tmp_path / "r").to_pylist()} == {"FAIL"}


def test_nan_output_is_a_diverged_fail_row(tmp_path, capsys):
    res = tmp_path / "r"
    rc, _, err = _run(res, capsys, "mode=poison", "after=5")
    assert rc == 1
    (line,) = _failed_lines(err)
    assert line.startswith(f"{PREFIX} {NAME} on mqar seed 0: FAIL: non-finite loss at step 10"), line
    assert "Traceback" not in err
    (row,) = read_table(res).to_pylist()
    assert row["state"] == "FAIL" and row["state_reason"].startswith("non-finite loss at step 10")
    assert row["steps"] == 10


def test_value_error_in_init_is_bad_input_exit_2_and_writes_nothing(tmp_path, capsys):
    # the mechanism is built once on the CPU before any data is generated: a constructor refusing
    # its knobs is bad input (one line, exit 2, no row); what it raises later is a FAIL row (above)
    res = tmp_path / "r"
    rc, out, err = _run(res, capsys, "width=0")
    assert rc == 2
    assert err.strip().splitlines() == [
        f"mixzoo: error: mechanism {NAME!r} refused its settings: ValueError: width=0; must be >= 1"], err
    assert not _failed_lines(err) and "Traceback" not in out + err
    assert not res.exists()


def test_a_complete_run_still_exits_0(tmp_path, capsys):
    rc, _, err = _run(tmp_path / "r", capsys, "mode=raise", "after=1000")
    assert rc == 0 and not _failed_lines(err)
    (row,) = read_table(tmp_path / "r").to_pylist()
    assert row["state"] == "COMPLETE" and row["state_reason"] is None


def test_unknown_hyperparameter_still_exits_2_and_writes_nothing(tmp_path, capsys):
    res = tmp_path / "r"
    rc, _, err = _run(res, capsys, "bogus=1")
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mixzoo: error:") and "bogus" in lines[0]
    assert not res.exists()


def test_keyboard_interrupt_from_forward_exits_130(tmp_path, capsys):
    res = tmp_path / "r"
    before = signal.getsignal(signal.SIGINT)
    rc, _, err = _run(res, capsys, "mode=interrupt", "after=3")
    assert rc == 130
    assert err.strip().splitlines()[-1] == "mixzoo: interrupted" and not _failed_lines(err)
    assert signal.getsignal(signal.SIGINT) is before     # Lightning's SIG_IGN undone
    assert not res.exists() or read_table(res).num_rows == 0


def test_train_api_propagates_keyboard_interrupt_and_callback_errors():
    import lightning.pytorch as pl

    from mixzoo.models import ModelConfig
    from mixzoo.tasks.mqar import MQAR
    from mixzoo.train import TrainConfig, train
    task = MQAR(V=16, L=16, kv=2)
    cfg = TrainConfig(steps=6, batch_size=8, eval_every=3, n_train=48, n_val=16, n_test=16)
    mcfg = ModelConfig(d_model=16, num_heads=1, n_layers=1)
    with pytest.raises(KeyboardInterrupt):
        train(task, NAME, {"mode": "interrupt", "after": 2}, mcfg, cfg, device="cpu")

    class Boom(Exception):
        pass

    class Raiser(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                raise Boom("the caller's own callback")
    with pytest.raises(Boom):
        train(task, NAME, {}, mcfg, cfg, device="cpu", callbacks=[Raiser()])

    logs = []
    r = train(task, NAME, {"mode": "raise", "after": 4}, mcfg, cfg, device="cpu", log=logs.append)
    assert r.state == "FAIL" and r.reason == "RuntimeError: kernel exploded at call 5" and r.steps == 3
    assert not r.test and sum("Traceback" in m for m in logs) == 1   # call 4 validated at step 3; 5 is step 4


def test_a_raising_sweep_trial_is_recorded_failed_with_its_reason(tmp_path, capsys):
    from test_sweeps_helpers import journal, rows, studies, write_spec
    spec = write_spec(tmp_path / "f.toml", name="t-raise", models=[NAME], trials=2, seeds=1,
                      extra='enqueue = [{ mode = "raise" }, { mode = "ok" }]\n[pruner]\nkind = "none"\n')
    res = tmp_path / "res"
    assert main(["--results", str(res), "--device", "cpu", "sweep", str(spec)]) == 0
    st = studies(journal(res))
    search = next(v for k, v in st.items() if not k.endswith(":final"))
    bad = [t for t in search if t.state.name == "FAIL"]
    assert len(bad) == 1 and bad[0].params["mode"] == "raise"
    assert bad[0].user_attrs["reason"].startswith("RuntimeError: kernel exploded at call")
    assert "FAIL (RuntimeError: kernel exploded" in capsys.readouterr().out
    logs = "".join(p.read_text() for p in (res / "sweeps" / "logs").iterdir())
    assert "Traceback" in logs and "second line of the message" in logs    # the trace, in the worker log
    assert [r["state"] for r in rows(res)] == ["COMPLETE"]
