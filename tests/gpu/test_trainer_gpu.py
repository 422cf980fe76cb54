"""The trainer on a GPU: between evaluations its steps never make the host wait for the device.

A sync per step costs a launch-bound model the device's whole queue of work every step; this is
checked with CUDA's sync debugging around each training step (data indexing, forward, loss,
backward, clipping, optimizer step), after two warm-up steps (autotuning, lazy set-up)."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def sync_recorder(after: int):
    """A Lightning callback recording every host sync asked for inside training steps >= ``after``
    (its ``where``: "step N: file:line: message")."""
    import lightning.pytorch as pl

    from mixzoo.check import recording_host_syncs

    class Recorder(pl.Callback):
        def __init__(self):
            self.where: list[str] = []
            self._ctx = None

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step >= after:
                self._ctx = recording_host_syncs()
                self._step, self._seen = trainer.global_step, self._ctx.__enter__()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if self._ctx is not None:
                self._ctx.__exit__(None, None, None)
                self._ctx = None
                self.where += [f"step {self._step}: {w}" for w in self._seen]
    return Recorder()


def _run(mixer, sparse_head, callbacks):
    from mixzoo.models import ModelConfig
    from mixzoo.tasks.mqar import MQAR
    from mixzoo.train import TrainConfig, train
    cfg = TrainConfig(steps=8, batch_size=16, eval_every=8, eval_batch_size=16, sparse_head=sparse_head,
                      n_train=256, n_val=16, n_test=16)
    return train(MQAR(V=256, L=64, kv=8), mixer, {}, ModelConfig(d_model=64, num_heads=2, n_layers=2), cfg,
                 seed=0, device="cuda", callbacks=callbacks)


def test_recorder_sees_a_sync_inside_a_step():
    """Control: a callback that reads a device value inside the step is caught, once a step."""
    import lightning.pytorch as pl

    class Reader(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            float(torch.ones((), device="cuda"))
    rec = sync_recorder(after=2)
    _run("softmax", True, [rec, Reader()])
    assert len(rec.where) == 6, rec.where


@pytest.mark.parametrize("mixer", ["softmax", "lla", "gdn", "mamba", "gla"])
@pytest.mark.parametrize("sparse_head", [True, False])
def test_training_steps_have_no_host_syncs(mixer, sparse_head):
    rec = sync_recorder(after=2)
    res = _run(mixer, sparse_head, [rec])
    assert res.state == "COMPLETE", res.reason
    assert res.steps == 8
    assert not rec.where, f"{mixer} ({res.backend}): {len(rec.where)} host syncs, e.g. {rec.where[:3]}"
