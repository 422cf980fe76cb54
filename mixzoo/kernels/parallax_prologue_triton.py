"""The Triton kernels behind ``mixzoo.kernels.parallax_prologue`` (imported only when they are to run).

Layout: the projections' rows, qkv (G, R, 3C) and rr (G, R, C) contiguous (G groups of R = B·T tokens, one
norm weight row per group, w (G, D)); outputs q, k, v, r (G, R, C) contiguous, i.e. (B, T, H, D) as fla's Parallax
kernels take them. A program takes BT tokens of one group and all their heads, each head's row of D as two halves
(i < D/2 and i >= D/2: the pairs the rotation mixes), so loads and stores are whole rows of C. The rotation's
formulas are ``rope_triton``'s (angle t·inv_freq[i], cos and sin in float32), the norm's ``rmsnorm_triton``'s; the
norm's row sum adds the two halves' sums. Backward: the inverse rotation, the norm's backward, and per program the
partial sums of dy x̂ over its tokens and heads for the weight (summed per group by the caller). Without rr
(``HAS_R`` off: softmax attention's and LLA's q, k, v, ``parallax_prologue.qkv_prologue``) the kernels move q, k and
v alone and touch nothing of rr, r, the norm or its weight."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _angles(rows, R, T, inv_freq, HALF: tl.constexpr):
    t = (rows % T).to(tl.float32)
    inv = tl.load(inv_freq + tl.arange(0, HALF))
    ang = t[:, None, None] * inv[None, None, :]                    # (BT, 1, HALF)
    return tl.cos(ang), tl.sin(ang)


@triton.jit
def _fwd_kernel(qkv, rr, w, inv_freq, q, k, v, r, rstd, R, T, H, C, eps,
                BT: tl.constexpr, BH: tl.constexpr, HALF: tl.constexpr,
                ROPE_QK: tl.constexpr, NORM_R: tl.constexpr, ROPE_R: tl.constexpr, HAS_R: tl.constexpr):
    g, tb = tl.program_id(0), tl.program_id(1)
    rows = tb * BT + tl.arange(0, BT)
    heads = tl.arange(0, BH)
    i = tl.arange(0, HALF)
    m = (rows < R)[:, None, None] & (heads < H)[None, :, None]
    grow = (g * R + rows).to(tl.int64)[:, None, None]
    lo = heads[None, :, None] * (2 * HALF) + i[None, None, :]        # the first half's columns in a row of C
    c, s = _angles(rows, R, T, inv_freq, HALF)
    src = qkv + grow * (3 * C) + lo
    dst = grow * C + lo
    for part in tl.static_range(2):                                 # q, k
        x1 = tl.load(src + part * C, mask=m, other=0.).to(tl.float32)
        x2 = tl.load(src + part * C + HALF, mask=m, other=0.).to(tl.float32)
        out = q if part == 0 else k
        if ROPE_QK:
            tl.store(out + dst, (x1 * c - x2 * s).to(out.dtype.element_ty), mask=m)
            tl.store(out + dst + HALF, (x1 * s + x2 * c).to(out.dtype.element_ty), mask=m)
        else:
            tl.store(out + dst, x1.to(out.dtype.element_ty), mask=m)
            tl.store(out + dst + HALF, x2.to(out.dtype.element_ty), mask=m)
    tl.store(v + dst, tl.load(src + 2 * C, mask=m, other=0.), mask=m)
    tl.store(v + dst + HALF, tl.load(src + 2 * C + HALF, mask=m, other=0.), mask=m)
    if HAS_R:
        x1 = tl.load(rr + dst, mask=m, other=0.).to(tl.float32)
        x2 = tl.load(rr + dst + HALF, mask=m, other=0.).to(tl.float32)
        if NORM_R:
            rs = 1. / tl.sqrt((tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)) / (2 * HALF) + eps)   # (BT, BH)
            tl.store(rstd + (g * R + rows).to(tl.int64)[:, None] * H + heads[None, :], rs,
                     mask=(rows < R)[:, None] & (heads < H)[None, :])
            w1 = tl.load(w + g * (2 * HALF) + i).to(tl.float32)[None, None, :]
            w2 = tl.load(w + g * (2 * HALF) + HALF + i).to(tl.float32)[None, None, :]
            x1 = x1 * rs[:, :, None] * w1
            x2 = x2 * rs[:, :, None] * w2
        if ROPE_R:
            y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
        else:
            y1, y2 = x1, x2
        tl.store(r + dst, y1.to(r.dtype.element_ty), mask=m)
        tl.store(r + dst + HALF, y2.to(r.dtype.element_ty), mask=m)


@triton.jit
def _bwd_kernel(dq, dk, dv, dr, rr, w, rstd, inv_freq, dqkv, drr, dwp, R, T, H, C, NB,
                BT: tl.constexpr, BH: tl.constexpr, HALF: tl.constexpr,
                ROPE_QK: tl.constexpr, NORM_R: tl.constexpr, ROPE_R: tl.constexpr, HAS_R: tl.constexpr):
    g, tb = tl.program_id(0), tl.program_id(1)
    rows = tb * BT + tl.arange(0, BT)
    heads = tl.arange(0, BH)
    i = tl.arange(0, HALF)
    m = (rows < R)[:, None, None] & (heads < H)[None, :, None]
    grow = (g * R + rows).to(tl.int64)[:, None, None]
    lo = heads[None, :, None] * (2 * HALF) + i[None, None, :]
    c, s = _angles(rows, R, T, inv_freq, HALF)
    s = s * -1.                                                     # the inverse rotation
    src = grow * C + lo
    dst = dqkv + grow * (3 * C) + lo
    for part in tl.static_range(2):
        gin = dq if part == 0 else dk
        a1 = tl.load(gin + src, mask=m, other=0.).to(tl.float32)
        a2 = tl.load(gin + src + HALF, mask=m, other=0.).to(tl.float32)
        if ROPE_QK:
            tl.store(dst + part * C, (a1 * c - a2 * s).to(dqkv.dtype.element_ty), mask=m)
            tl.store(dst + part * C + HALF, (a1 * s + a2 * c).to(dqkv.dtype.element_ty), mask=m)
        else:
            tl.store(dst + part * C, a1.to(dqkv.dtype.element_ty), mask=m)
            tl.store(dst + part * C + HALF, a2.to(dqkv.dtype.element_ty), mask=m)
    tl.store(dst + 2 * C, tl.load(dv + src, mask=m, other=0.).to(dqkv.dtype.element_ty), mask=m)
    tl.store(dst + 2 * C + HALF, tl.load(dv + src + HALF, mask=m, other=0.).to(dqkv.dtype.element_ty), mask=m)
    if HAS_R:
        a1 = tl.load(dr + src, mask=m, other=0.).to(tl.float32)
        a2 = tl.load(dr + src + HALF, mask=m, other=0.).to(tl.float32)
        if ROPE_R:
            g1, g2 = a1 * c - a2 * s, a1 * s + a2 * c
        else:
            g1, g2 = a1, a2
        if NORM_R:
            x1 = tl.load(rr + src, mask=m, other=0.).to(tl.float32)
            x2 = tl.load(rr + src + HALF, mask=m, other=0.).to(tl.float32)
            rs = tl.load(rstd + (g * R + rows).to(tl.int64)[:, None] * H + heads[None, :],
                         mask=(rows < R)[:, None] & (heads < H)[None, :], other=0.)[:, :, None]
            w1 = tl.load(w + g * (2 * HALF) + i).to(tl.float32)[None, None, :]
            w2 = tl.load(w + g * (2 * HALF) + HALF + i).to(tl.float32)[None, None, :]
            h1, h2 = x1 * rs, x2 * rs
            gw1, gw2 = g1 * w1, g2 * w2
            cc = ((tl.sum(gw1 * h1, axis=2) + tl.sum(gw2 * h2, axis=2)) / (2 * HALF))[:, :, None]
            tl.store(drr + src, ((gw1 - h1 * cc) * rs).to(drr.dtype.element_ty), mask=m)
            tl.store(drr + src + HALF, ((gw2 - h2 * cc) * rs).to(drr.dtype.element_ty), mask=m)
            p = dwp + (g * NB + tb).to(tl.int64) * (2 * HALF) + i
            tl.store(p, tl.sum(tl.sum(g1 * h1, axis=1), axis=0))
            tl.store(p + HALF, tl.sum(tl.sum(g2 * h2, axis=1), axis=0))
        else:
            tl.store(drr + src, g1.to(drr.dtype.element_ty), mask=m)
            tl.store(drr + src + HALF, g2.to(drr.dtype.element_ty), mask=m)


#: tokens a program (all their heads): about 2048 elements of each of the rows it moves (seven with r, six without)
def _blocks(R: int, H: int, D: int) -> tuple[int, int, int]:
    BH = triton.next_power_of_2(H)
    BT = max(1, min(triton.next_power_of_2(R), 2048 // (BH * D)))
    return BT, BH, triton.cdiv(R, BT)


def forward(qkv: torch.Tensor, rr: torch.Tensor | None, w: torch.Tensor | None, inv_freq: torch.Tensor, T: int, H: int,
            eps: float, rope_qk: bool, rope_r: bool):
    """qkv (G, R, 3C), rr (G, R, C) contiguous or None (q, k, v alone), w (G, D) contiguous or None (no norm) -> q, k,
    v, r (G, R, C) in qkv's dtype (r None without rr), rstd (G, R, H) float32 (None without a norm)."""
    G, R, C3 = qkv.shape
    C = C3 // 3
    D = C // H
    has_r, norm = rr is not None, rr is not None and w is not None
    q, k, v = (torch.empty(G, R, C, dtype=qkv.dtype, device=qkv.device) for _ in range(3))
    r = torch.empty_like(q) if has_r else None
    rstd = torch.empty(G, R, H, dtype=torch.float32, device=qkv.device) if norm else None
    BT, BH, NB = _blocks(R, H, D)
    if G and R:
        x = lambda t: q if t is None else t                     # a pointer the kernel leaves alone where t is None
        _fwd_kernel[(G, NB)](qkv, x(rr), x(w) if norm else q, inv_freq, q, k, v, x(r), x(rstd), R, T, H, C, float(eps),
                             BT=BT, BH=BH, HALF=D // 2, ROPE_QK=rope_qk, NORM_R=norm, ROPE_R=has_r and rope_r,
                             HAS_R=has_r, num_warps=4)
    return q, k, v, r, rstd


