"""The vocabulary head applied only at supervised positions (training) gives the same loss and
gradients as the full head, and the same training run up to float rounding."""
import torch

from mixzoo.models import ModelConfig, build_model
from mixzoo.tasks.base import Batch
from mixzoo.tasks.mqar import MQAR
from mixzoo.train import TrainConfig, train
from mixzoo.train.loop import loss_fn, supervised_positions


def test_supervised_positions_cover_every_target():
    mask = torch.tensor([[0, 1, 0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], [0] * 8], dtype=torch.bool)
    idx = supervised_positions(mask)
    assert idx.shape == (3, 2)
    assert idx[0].tolist() == [1, 3] and idx[1, 0].item() == 0 and not mask[1, idx[1, 1]]
    assert supervised_positions(torch.ones(2, 8, dtype=torch.bool)) is None      # dense: no gain


def test_sparse_head_loss_and_grads_equal_full_head():
    task = MQAR(V=64, L=32, kv=4)
    b = task.generate("train", 16, 0, "cpu")
    torch.manual_seed(0)
    model = build_model("lm", "softmax", {}, ModelConfig(d_model=32, n_layers=2, num_heads=2), vocab=task.vocab_size)
    grads = []
    for sparse in (False, True):
        model.zero_grad()
        if sparse:
            idx = supervised_positions(b.mask)
            assert idx.shape[1] < b.mask.shape[1] // 2
            out = model(b.inputs, select=idx)
            bb = Batch(b.inputs, b.targets.gather(1, idx), b.mask.gather(1, idx))
        else:
            out, bb = model(b.inputs), b
        loss, _ = loss_fn(task.kind, out, bb)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-6, atol=1e-6)
    for g0, g1 in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(g0, g1, rtol=1e-5, atol=1e-6)


def test_training_with_and_without_sparse_head_agree():
    task = MQAR(V=32, L=32, kv=4)
    res = []
    for sparse in (False, True):
        cfg = TrainConfig(steps=30, batch_size=16, lr=3e-3, eval_every=15, n_train=256, n_val=64, n_test=64,
                          sparse_head=sparse)
        res.append(train(task, "softmax", {}, ModelConfig(d_model=32, n_layers=2, num_heads=2), cfg, seed=0,
                         device="cpu"))
    h0, h1 = res[0].history, res[1].history
    assert [h["step"] for h in h0] == [h["step"] for h in h1]
    for a, b in zip(h0, h1):
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-4 * max(1.0, abs(a["train_loss"]))
    assert abs(res[0].test["accuracy"] - res[1].test["accuracy"]) <= 1.0 / 64 / 4 + 1e-9
