"""Softmax attention: causal multi-head SDPA with rotary positions."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import register_mixer
from .common import merge_heads, rope, split_heads

# SDPA's kernels on a GPU: "auto" lets PyTorch pick (cuDNN first on Hopper), the others pin one (an
# error where it cannot run the shape); off the GPU every value runs PyTorch's own choice
ATTN_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")


def _backend(name: str):
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
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
                 rope: bool = True, dropout: float = 0.0, attn_backend: str = "auto"):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        if attn_backend not in ATTN_BACKENDS:
            raise ValueError(f"attn_backend={attn_backend!r}; allowed: {', '.join(ATTN_BACKENDS)}")
        self.h, self.use_rope, self.dropout = num_heads, rope, dropout
        self.attn_backend = attn_backend
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.backend = "sdpa" if attn_backend == "auto" else f"sdpa-{attn_backend}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.h) for t in self.qkv(x).chunk(3, dim=-1))
        if self.use_rope:
            q, k = rope(q), rope(k)
        with _backend(self.attn_backend if x.is_cuda else "auto"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        return self.out(merge_heads(o))

    def state_size(self, seq_len: int) -> int:
        d = self.qkv.in_features
        return 2 * d * seq_len