def backward(dq, dk, dv, dr, rr, w, rstd, inv_freq, T: int, H: int, rope_qk: bool, rope_r: bool, qkv_dtype):
    """Gradients (G, R, C) contiguous of q, k, v, r (dr and rr None: q, k, v alone) -> dqkv (G, R, 3C) in qkv_dtype,
    drr (G, R, C) in rr's dtype (None without rr), dw (G, D) float32 (None without a norm)."""
    G, R, C = dq.shape
    D = C // H
    has_r, norm = rr is not None, rr is not None and w is not None
    dqkv = torch.empty(G, R, 3 * C, dtype=qkv_dtype, device=dq.device)
    drr = torch.empty_like(rr) if has_r else None
    BT, BH, NB = _blocks(R, H, D)
    dwp = torch.empty(G, NB, D, dtype=torch.float32, device=dq.device) if norm else None
    if G and R:
        x = lambda t: dq if t is None else t
        _bwd_kernel[(G, NB)](dq, dk, dv, x(dr), x(rr), x(w) if norm else dq, x(rstd), inv_freq, dqkv, x(drr),
                             dqkv if dwp is None else dwp, R, T, H, C, NB, BT=BT, BH=BH, HALF=D // 2,
                             ROPE_QK=rope_qk, NORM_R=norm, ROPE_R=has_r and rope_r, HAS_R=has_r, num_warps=4)
    return dqkv, drr, (None if dwp is None else dwp.sum(1))
