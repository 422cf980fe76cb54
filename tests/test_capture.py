"""The non-finite capture (mixzoo.train.capture): it stops at the first non-finite step, names the
module where the forward first went non-finite, saves what is needed to replay the step, and the
replay compares a mixer's path with its float64 reference."""
from __future__ import annotations

import torch
from torch import nn

from mixzoo import registry
from mixzoo.api import make_task, split_hparams
from mixzoo.models.lla import LocalLinearAttention
from mixzoo.train import train
from mixzoo.train.capture import NonFiniteCapture, replay_mixer

NAME = "capture-blowup"


class BlowUp(nn.Module):
    """A causal running mean whose output is multiplied by inf from the ``after``-th training call on."""

    def __init__(self, d_model, *, num_heads=1, layer_idx=0, after=7):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.after, self.calls = after, 0
        self.backend = "torch"

    def forward(self, x):
        if self.training:
            self.calls += 1
        n = torch.arange(1, x.shape[1] + 1, dtype=x.dtype).view(1, -1, 1)
        y = torch.cumsum(self.proj(x), dim=1) / n
        return y * float("inf") if self.calls >= self.after else y


def test_capture_stops_at_first_nonfinite_step_and_saves_it(tmp_path):
    registry.register_mixer(NAME, search_space={})(BlowUp)
    try:
        task = make_task("mqar", preset="demo")
        tcfg, mcfg, mix = split_hparams(dict(steps=30, batch_size=8, eval_every=10, n_train=240, n_val=16,
                                             n_test=16, d_model=16, n_layers=2, num_heads=1), "zoology")
        cap = NonFiniteCapture(tmp_path, meta={"why": "test"})
        res = train(task, NAME, mix, mcfg, tcfg, seed=0, device="cpu", callbacks=[cap])
    finally:
        registry._MIXERS.pop(NAME, None)
    assert res.state == "FAIL"
    # two mixer layers call forward once each per step: the 7th call is the first layer's at step 6
    assert cap.step == 6 and res.steps == 6
    assert "non-finite at step 6" in res.reason and str(cap.path) in res.reason
    rec = torch.load(cap.path, weights_only=False)
    assert rec["forward"] == "trunk.blocks.0.mixer"
    assert rec["meta"] == {"why": "test"} and rec["step"] == 6
    assert rec["batch"]["inputs"].shape == (8, task.seq_len)
    assert set(rec["mixer_in"]) == {0, 1} and torch.isfinite(rec["mixer_in"][0]).all()
    assert not torch.isfinite(rec["mixer_in"][1]).all()        # the second layer sees the first's inf
    assert "trunk.blocks.0.mixer.proj.weight" in rec["nonfinite_grads_in_step"]
    assert set(rec["state_dict"]) >= {"embed.weight", "trunk.blocks.0.mixer.proj.weight"}


def test_replay_mixer_compares_path_with_float64_reference():
    torch.manual_seed(0)
    m = LocalLinearAttention(32, num_heads=2, ridge=1.0)
    x, g = torch.randn(2, 24, 32), torch.randn(2, 24, 32)
    r = replay_mixer(m, x, g, device="cpu")
    assert r["fast_backend"] == "torch" and r["f64_backend"] == "torch"
    assert r["out_finite"] and r["dx_finite"] and r["ref_out_finite"]
    assert r["out_rel"] < 1e-4 and r["dx_rel"] < 1e-4          # float32 against float64
    assert set(r["grads"]) == {"qkv.weight", "out.weight"}
    assert all(e < 1e-3 and fin and ref_fin for e, fin, ref_fin in r["grads"].values())
    # a poisoned input is reported as such, not raised
    x[0, 3, 0] = float("nan")
    bad = replay_mixer(m, x, g, device="cpu")
    assert not bad["out_finite"] and not bad["ref_out_finite"]
