"""The Triton kernel behind ``mixzoo.kernels.rope`` (imported only when it is to run)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(x, y, cs, H, T, sb, sh, st, sign, D: tl.constexpr, HALF: tl.constexpr, BT: tl.constexpr,
                 BJ: tl.constexpr):
    """x (B, H, T, D) at strides (sb, sh, st, 1) -> y (B, H, T, D) contiguous, pairs (i, i + HALF) rotated by
    the angle whose cosine and sine are cs[t, i] (sign -1: the inverse rotation, the backward). A program
    takes BT positions of one sequence and BJ of the H·D elements of a position (all heads at once: a row of
    a projection's output is read along its length)."""
    b, tb, jb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = tb * BT + tl.arange(0, BT)
    j = jb * BJ + tl.arange(0, BJ)
    h, d = j // D, j % D
    first = d < HALF
    i = tl.where(first, d, d - HALF)                   # the pair's index
    pd = tl.where(first, d + HALF, d - HALF)           # the other element of the pair
    m = (t < T)[:, None] & (j < H * D)[None, :]
    row = x + b.to(tl.int64) * sb + t.to(tl.int64)[:, None] * st + (h.to(tl.int64) * sh)[None, :]
    xv = tl.load(row + d[None, :], mask=m, other=0.).to(tl.float32)
    xp = tl.load(row + pd[None, :], mask=m, other=0.).to(tl.float32)
    at = cs + (t[:, None] * HALF + i[None, :]) * 2
    c = tl.load(at, mask=m, other=0.)
    s = tl.load(at + 1, mask=m, other=0.) * sign
    # first half: x_i c - x_{i+HALF} s; second half: x_{i+HALF} c + x_i s
    out = xv * c + tl.where(first, -xp, xp) * s
    dst = y + ((b * H + h).to(tl.int64)[None, :] * T + t.to(tl.int64)[:, None]) * D + d[None, :]
    tl.store(dst, out.to(y.dtype.element_ty), mask=m)


_INV: dict[tuple, torch.Tensor] = {}
_CS: dict[tuple, torch.Tensor] = {}


def inv_freq(half: int, base: float, device: torch.device) -> torch.Tensor:
    """base^(-i/half) in float32 as the PyTorch form computes it (so the angles t·inv are its angles);
    made once per (half, base, device)."""
    key = (half, float(base), str(device))
    if key not in _INV:
        _INV[key] = base ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    return _INV[key]


def cos_sin(T: int, half: int, base: float, device: torch.device) -> torch.Tensor:
    """(T, half, 2) float32: cos and sin of the angles t·inv_freq, by torch as ``rope_torch`` computes them (so
    the kernel's rotation is the PyTorch form's); made once per (T, half, base, device), outside a CUDA graph's
    capture (a table made inside one lives in the graph's memory and is not kept)."""
    key = (T, half, float(base), str(device))
    if key in _CS:
        return _CS[key]
    ang = torch.arange(T, device=device, dtype=torch.float32)[:, None] * inv_freq(half, base, device)[None, :]
    cs = torch.stack([ang.cos(), ang.sin()], dim=-1).contiguous()
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _CS[key] = cs
    return cs


def rotate(x: torch.Tensor, base: float, inverse: bool = False) -> torch.Tensor:
    """x (B, H, T, D), D even and its last stride 1 -> the rotated x, contiguous."""
    B, H, T, D = x.shape
    y = torch.empty(B, H, T, D, dtype=x.dtype, device=x.device)
    if not (B * H and T):
        return y
    cs = cos_sin(T, D // 2, base, x.device)
    BJ = min(triton.next_power_of_2(H * D), 1024)
    BT = max(1, min(triton.next_power_of_2(T), 4096 // BJ))
    _rope_kernel[(B, triton.cdiv(T, BT), triton.cdiv(H * D, BJ))](
        x, y, cs, H, T, x.stride(0), x.stride(1), x.stride(2), -1.0 if inverse else 1.0,
        D=D, HALF=D // 2, BT=BT, BJ=BJ)
    return y
