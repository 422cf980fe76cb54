"""MIXZOO_EMBED_GRAD=onehot (mixzoo.kernels.embedding): the token embedding's weight gradient as one float32 one-hot
product gives PyTorch's embedding backward's sums (in another order), alone, under vmap (stacked models), under
autocast and in a stacked training run; it stands aside where it would not be exact or small."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from mixzoo import kernels
from mixzoo.kernels.embedding import ONEHOT_MAX_VOCAB, embedding, grad_form


def _grads(fn, ids, w, g):
    w = w.detach().clone().requires_grad_()
    out = fn(ids, w)
    out.backward(g)
    return out.detach(), w.grad


def test_the_one_hot_gradient_is_the_embedding_backward_s_sums(monkeypatch):
    torch.manual_seed(0)
    V, D = 16, 32
    ids = torch.randint(0, V, (64, 50))                  # 3,200 tokens, each id about 200 times
    ids[0, :5] = 3                                       # an id repeated within a row
    ids[ids == 7] = 8                                    # and an id never used: its row's gradient is zero
    w, g = torch.randn(V, D), torch.randn(64, 50, D)
    out_ref, ref = _grads(F.embedding, ids, w, g)
    kernels.reset()
    out_def, dflt = _grads(embedding, ids, w, g)
    assert torch.equal(out_def, out_ref) and torch.equal(dflt, ref) and "embed-onehot" not in kernels.RAN
    monkeypatch.setenv("MIXZOO_EMBED_GRAD", "onehot")
    out, got = _grads(embedding, ids, w, g)
    assert "embed-onehot" in kernels.RAN
    assert torch.equal(out, out_ref)                     # the same gather forward
    assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    assert torch.equal(got[7], torch.zeros(D))
    with torch.autocast("cpu", dtype=torch.bfloat16):    # a step's backward inside autocast: float32 sums still
        out, got_amp = _grads(embedding, ids, w, g)
    assert out.dtype == got_amp.dtype == torch.float32 and torch.equal(got_amp, got)


def test_under_vmap_each_model_gets_its_own_gradient(monkeypatch):
    monkeypatch.setenv("MIXZOO_EMBED_GRAD", "onehot")
    torch.manual_seed(1)
    K, V, D = 3, 24, 8
    ids, w, g = torch.randint(0, V, (K, 6, 20)), torch.randn(K, V, D), torch.randn(K, 6, 20, D)
    out, got = _grads(vmap(embedding), ids, w, g)
    for k in range(K):
        o, ref = _grads(F.embedding, ids[k], w[k], g[k])
        assert torch.equal(out[k], o)
        assert float((got[k] - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_it_stands_aside_for_large_vocabularies_and_tf32(monkeypatch):
    assert grad_form(16) == "sort"                       # the default
    monkeypatch.setenv("MIXZOO_EMBED_GRAD", "onehot")
    assert grad_form(ONEHOT_MAX_VOCAB) == "onehot" and grad_form(ONEHOT_MAX_VOCAB + 1) == "sort"
    was = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")      # TF32 products would round dX
        assert grad_form(16) == "sort"
    finally:
        torch.set_float32_matmul_precision(was)
    monkeypatch.setenv("MIXZOO_EMBED_GRAD", "scatter")
    assert kernels.switch_error() == "MIXZOO_EMBED_GRAD='scatter'; allowed: sort, onehot (or unset)"


@pytest.mark.usefixtures("one_thread")
def test_a_stacked_run_with_the_one_hot_gradient_gives_the_same_numbers(monkeypatch):
    from mixzoo.models import ModelConfig
    from mixzoo.tasks.mqar import MQAR
    from mixzoo.train import TrainConfig
    from mixzoo.train.stacked import train_stacked
    task, mcfg = MQAR(V=32, L=16, kv=2), ModelConfig(d_model=16, num_heads=2)
    cfgs = [TrainConfig(lr=lr, steps=8, batch_size=4, eval_every=4, n_train=32, n_val=8, n_test=8, eval_batch_size=8)
            for lr in (3e-3, 1e-2)]
    plain = train_stacked(task, "softmax", {}, mcfg, cfgs, (0, 1), device="cpu")
    monkeypatch.setenv("MIXZOO_EMBED_GRAD", "onehot")
    onehot = train_stacked(task, "softmax", {}, mcfg, cfgs, (0, 1), device="cpu")
    for a, b in zip(plain, onehot):
        assert "embed-onehot" in (b.kernels or "") and "embed-onehot" not in (a.kernels or "")
        for x, y in zip(a.history, b.history):
            assert abs(x["train_loss"] - y["train_loss"]) <= 1e-5 * abs(x["train_loss"])
            assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(x["loss"])
