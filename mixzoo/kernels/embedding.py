"""The token embedding with its weight's gradient as a one-hot product (``MIXZOO_EMBED_GRAD=onehot``) in place of
PyTorch's embedding backward (``sort``, the default).

On a GPU, ``embedding_dense_backward`` sorts the token ids and then sums each id's gradient rows: 431 µs of a stacked
K = 6 step at MAD's length 1024 on an H100 (786k tokens, a vocabulary of 16; benchmarks/calls-2026-12-07,
profile-mad1024), 141 µs of one model's. For a small vocabulary the same sums are one float32 product,
dW = onehot(ids)ᵀ · dX ((V, N) times (N, D)): it reads dX once and sorts nothing. The forward is the same gather
(``F.embedding``). The gradient is the same sums in another order (float32 products, so only where float32 matmuls
are full float32: ``torch.get_float32_matmul_precision() == "highest"``, PyTorch's default; with TF32 allowed the
product would round dX). Up to ``ONEHOT_MAX_VOCAB`` ids: the one-hot matrix is N x V floats (50 MB for the 786k
tokens above). Under ``torch.func.vmap`` (stacked training) PyTorch derives the batched rule from the ops
(``generate_vmap_rule``): the K models' products are one batched matmul.

Not yet timed on a GPU: off until it is. Imports nothing of mixzoo beyond ``mixzoo.kernels`` (its switch, ``RAN``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# the largest vocabulary the one-hot product takes (MAD's settings: 16 to 144, memorization 256 to 8192)
ONEHOT_MAX_VOCAB = 256


def grad_form(vocab: int) -> str:
    """``onehot`` or ``sort``: how the weight's gradient of an embedding of ``vocab`` ids is formed here."""
    from . import chosen
    want = chosen("MIXZOO_EMBED_GRAD")
    if want == "onehot" and vocab <= ONEHOT_MAX_VOCAB and torch.get_float32_matmul_precision() == "highest":
        return "onehot"
    return "sort"


class _OneHotGrad(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(ids, weight):
        return F.embedding(ids, weight)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ids, weight = inputs
        ctx.save_for_backward(ids)
        ctx.vocab = weight.shape[0]

    @staticmethod
    def backward(ctx, g):
        ids, = ctx.saved_tensors
        rows = ids.reshape(-1)
        onehot = (rows[:, None] == torch.arange(ctx.vocab, device=rows.device)).to(g.dtype)       # (N, V)
        with torch.autocast(g.device.type, enabled=False):         # float32 sums, whatever the step's autocast
            dw = onehot.mT @ g.reshape(rows.shape[0], -1)
        return None, dw


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.embedding(ids, weight)``, its weight gradient formed as ``grad_form`` says."""
    if weight.dtype == torch.float32 and weight.requires_grad and grad_form(weight.shape[0]) == "onehot":
        from . import RAN
        RAN.add("embed-onehot")
        return _OneHotGrad.apply(ids, weight)
    return F.embedding(ids, weight)
