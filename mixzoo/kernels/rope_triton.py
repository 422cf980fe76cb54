"""The Triton kernel behind ``mixzoo.kernels.rope`` (imported only when it is to run)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(x, y, inv_freq, H, T, sb, sh, st, HALF, sign, BT: tl.constexpr, BH: tl.constexpr):
    """Rows of x (B, H, T, 2·HALF) at strides (sb, sh, st, 1) -> y contiguous: pairs (i, i + HALF)
    rotated by the angle t·inv_freq[i] (sign -1: the inverse rotation, the backward)."""
    bh, tb = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    t = tb * BT + tl.arange(0, BT)
    i = tl.arange(0, BH)
    m = (t < T)[:, None] & (i < HALF)[None, :]
    src = x + b.to(tl.int64) * sb + h.to(tl.int64) * sh + t.to(tl.int64)[:, None] * st + i[None, :]
    x1 = tl.load(src, mask=m, other=0.).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m, other=0.).to(tl.float32)
    inv = tl.load(inv_freq + i, mask=i < HALF, other=0.)
    ang = t.to(tl.float32)[:, None] * inv[None, :]
    c, s = tl.cos(ang), tl.sin(ang) * sign
    dst = y + (bh.to(tl.int64) * T + t.to(tl.int64))[:, None] * (2 * HALF) + i[None, :]
    tl.store(dst, (x1 * c - x2 * s).to(y.dtype.element_ty), mask=m)
    tl.store(dst + HALF, (x1 * s + x2 * c).to(y.dtype.element_ty), mask=m)


_INV: dict[tuple, torch.Tensor] = {}


def inv_freq(half: int, base: float, device: torch.device) -> torch.Tensor:
    """base^(-i/half) in float32 as the PyTorch form computes it (so the angles t·inv are its angles);
    made once per (half, base, device)."""
    key = (half, float(base), str(device))
    if key not in _INV:
        _INV[key] = base ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    return _INV[key]


def rotate(x: torch.Tensor, base: float, inverse: bool = False) -> torch.Tensor:
    """x (B, H, T, D), D even and its last stride 1 -> the rotated x, contiguous."""
    B, H, T, D = x.shape
    half = D // 2
    inv = inv_freq(half, base, x.device)
    y = torch.empty(B, H, T, D, dtype=x.dtype, device=x.device)
    BH = triton.next_power_of_2(half)
    BT = max(1, min(triton.next_power_of_2(T), 2048 // BH))
    if B * H and T:
        _rope_kernel[(B * H, triton.cdiv(T, BT))](x, y, inv, H, T, x.stride(0), x.stride(1), x.stride(2), half,
                                                 -1.0 if inverse else 1.0, BT=BT, BH=BH)
    return y
