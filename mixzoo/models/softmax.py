"""Softmax attention: causal multi-head attention with rotary positions.

The attention is PyTorch's SDPA, or, for heads of at most 16 dims in half precision on a GPU, mixzoo's
Triton kernels (``mixzoo.kernels.attn``: SDPA's kernels pad such heads to 32 or 64), where ``attn.runs_on``
says so (the switch ``MIXZOO_ATTN``). The backend a run records names the one used: ``sdpa`` or
``triton-attn``. q, k, v come from the projection by ``common.qkv_heads`` (on a GPU one Triton kernel each way for the
split and the rotation, ``MIXZOO_QKV_PROLOGUE``)."""
from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..errors import UsageError
from ..kernels import attn as _attn
from ..registry import register_mixer
from . import _fla
from .common import merge_heads, qkv_heads


# SDPA's kernel on a GPU: PyTorch's choice (cuDNN first on Hopper) unless MIXZOO_SDPA names one of
# kernels.SDPA_BACKENDS (an error where that one cannot run the shape). How a step executes, not what it
# computes, so an environment switch like the kernels' rather than a constructor knob (knobs are part of a
# run's hash); a pinned kernel is recorded with the kernels that ran (the leaderboard's `kernels` column).
def _sdpa_backend(x: torch.Tensor):
    name = os.environ.get("MIXZOO_SDPA", "")
    if not name or not x.is_cuda:
        return contextlib.nullcontext()
    if name not in kernels.SDPA_BACKENDS:
        raise UsageError(kernels.switch_error())
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kernels.RAN.add(f"sdpa-{name}")
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name])


def softmax_core(q, k, v, *, scale=None):
    """Causal softmax attention (Nadaraya-Watson): (..., T, D) -> (..., T, Dv)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


@register_mixer("softmax", core=softmax_core, core_grid={"scale": [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]}, search_space={
    "lr": ("log", 1e-4, 3e-2),
    "weight_decay": ("cat", [0.0, 0.1]),
})
class SoftmaxAttention(nn.Module):
    """Causal multi-head softmax attention (SDPA), rotary positions on q and k."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0,
                 rope: bool = True, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        self.h, self.use_rope, self.dropout = num_heads, rope, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.backend = "sdpa"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv_heads(self.qkv(x), self.h, self.use_rope)
        dropout = self.dropout if self.training else 0.0
        if _attn.runs_on(q, dropout):
            self.backend = "triton-attn"
            o = _fla._op("mixzoo.kernels.attn", "attention")(q, k, v)     # folded when stacking
        else:
            self.backend = "sdpa"
            with _sdpa_backend(x):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        return self.out(merge_heads(o))

    def state_size(self, seq_len: int) -> int:
        d = self.qkv.in_features
        return 2 * d * seq_len
