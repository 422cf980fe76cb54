"""The Triton kernels behind ``mixzoo.kernels.causal_conv`` (imported only when they are to run).

x (B, T, C) contiguous, weight (M, C, W), bias (M, C) for M models whose B / M sequences each are consecutive
(a stacked step's K models folded into the batch: sequence b takes model b // (B / M)'s weight; M = 1 for one
model): one program per (sequence, block of channels, span of TB
positions) runs along its span in blocks of BT positions (so the weight's and bias's gradients are summed over
the positions inside the program, deterministically, and over the sequences and spans by the caller).

The tiling is the fastest of those timed side by side on the H200 (benchmarks/conv_tiles.py, 2026-12-03,
benchmarks/h200-2026-12-03c/conv-tiles-c473c34.json), the backward of gdn's convolution at the mad recipe
(384 channels, width 4, SiLU, bias, bfloat16): 8 positions x 64 channels, 2 warps, spans of 128 took 0.147 /
0.585 / 3.30 ms at (batch, length) (128, 128) / (128, 1024) / (768, 1024), against 0.189 / 0.724 / 4.02 ms for
the kernels before (whole sequences per program, the weight gradient's rows summed in every block). Spans alone
were no faster (16 x 64, 4 warps, at (768, 1024): whole sequences 3.46, spans of 256 3.54, of 128 3.76, of 64
4.20 ms). A stacked gdn or Mamba-2 step did not change measurably with it (within 1 %): the backward moves about
4.2 GB there (dz in float32 written and read back), and it is a few percent of the step."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel(x, w, bias, y, T, C, BM, W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr, TB: tl.constexpr):
    b, cb, tb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    c = cb * BC + tl.arange(0, BC)
    mc = c < C
    base = b.to(tl.int64) * T * C
    w += (b // BM) * C * W                                    # this sequence's model's weight and bias
    bias += (b // BM) * C
    bv = tl.zeros([BC], tl.float32)
    if HAS_BIAS:
        bv += tl.load(bias + c, mask=mc, other=0.).to(tl.float32)
    for t0 in tl.range(tb * TB, tb * TB + TB, BT):
        t = t0 + tl.arange(0, BT)
        z = tl.zeros([BT, BC], tl.float32) + bv[None, :]
        for j in tl.static_range(W):
            tt = t - (W - 1) + j
            m = ((tt >= 0) & (tt < T))[:, None] & mc[None, :]
            xv = tl.load(x + base + tt.to(tl.int64)[:, None] * C + c[None, :], mask=m, other=0.).to(tl.float32)
            wj = tl.load(w + c * W + j, mask=mc, other=0.).to(tl.float32)
            z += xv * wj[None, :]
        if SILU:
            z = z * tl.sigmoid(z)
        m = (t < T)[:, None] & mc[None, :]
        tl.store(y + base + t.to(tl.int64)[:, None] * C + c[None, :], z.to(y.dtype.element_ty), mask=m)


@triton.jit
def _grad_setup(w, bias, T, C, BM, W: tl.constexpr, HAS_BIAS: tl.constexpr, BC: tl.constexpr, BW: tl.constexpr):
    """The program's (sequence, span), its channels and their mask, the sequence's offset, the window index and
    mask, its model's weight as a (BW, 1, BC) float32 tile and bias (zeros without one)."""
    b, cb, tb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    w += (b // BM) * C * W
    bias += (b // BM) * C
    c = cb * BC + tl.arange(0, BC)
    mc = c < C
    jj = tl.arange(0, BW)
    mw = (jj < W)[:, None] & mc[None, :]
    w3 = tl.load(w + c[None, :] * W + jj[:, None], mask=mw, other=0.).to(tl.float32)[:, None, :]
    bv = tl.zeros([BC], tl.float32)
    if HAS_BIAS:
        bv += tl.load(bias + c, mask=mc, other=0.).to(tl.float32)
    return b, tb, c, mc, b.to(tl.int64) * T * C, jj, mw, w3, bv


@triton.jit
def _store_partials(dwp, dbp, dws, dbs, b, tb, C, c, mc, jj, mw, W: tl.constexpr):
    """The span's sums over its positions of dz x (dw, from (BW, BT, BC) elementwise sums) and of dz (db)."""
    part = b.to(tl.int64) * tl.num_programs(2) + tb
    tl.store(dbp + part * C + c, tl.sum(dbs, axis=0), mask=mc)
    tl.store(dwp + (part * W + jj[:, None]) * C + c[None, :], tl.sum(dws, axis=1), mask=mw)


@triton.jit
def _dz_block(x, w3, bv, dy, base, t, T, C, c, mc, mw, jj, W: tl.constexpr, SILU: tl.constexpr):
    """dz = dy silu'(z) at positions t (BT,) of one block (z recomputed; zero beyond the sequence), and the
    (BW, BT, BC) windows of x it was computed from (x at t - (W - 1) + j)."""
    m = (t < T)[:, None] & mc[None, :]
    tt = t[None, :, None] - (W - 1) + jj[:, None, None]
    mx = (tt >= 0) & (tt < T) & mw[:, None, :]
    xs = tl.load(x + base + tt.to(tl.int64) * C + c[None, None, :], mask=mx, other=0.).to(tl.float32)
    g = tl.load(dy + base + t.to(tl.int64)[:, None] * C + c[None, :], mask=m, other=0.).to(tl.float32)
    if SILU:
        z = tl.sum(xs * w3, axis=0) + bv[None, :]
        s = tl.sigmoid(z)
        g = g * (s + z * s * (1. - s))
    return tl.where(m, g, 0.), xs


@triton.jit
def _dz_kernel(x, w, bias, dy, dz, dwp, dbp, T, C, BM, W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr, BW: tl.constexpr, TB: tl.constexpr):
    """dz = dy silu'(z) (z recomputed), and per (sequence, span) the sums over positions of dz x (dw) and dz
    (db). One pass: dz is written and never read back here (another launch reads it), so no barrier is needed.
    The W shifted windows of x are one (BW, BT, BC) tile per block of positions, used for z and for dw; dw and
    db are summed elementwise over the blocks and over the positions once at the end (summing each block's rows,
    W + 1 times, cost 14 % of the backward at 768 x 1024 x 384 on the H200)."""
    b, tb, c, mc, base, jj, mw, w3, bv = _grad_setup(w, bias, T, C, BM, W, HAS_BIAS, BC, BW)
    dbs = tl.zeros([BT, BC], tl.float32)
    dws = tl.zeros([BW, BT, BC], tl.float32)           # dw[j, c] = sum_t dz[t, c] x[t - (W - 1) + j, c]
    for t0 in tl.range(tb * TB, tb * TB + TB, BT):
        t = t0 + tl.arange(0, BT)
        g, xs = _dz_block(x, w3, bv, dy, base, t, T, C, c, mc, mw, jj, W, SILU)
        tl.store(dz + base + t.to(tl.int64)[:, None] * C + c[None, :], g, mask=(t < T)[:, None] & mc[None, :])
        dbs += g
        dws += xs * g[None, :, :]
    _store_partials(dwp, dbp, dws, dbs, b, tb, C, c, mc, jj, mw, W)


@triton.jit
def _dx_kernel(dz, w, dx, T, C, BM, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, TB: tl.constexpr):
    """dx[t] = sum_j w[j] dz[t + (W - 1) - j]."""
    b, cb, tb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    w += (b // BM) * C * W
    c = cb * BC + tl.arange(0, BC)
    mc = c < C
    base = b.to(tl.int64) * T * C
    for t0 in tl.range(tb * TB, tb * TB + TB, BT):
        t = t0 + tl.arange(0, BT)
        acc = tl.zeros([BT, BC], tl.float32)
        for j in tl.static_range(W):
            tt = t + (W - 1) - j
            m = (tt < T)[:, None] & mc[None, :]
            g = tl.load(dz + base + tt.to(tl.int64)[:, None] * C + c[None, :], mask=m, other=0.)
            acc += g * tl.load(w + c * W + j, mask=mc, other=0.).to(tl.float32)[None, :]
        m = (t < T)[:, None] & mc[None, :]
        tl.store(dx + base + t.to(tl.int64)[:, None] * C + c[None, :], acc.to(dx.dtype.element_ty), mask=m)


BT, BC = 32, 64
# the weight-gradient pass holds W windows of x and their sums with dz, (BW, DZ_BT, BC) each: at 8 positions
# and 2 warps ptxas gives sm_90a 128 registers and no spills (16 positions and 4 warps: 225)
DZ_BT, DZ_WARPS = 8, 2
TB = 128               # positions per program (a multiple of BT and DZ_BT)


def _span(T: int) -> int:
    """Positions per program for sequences of length T: TB, or for shorter sequences the least multiple of 32 (a
    multiple of BT and DZ_BT) that holds them, so that a program walks no block wholly past the sequence."""
    return min(TB, 32 * triton.cdiv(T, 32))


def _grid(B: int, T: int, C: int) -> tuple[int, int, int]:
    return B, triton.cdiv(C, BC), triton.cdiv(T, _span(T))


def _per_model(B: int, w) -> int:
    """Sequences per model for a weight (C, W) (one model) or (M, C, W), M dividing B."""
    M = 1 if w.dim() == 2 else w.shape[0]
    if B % M:
        raise ValueError(f"causal_conv: {B} sequences for {M} models' weights")
    return max(1, B // M)


def forward(x, w, bias, silu: bool, out_dtype):
    """x (B, T, C) contiguous, w (C, W) or (M, C, W) contiguous, bias (C,) / (M, C) or None -> y (B, T, C)."""
    B, T, C = x.shape
    y = torch.empty(B, T, C, dtype=out_dtype, device=x.device)
    if B and T and C:
        _fwd_kernel[_grid(B, T, C)](x, w, bias if bias is not None else w, y, T, C, _per_model(B, w), W=w.shape[-1],
                                    HAS_BIAS=bias is not None, SILU=silu, BT=BT, BC=BC, TB=_span(T))
    return y


def backward(x, w, bias, silu: bool, dy):
    """-> dx (x's dtype), dw like w (C, W) or (M, C, W) float32, db like bias float32 or None (each model's sums over
    its own sequences). Two passes: dz (float32) with the weight and
    bias gradients' partial sums, then dx from dz. (One pass recomputing dz at the W - 1 later positions instead of
    writing it gave the same numbers and was 1.4-2.3x slower on the H200, 2026-12-03: benchmarks/h200-2026-12-03d.)"""
    B, T, C = x.shape
    W, BM = w.shape[-1], _per_model(B, w)
    M = B // BM if B else (1 if w.dim() == 2 else w.shape[0])
    grid = _grid(B, T, C)
    dwp = torch.empty(B * grid[2], W, C, dtype=torch.float32, device=x.device)
    dbp = torch.empty(B * grid[2], C, dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x)
    if B and T and C:
        bias_ = bias if bias is not None else w
        tiles = dict(HAS_BIAS=bias is not None, SILU=silu, BT=DZ_BT, BC=BC, BW=triton.next_power_of_2(W),
                     num_warps=DZ_WARPS, TB=_span(T))
        dz = torch.empty(B, T, C, dtype=torch.float32, device=x.device)
        _dz_kernel[grid](x, w, bias_, dy, dz, dwp, dbp, T, C, BM, W=W, **tiles)
        _dx_kernel[grid](dz, w, dx, T, C, BM, W=W, BT=BT, BC=BC, TB=_span(T))
    else:
        dwp.zero_()
        dbp.zero_()
    # the partials are per (sequence, span), sequences in model order: each model's sum over its own
    dw = dwp.view(M, -1, W, C).sum(1).transpose(1, 2).contiguous()                   # (M, C, W)
    db = dbp.view(M, -1, C).sum(1) if bias is not None else None                     # (M, C)
    if w.dim() == 2:
        return dx, dw[0], (db[0] if db is not None else None)
    return dx, dw, db
