"""Gated Linear Attention (Yang et al., 2024): linear attention with a data-dependent decay per
key dimension, S_t = S_{t-1} diag(a_t) + v_t k_tᵀ, o_t = S_t q_t / √d_k, a_t = exp(logσ(W x)/τ)
from a low-rank projection (τ = 16), with a gated RMSNorm on the output. Keys are half as wide
as values (expand_k = 0.5) as in the paper.

Paths: ``triton-rec`` (heads of at most 16, on a GPU: mixzoo's recurrent Triton scan,
``mixzoo.kernels.recurrent``, one position at a time with each head's state in registers; ``MIXZOO_GLA_CORE=fla``
for fla's chunk kernels instead), ``fla-chunk`` (fla's Triton ``chunk_gla``, on a GPU) and ``torch-recurrent`` (fla's
plain-PyTorch recurrence, loaded by file path; the CPU path). ``fla-chunk+triton-dv``: fla's, with the
value gradient of its backward by mixzoo's kernel (``mixzoo.kernels.gla_steps``: tiles as narrow as the
heads, fla's precision) where it has matched its reference on the device; ``MIXZOO_GLA_DV=fla`` leaves it
to fla. The state's parts of dq, dk, dg and the forward's output are mixzoo's likewise by default
(``+triton-dv-dqkg-o``); ``MIXZOO_GLA_DQKG=fla`` and ``MIXZOO_GLA_O=fla`` leave them to fla.

The five projections of the input (q, k, v, the output gate, the decay's low-rank first factor) run as one matmul
over their weights concatenated: the input is read once, and its gradient is one matmul instead of five matmuls
and four sums. The parameters stay five separate matrices, so initialization, Muon's per-matrix update and
checkpoints are those of five projections (``MIXZOO_GLA_PROJ=separate`` runs the five matmuls, for timing).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import recurrent
from ..registry import register_mixer
from . import _fla
from ._parts import GatedNorm


@register_mixer("gla", search_space={
    "lr": ("log", 1e-4, 3e-2),
    "weight_decay": ("cat", [0.0, 0.1]),
    "expand_k": ("cat", [0.5, 1.0]),
})
class GatedLinearAttention(nn.Module):
    """Gated Linear Attention: linear attention with a per-key-dimension data-dependent forget gate."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0,
                 expand_k: float = 0.5, gate_rank: int = 16, gate_norm: float = 16.0,
                 backend: str = "auto"):
        super().__init__()
        dk = int(d_model * expand_k)
        if d_model % num_heads or dk % num_heads:
            raise ValueError(f"d_model={d_model} (keys {dk}) not divisible by num_heads={num_heads}")
        if backend not in ("auto", "torch", "fla"):
            raise ValueError(f"backend={backend!r}; allowed: auto, torch, fla")
        self.h, self.dk, self.tau, self.requested = num_heads, dk // num_heads, gate_norm, backend
        self.q_proj = nn.Linear(d_model, dk, bias=False)
        self.k_proj = nn.Linear(d_model, dk, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.g_proj = nn.Linear(d_model, d_model, bias=False)
        self.gk = nn.Sequential(nn.Linear(d_model, gate_rank, bias=False), nn.Linear(gate_rank, dk, bias=True))
        self.o_norm = GatedNorm(d_model // num_heads)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.backend = "torch-recurrent"

    def _fast(self, x):
        if not x.is_cuda or self.requested == "torch":
            return None
        fn = _fla.triton_op("fla.ops.gla", "chunk_gla")
        if fn is None and self.requested == "fla":
            raise RuntimeError("gla: backend='fla' asked for but fla's Triton kernel is unavailable")
        return fn

    def _in_proj(self, x):
        """q, k, v, the output gate and the decay's low-rank input, (B, T, width) each (module docstring)."""
        mods = (self.q_proj, self.k_proj, self.v_proj, self.g_proj, self.gk[0])
        if os.environ.get("MIXZOO_GLA_PROJ") == "separate":
            return tuple(m(x) for m in mods)
        w = torch.cat([m.weight for m in mods])
        return F.linear(x, w).split([m.out_features for m in mods], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        bthd = lambda t: t.view(B, T, self.h, -1)
        q, k, v, gate, low = self._in_proj(x)
        q, k, v = bthd(q), bthd(k), bthd(v)
        gk = bthd(F.logsigmoid(self.gk[1](low).float()) / self.tau)
        if self.requested == "auto" and recurrent.wanted(x, q.shape[-1], v.shape[-1], "MIXZOO_GLA_CORE"):
            self.backend = "triton-rec"
            o = _fla._op("mixzoo.kernels.recurrent", "gla_rec")(q, k, v, gk, self.dk ** -0.5)     # folded when stacking
            return self.o_proj(self.o_norm(o.transpose(1, 2), gate))
        fast = self._fast(x)
        if fast is not None:
            D = v.shape[-1]
            qp, kp, vp, gp = _fla.pad_heads(q, k, v, gk.to(q.dtype), width=_fla.fla_pad_width())
            self.backend = ("fla-chunk" + _fla.gla_suffix(kp.shape[-1], vp.shape[-1], x.device)
                            + _fla.unpadded_suffix(min(q.shape[-1], D)))
            o = fast(qp, kp, vp, g=gp, scale=self.dk ** -0.5)[0][..., :D]
        else:
            self.backend = "torch-recurrent"
            ref = _fla.naive("gla", "naive_recurrent_gla")
            if ref is None:
                raise RuntimeError("gla: the reference needs flash-linear-attention installed")
            o, _ = ref(q, k, v, gk)
        return self.o_proj(self.o_norm(o.transpose(1, 2), gate))

    def state_size(self, seq_len: int) -> int:
        return self.h * self.dk * (self.o_proj.in_features // self.h)

