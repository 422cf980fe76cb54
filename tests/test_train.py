import math

import pytest
import torch

from mixzoo.models import ModelConfig
from mixzoo.tasks.mqar import MQAR
from mixzoo.train import TrainConfig, train
from mixzoo.train.loop import batch_order


def _mqar_run(model: str, steps: int):
    task = MQAR(V=16, L=16, kv=2)                      # values from 8 tokens: chance is 1/8
    cfg = TrainConfig(steps=steps, batch_size=64, lr=1e-2, warmup_frac=0.02, eval_every=50,
                      n_train=steps * 64, n_val=256, n_test=256)
    mcfg = ModelConfig(d_model=32, num_heads=2, n_layers=2, short_conv=3)
    return train(task, model, {}, mcfg, cfg, seed=0, device="cpu")


@pytest.mark.parametrize("model", ["softmax", "lla"])
def test_tiny_model_learns_mqar(model):
    res = _mqar_run(model, 200)
    assert res.state == "COMPLETE", res.reason
    first = res.history[0]["accuracy"]
    assert res.test["accuracy"] > 0.8, (first, res.test)           # far above chance (0.125)
    assert res.test["accuracy"] > first + 0.3
    assert res.history[-1]["train_loss"] < res.history[0]["train_loss"]
    assert res.steps == 200 and res.steps_per_s > 0 and res.params > 0
    assert res.backend == ("sdpa" if model == "softmax" else "torch")


def test_early_stop_and_best_checkpoint_on_validation():
    task = MQAR(V=16, L=16, kv=2)
    cfg = TrainConfig(steps=400, batch_size=64, lr=1e-2, warmup_frac=0.02, eval_every=25, early_stop=0.9,
                      n_train=400 * 64, n_val=256, n_test=256)
    res = train(task, "softmax", {}, ModelConfig(d_model=32, num_heads=2, short_conv=3), cfg, seed=0, device="cpu")
    assert res.steps < 400                              # stopped once validation passed 0.9
    assert res.history[-1]["accuracy"] >= 0.9
    assert res.val["accuracy"] == max(h["accuracy"] for h in res.history)
    assert res.best_step in [h["step"] for h in res.history]


def test_divergence_is_a_failed_run_not_a_crash():
    task = MQAR(V=16, L=16, kv=2)
    cfg = TrainConfig(steps=20, batch_size=8, lr=1e6, grad_clip=0.0, eval_every=10, n_train=160, n_val=16, n_test=16)
    res = train(task, "softmax", {}, ModelConfig(d_model=16, num_heads=2), cfg, seed=0, device="cpu")
    assert res.state == "FAIL" and "non-finite" in res.reason and not res.test


def test_on_eval_hook_sees_every_validation_and_can_stop_the_run():
    seen = []

    class Stop(Exception):
        pass

    def hook(step, val):
        seen.append(step)
        if step >= 20:
            raise Stop
    task = MQAR(V=16, L=16, kv=2)
    cfg = TrainConfig(steps=100, batch_size=8, eval_every=10, n_train=800, n_val=16, n_test=16)
    with pytest.raises(Stop):
        train(task, "softmax", {}, ModelConfig(d_model=16, num_heads=2), cfg, seed=0, device="cpu", on_eval=hook)
    assert seen == [10, 20]


def test_batch_order_is_a_permutation_per_epoch():
    o = batch_order(10, 5, 4, seed=1)                   # 20 draws = two epochs of 10
    flat = o.flatten()
    assert sorted(flat[:10].tolist()) == list(range(10)) and sorted(flat[10:].tolist()) == list(range(10))
    assert torch.equal(o, batch_order(10, 5, 4, seed=1))


def test_gradients_are_clipped():
    from mixzoo.train import loop
    task = MQAR(V=16, L=16, kv=2)
    norms = []
    orig = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm, **kw):
        params = list(params)
        total = orig(params, max_norm, **kw)
        norms.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)))
        return total
    torch.nn.utils.clip_grad_norm_ = spy
    try:
        cfg = TrainConfig(steps=5, batch_size=8, lr=1e-3, grad_clip=1e-3, eval_every=5, n_train=40, n_val=8, n_test=8)
        loop.train(task, "softmax", {}, ModelConfig(d_model=16, num_heads=2), cfg, seed=0, device="cpu")
    finally:
        torch.nn.utils.clip_grad_norm_ = orig
    assert len(norms) == 5 and max(norms) <= 1e-3 * 1.01


def test_extra_callbacks_run_before_evaluation_each_step():
    """train(callbacks=...) adds Lightning callbacks; theirs run before mixzoo's evaluation hook,
    so a step's own work is bracketed by on_train_batch_start/end (the GPU sync check relies on it)."""
    import lightning.pytorch as pl
    seen = []

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(("start", trainer.global_step))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(("end", trainer.global_step))

    task = MQAR(V=16, L=16, kv=2)
    evals = []
    cfg = TrainConfig(steps=6, batch_size=8, eval_every=3, n_train=64, n_val=16, n_test=16)
    res = train(task, "softmax", {}, ModelConfig(d_model=16, num_heads=2), cfg, seed=0, device="cpu",
                callbacks=[Spy()], on_eval=lambda step, val: evals.append((step, len(seen))))
    assert res.state == "COMPLETE" and res.steps == 6
    assert seen == [(k, s) for i in range(6) for k, s in (("start", i), ("end", i + 1))]
    # each evaluation (steps 3 and 6) came after the spy's on_train_batch_end of that step
    assert evals == [(3, 6), (6, 12)]
