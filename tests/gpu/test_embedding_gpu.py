"""MIXZOO_EMBED_GRAD=onehot on the GPU: the K = 6 stacked embedding of MAD's shape (batch 128, vocabulary 16, width
128) at lengths 128 and 1024, its weight gradient against PyTorch's sort-based embedding backward (float32 sums in
another order: within 1e-5 of the largest entry) and both timed (forward and backward, a CUDA graph replayed)."""
from __future__ import annotations

import pytest
import torch
from layer_check import timed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("T", [128, 1024])
def test_one_hot_embedding_gradient_matches_and_is_timed(T, monkeypatch):
    import torch.nn.functional as F
    from torch.func import vmap

    from mixzoo.kernels.embedding import embedding
    monkeypatch.setenv("MIXZOO_EMBED_GRAD", "onehot")
    K, B, V, D = 6, 128, 16, 128
    g0 = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, V, (K, B, T), device="cuda", generator=g0)
    w = torch.randn(K, V, D, device="cuda", generator=g0).requires_grad_()
    dy = torch.randn(K, B, T, D, device="cuda", generator=g0)
    grads = {name: torch.autograd.grad(fn(ids, w), w, dy)[0]
             for name, fn in (("sort", vmap(F.embedding)), ("onehot", vmap(embedding)))}
    err = float((grads["onehot"] - grads["sort"]).abs().max() / grads["sort"].abs().max())
    ms = {}
    for name, fn in (("sort", vmap(F.embedding)), ("onehot", vmap(embedding))):
        ms[name] = timed(lambda fn=fn: torch.autograd.grad(fn(ids, w), w, dy))
    print(f"\nembedding K={K} B={B} T={T} V={V} D={D}: onehot vs sort gradient {err:.2e}; "
          f"forward+backward sort {ms['sort']:.3f} ms, onehot {ms['onehot']:.3f} ms ({ms['sort'] / ms['onehot']:.2f}x)")
    assert err <= 1e-5
