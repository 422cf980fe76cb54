"""Pieces mechanisms share: head splitting, rotary embeddings, short convolutions, norms."""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import causal_conv as _conv
from ..kernels import embedding as _embedding
from ..kernels import parallax_prologue as _prologue
from ..kernels import rmsnorm as _rmsnorm
from ..kernels import rope as _rope
from . import _fla


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   gate: torch.Tensor | None = None) -> torch.Tensor | None:
    """x (times silu(gate) with a gate) normalized over its last dimension times ``weight``, in float32,
    by mixzoo's Triton kernels (``mixzoo.kernels.rmsnorm``: one weight row per stacked model), or None
    where they do not run (the caller keeps its own PyTorch form, so its numbers off the GPU are unchanged)."""
    if not _rmsnorm.runs_on(x) or (gate is not None and not _rmsnorm.runs_on(gate)):
        return None
    op = _fla._op("mixzoo.kernels.rmsnorm", "rms_norm")                   # folded when stacking
    return op(x, weight, eps) if gate is None else op(x, weight, eps, gate)


def fused_rms_norm_gate(x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor) -> torch.Tensor | None:
    """x (..., H, D) normalized over D times ``weight``, times silu(gate) (gate (..., H, D), any strides with the last
    1), in gate's dtype, by one Triton kernel each way (``mixzoo.kernels.rmsnorm.rms_norm_gate``), or None where it
    does not run (the caller keeps its PyTorch form)."""
    if not _rmsnorm.gate_runs_on(x, gate):
        return None
    return _fla._op("mixzoo.kernels.rmsnorm", "rms_norm_gate")(x, weight, eps, gate)   # folded when stacking


def fused_add_rms_norm(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float,
                       out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(s = x + r, the norm of s times ``weight`` in out_dtype, default float32) by mixzoo's Triton kernels
    (``mixzoo.kernels.rmsnorm.add_rms_norm``: one pass each way, one weight row per stacked model), or None where
    they do not run, or where ``MIXZOO_FUSE_ADD=0`` (the add and the norm's kernel separately, to time one against
    the other)."""
    if os.environ.get("MIXZOO_FUSE_ADD") == "0" or not _rmsnorm.runs_on(x) or not _rmsnorm.runs_on(r):
        return None
    return _fla._op("mixzoo.kernels.rmsnorm", "add_rms_norm")(x, r, weight, eps, out_dtype)   # folded when stacking


def split_heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, T, H*D) -> (B, H, T, D)."""
    B, T, _ = x.shape
    return x.view(B, T, h, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B, T, H*D)."""
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def qkv_heads(qkv: torch.Tensor, h: int, use_rope: bool,
              prologue: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A projection's qkv (B, T, 3C) -> q, k, v (B, H, T, D), q and k rotated with ``use_rope``. With the prologue
    (``MIXZOO_QKV_PROLOGUE=fused``; unset, the mechanism's ``prologue``, else ``kernels.QKV_PROLOGUE[0]``) where the
    rotation runs on the GPU: by one Triton kernel each way (``mixzoo.kernels.parallax_prologue.qkv_prologue``, folded
    when stacking) in place of two rotation kernels and, backward, the concatenation of the chunks' gradients; q, k, v
    are then views of contiguous (B, T, H, D), the layout in which mixzoo's attention and LLA kernels write their
    gradients, so those reach the kernel as they are. Else the chunks' views, rotated by ``rope`` (the same numbers up
    to float32 reordering)."""
    if _prologue.qkv_runs_on(qkv, h, use_rope, default=prologue):
        q, k, v = _fla._op("mixzoo.kernels.parallax_prologue", "qkv_prologue")(qkv, h, prologue)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k, v = (split_heads(t, h) for t in qkv.chunk(3, dim=-1))
    if use_rope:
        q, k = rope(q), rope(k)
    return q, k, v


def rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding on (B, H, T, D), rotating pairs (i, i + D/2). On a GPU mixzoo's
    Triton kernel (``mixzoo.kernels.rope``: float32, one output written); else this form, in x's dtype."""
    if _rope.runs_on(x):
        return _fla._op("mixzoo.kernels.rope", "rope")(x, base)          # folded when stacking
    D, T = x.shape[-1], x.shape[-2]
    half = D // 2
    if half == 0:
        return x
    inv = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([out, x[..., 2 * half:]], dim=-1) if D % 2 else out


class ShortConv(nn.Module):
    """Causal depthwise convolution over time, (B, T, C) -> (B, T, C)."""

    def __init__(self, channels: int, kernel_size: int = 4):
        super().__init__()
        self.k = kernel_size
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels,
                              padding=kernel_size - 1)

    def forward(self, x: torch.Tensor, silu: bool = False) -> torch.Tensor:
        """The convolution (then SiLU with ``silu``): mixzoo's Triton kernels on a GPU
        (``mixzoo.kernels.causal_conv``), else ``F.conv1d``."""
        T = x.shape[1]
        w, b = self.conv.weight, self.conv.bias
        if _conv.runs_on(x):
            return _fla._op("mixzoo.kernels.causal_conv", "causal_conv")(x, w.squeeze(1), b, silu)   # folded when stacking
        # autocast's casts of conv1d's operands do not reach the call under vmap (stacked training
        # runs K models as one: on CPU the conv then runs in float32, on CUDA it fails on a bf16
        # input with a float32 bias), so they are made here, as autocast makes them
        if torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)
            x, w, b = x.to(dt), w.to(dt), b.to(dt)
        y = F.conv1d(x.transpose(1, 2), w, b, padding=self.k - 1, groups=self.conv.groups)[..., :T].transpose(1, 2)
        return F.silu(y) if silu else y


class Embedding(nn.Embedding):
    """The token embedding: ``nn.Embedding``'s weight and forward; its weight's gradient by PyTorch's embedding backward
    or, with ``MIXZOO_EMBED_GRAD=onehot``, one float32 one-hot product (``mixzoo.kernels.embedding``)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _embedding.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d)) if affine else None

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None):
        """The norm of x, or of x silu(gate) (float32) with a gate (Mamba-2's gated norm). With ``residual`` r:
        (s = x + r, the norm of s), in one kernel each way where mixzoo's kernels run (``fused_add_rms_norm``);
        ``out_dtype`` then casts the norm (exactly what a consumer that casts it would see)."""
        if residual is not None:
            if gate is None and self.weight is not None and (
                    sy := fused_add_rms_norm(x, residual, self.weight, self.eps, out_dtype)) is not None:
                return sy
            s = x + residual
            y = self.forward(s, gate)          # not self(...): the module's hooks see this call once
            return s, (y if out_dtype is None else y.to(out_dtype))
        if self.weight is not None and (y := fused_rms_norm(x, self.weight, self.eps, gate)) is not None:
            return y
        if gate is not None:
            x = _rmsnorm.gated(x, gate)
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return y * self.weight if self.weight is not None else y
