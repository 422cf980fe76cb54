"""Small parts the recurrent mechanisms share (helpers, not a registration module)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .common import ShortConv, fused_rms_norm, fused_rms_norm_gate


class ConvAct(nn.Module):
    """Causal depthwise short convolution followed by SiLU, (B, T, C) -> (B, T, C)."""

    def __init__(self, channels: int, kernel_size: int = 4):
        super().__init__()
        self.conv = ShortConv(channels, kernel_size)

    def forward(self, x):
        return self.conv(x, silu=True)


class GatedNorm(nn.Module):
    """Per-head RMSNorm of (B, H, T, Dh) outputs, times SiLU(gate) with gate (B, T, H*Dh);
    returns (B, T, H*Dh)."""

    def __init__(self, head_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, o, gate):
        B, H, T, D = o.shape
        # the norm and the gate in one kernel each way on a GPU (the gate read where it lies; MIXZOO_GATED_NORM=torch: not)
        y = fused_rms_norm_gate(o.transpose(1, 2), self.weight, self.eps, gate.view(B, T, H, D))
        if y is not None:
            return y.reshape(B, T, H * D)
        y = fused_rms_norm(o.transpose(1, 2), self.weight, self.eps)
        if y is None:
            y = F.rms_norm(o.float().transpose(1, 2), (D,), self.weight, self.eps)
        o = y.reshape(B, T, H * D)
        return (o * F.silu(gate)).to(gate.dtype)


def dt_bias_init(n: int, dt_min: float = 1e-3, dt_max: float = 0.1) -> torch.Tensor:
    """A bias b with softplus(b) log-uniform in [dt_min, dt_max] (the usual SSM step init)."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return dt + torch.log(-torch.expm1(-dt))


def l2norm(x, eps: float = 1e-6):
    return F.normalize(x, dim=-1, eps=eps)
