"""The Triton kernels behind ``mixzoo.kernels.swiglu`` (imported only when they are to run)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

#: a program's outputs and warps (a launch parameter, ``tile``, for benchmarks/norm_tiles.py; elementwise: the
#: numbers do not depend on it). Kept after that sweep (H100, 2026-12-05): about 3.0 TB/s, within 1 % of the best.
TILE = (1024, 4)


@triton.jit
def _fwd_kernel(h, o, N, F, BLOCK: tl.constexpr):
    """o[r, c] = silu(h[r, c]) * h[r, F + c] over the N = rows x F outputs."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    r, c = i // F, i % F
    a = tl.load(h + r * 2 * F + c, mask=m, other=0.).to(tl.float32)
    b = tl.load(h + r * 2 * F + F + c, mask=m, other=0.).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    tl.store(o + i, y.to(o.dtype.element_ty), mask=m)


@triton.jit
def _bwd_kernel(h, do, dh, N, F, BLOCK: tl.constexpr):
    """dh[r, c] = do b silu'(a), dh[r, F + c] = do silu(a), with a = h[r, c], b = h[r, F + c]."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    r, c = i // F, i % F
    a = tl.load(h + r * 2 * F + c, mask=m, other=0.).to(tl.float32)
    b = tl.load(h + r * 2 * F + F + c, mask=m, other=0.).to(tl.float32)
    g = tl.load(do + i, mask=m, other=0.).to(tl.float32)
    s = tl.sigmoid(a)
    da = g * b * s * (1. + a * (1. - s))
    db = g * a * s
    tl.store(dh + r * 2 * F + c, da.to(dh.dtype.element_ty), mask=m)
    tl.store(dh + r * 2 * F + F + c, db.to(dh.dtype.element_ty), mask=m)


def forward(h: torch.Tensor, tile: tuple[int, int] | None = None) -> torch.Tensor:
    """h contiguous (..., 2F) -> (..., F)."""
    block, warps = tile or TILE
    F = h.shape[-1] // 2
    o = torch.empty(*h.shape[:-1], F, dtype=h.dtype, device=h.device)
    N = o.numel()
    if N:
        _fwd_kernel[(triton.cdiv(N, block),)](h, o, N, F, BLOCK=block, num_warps=warps)
    return o


def backward(h: torch.Tensor, do: torch.Tensor, tile: tuple[int, int] | None = None) -> torch.Tensor:
    """h, do contiguous -> dh, h's shape and dtype."""
    block, warps = tile or TILE
    F = h.shape[-1] // 2
    dh = torch.empty_like(h)
    N = do.numel()
    if N:
        _bwd_kernel[(triton.cdiv(N, block),)](h, do, dh, N, F, BLOCK=block, num_warps=warps)
    return dh
