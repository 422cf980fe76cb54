"""Plain linear attention: o_i = Σ_{j<=i} (φ(q_i)·φ(k_j)) v_j, the unnormalized baseline.

The layer runs the chunked parallel form of ``_scan.simple_gla_chunk`` with no decay (plain
PyTorch on every device, matmul-bound on a GPU), then a per-head RMSNorm on the output in place
of the normalizing denominator, which keeps training stable without changing the state.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import register_mixer
from ._scan import simple_gla_chunk
from .common import RMSNorm, merge_heads, split_heads


def linear_core(q, k, v, *, scale: float = 1.0):
    """Causal linear attention on (..., T, D): o_i = scale Σ_{j<=i} (q_i·k_j) v_j = scale (Σ_j v_j k_jᵀ) q_i."""
    T = q.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return ((q @ k.transpose(-1, -2)).masked_fill(~mask, 0.0) @ v) * scale


_FEATURES = {"identity": lambda x: x, "elu": lambda x: F.elu(x) + 1.0, "relu": F.relu}


@register_mixer("linear", core=linear_core, core_grid={"scale": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0]},
                search_space={
                    "lr": ("log", 1e-4, 3e-2),
                    "weight_decay": ("cat", [0.0, 0.1]),
                    "feature_map": ("cat", ["identity", "elu"]),
                })
class LinearAttention(nn.Module):
    """Plain (unnormalized, decay-free) causal linear attention with an output RMSNorm."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0,
                 feature_map: str = "elu", chunk_size: int = 64, backend: str = "auto"):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        if feature_map not in _FEATURES:
            raise ValueError(f"feature_map={feature_map!r}; allowed: {', '.join(_FEATURES)}")
        if backend not in ("auto", "torch"):
            raise ValueError(f"backend={backend!r}; allowed: auto, torch")
        self.h, self.phi, self.chunk = num_heads, _FEATURES[feature_map], chunk_size
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.norm = RMSNorm(d_model // num_heads)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.backend = "torch-chunk"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.h) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = self.phi(q), self.phi(k)
        g = q.new_zeros(q.shape[:3], dtype=torch.float32)
        o = simple_gla_chunk(q, k, v, g, scale=q.shape[-1] ** -0.5, chunk=self.chunk)
        return self.out(merge_heads(self.norm(o).to(x.dtype)))

    def state_size(self, seq_len: int) -> int:
        dh = self.qkv.in_features // self.h
        return self.h * dh * dh
