"""The Triton kernels behind ``mixzoo.kernels.causal_conv`` (imported only when they are to run).

x (B, T, C) contiguous, weight (M, C, W), bias (M, C) for M models whose B / M sequences each are consecutive
(a stacked step's K models folded into the batch: sequence b takes model b // (B / M)'s weight; M = 1 for one
model). Every kernel runs one program per (sequence, block of channels, span of positions), so the weight's and
bias's gradients are summed over the positions inside the program, deterministically, and over the sequences and
spans by the caller. Two paths each way, picked at each call by a named switch (the first its default):

- ``MIXZOO_CONV_FWD=seq`` (``forward_seq``, _fwd_seq_kernel): the program walks its span one row of BC channels at
  a time, forward in time, loading each row of x once and carrying the window's W - 1 rows before it in registers.
  ``tiles`` (``forward_tiles``, _fwd_kernel): blocks of BT positions, the W shifted windows of x loaded as W tiles.
- ``MIXZOO_CONV_BWD=seq`` (``backward_seq``, _bwd_seq_kernel): one pass, the span walked one row at a time backwards
  in time from W - 1 rows past its end (a halo whose dz feed dx at the span's last rows): the one new row of x
  and dy loaded at each step, z and dz = dy silu'(z) recomputed, dx written directly from dz and the W - 1 dz
  after it (carried), dw and db summed in (BC,) rows; no dz buffer. ``two-pass`` (``backward_two_pass``):
  _dz_kernel (dz in float32 with dw's and db's partial sums, from (W, BT, BC) tiles of shifted windows of x), then
  _dx_kernel (dx from dz read back).
The one-row kernels take widths up to SEQ_MAX_W = 4 (W - 1 carried rows as named registers; Triton has no
register arrays): wider ones take the tiles and the two passes. The one-row kernels' tilings (SEQ_*, SEQ_FWD_*)
are timed beside the two passes on the H200 in benchmarks/conv_tiles.py.

The two passes' tiling is the fastest of those timed side by side on the H200 (benchmarks/conv_tiles.py,
2026-12-03, benchmarks/h200-2026-12-03c/conv-tiles-c473c34.json), the backward of gdn's convolution at the mad
recipe (384 channels, width 4, SiLU, bias, bfloat16): 8 positions x 64 channels, 2 warps, spans of 128 took 0.147 /
0.585 / 3.30 ms at (batch, length) (128, 128) / (128, 1024) / (768, 1024), against 0.189 / 0.724 / 4.02 ms for
the kernels before (whole sequences per program, the weight gradient's rows summed in every block). Spans alone
were no faster (16 x 64, 4 warps, at (768, 1024): whole sequences 3.46, spans of 256 3.54, of 128 3.76, of 64
4.20 ms). A stacked gdn or Mamba-2 step did not change measurably with it (within 1 %): the two passes move about
4.2 GB there (dz in float32 written and read back), and they are a few percent of the step."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import CONV_BWD, CONV_FWD, switch_error


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


# --- one row at a time: the span's positions walked as (BC,) rows, the window carried in registers --------------
# The row loop is tl.range(..., num_stages=NS, loop_unroll_factor=UF). Triton's pipeliner (AssignLatencies'
# preCondition, loopHasDistGreaterThanOne) refuses a loop that yields one of its own block arguments unchanged, as
# the carried window does (x2 = x3 ...): unrolled UF >= W - 1 times, every value the loop body yields is one it
# computed, and the main loop's loads become cp.async copies in NS stages (seen in the sm_90 TTGIR: bf16 rows of 2
# or more channels a thread, float32 of 1 or more; the unroller's remainder loop is not pipelined).


@triton.jit
def _row(p, t, T, C, c, mc):
    """Row t of a (T, C) sequence at p, channels c, as float32 (zeros before 0 and from T on, as the causal padding
    and the sequence's end)."""
    return tl.load(p + t.to(tl.int64) * C + c, mask=mc & (t >= 0) & (t < T), other=0.).to(tl.float32)


@triton.jit
def _lag(w, c, mc, k: tl.constexpr, W: tl.constexpr, BC: tl.constexpr):
    """The weight that multiplies x[t - k] in y[t] (w[:, W - 1 - k]) as a (BC,) float32 row; zeros for k >= W."""
    u = tl.zeros([BC], tl.float32)
    if k < W:
        u += tl.load(w + c * W + (W - 1 - k), mask=mc, other=0.).to(tl.float32)
    return u


@triton.jit
def _seq_setup(w, bias, T, C, BM, W: tl.constexpr, HAS_BIAS: tl.constexpr, BC: tl.constexpr):
    """The program's (sequence, channel block, span), its channels and their mask, the sequence's offset, its
    model's weights by lag (u0..u3: u_k multiplies x[t - k]) and bias."""
    b, cb, tb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    c = cb * BC + tl.arange(0, BC)
    mc = c < C
    w += (b // BM) * C * W                                    # this sequence's model's weight and bias
    bias += (b // BM) * C
    bv = tl.zeros([BC], tl.float32)
    if HAS_BIAS:
        bv += tl.load(bias + c, mask=mc, other=0.).to(tl.float32)
    return (b, tb, c, mc, b.to(tl.int64) * T * C, _lag(w, c, mc, 0, W, BC), _lag(w, c, mc, 1, W, BC),
            _lag(w, c, mc, 2, W, BC), _lag(w, c, mc, 3, W, BC), bv)


@triton.jit
def _conv_row(bv, x0, x1, x2, x3, u0, u1, u2, u3, W: tl.constexpr):
    """bias + sum_j w_j x[t - (W - 1) + j] from the window by lag (x_k = x[t - k]), summed in _fwd_kernel's order
    (j ascending: the oldest row first). The backward's dx is the same sum over the carried dz (x_k = dz[t + k])."""
    z = bv
    if W > 3:
        z += x3 * u3
    if W > 2:
        z += x2 * u2
    if W > 1:
        z += x1 * u1
    z += x0 * u0
    return z


@triton.jit
def _fwd_seq_kernel(x, w, bias, y, T, C, BM, W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                    BC: tl.constexpr, TB: tl.constexpr, NS: tl.constexpr, UF: tl.constexpr):
    """y over the span [t0, t0 + TB) of one sequence and channel block, forward in time one row at a time: each
    row of x is loaded once (the W - 1 before the span once more, by the span before it too) and the window's
    other W - 1 rows are carried in registers (x0..x3 by lag; W <= 4)."""
    b, tb, c, mc, base, u0, u1, u2, u3, bv = _seq_setup(w, bias, T, C, BM, W, HAS_BIAS, BC)
    x += base
    y += base
    t0 = tb * TB
    # the rows before the span, at the lags they take when the first row comes in (x[t0 - 1 - k] at lag k + 1)
    x0 = tl.zeros([BC], tl.float32)
    x1 = tl.zeros([BC], tl.float32)
    x2 = tl.zeros([BC], tl.float32)
    x3 = tl.zeros([BC], tl.float32)
    if W > 1:
        x0 = _row(x, t0 - 1, T, C, c, mc)
    if W > 2:
        x1 = _row(x, t0 - 2, T, C, c, mc)
    if W > 3:
        x2 = _row(x, t0 - 3, T, C, c, mc)
    for i in tl.range(0, tl.minimum(TB, T - t0), num_stages=NS, loop_unroll_factor=UF):
        t = t0 + i
        xn = _row(x, t, T, C, c, mc)
        if W > 3:                                             # one lag on; the new row at lag 0
            x3 = x2
        if W > 2:
            x2 = x1
        if W > 1:
            x1 = x0
        x0 = xn
        z = _conv_row(bv, x0, x1, x2, x3, u0, u1, u2, u3, W)
        if SILU:
            z = z * tl.sigmoid(z)
        tl.store(y + t.to(tl.int64) * C + c, z.to(y.dtype.element_ty), mask=mc)


@triton.jit
def _bwd_seq_kernel(x, w, bias, dy, dx, dwp, dbp, T, C, BM, W: tl.constexpr, HAS_BIAS: tl.constexpr,
                    SILU: tl.constexpr, BC: tl.constexpr, TB: tl.constexpr, NS: tl.constexpr, UF: tl.constexpr):
    """The whole backward over the span [t0, t0 + TB) of one sequence and channel block, backwards in time one
    row at a time, with no dz buffer: at each t the one new row of the window, x[t - (W - 1)], and dy[t] are
    loaded (the window's other W - 1 rows carried from the steps before, x0..x3 by lag), z[t] recomputed, dz[t] =
    dy[t] silu'(z[t]), and dx[t] = sum_j w_j dz[t + W - 1 - j] from dz[t] and the W - 1 dz carried (g1..g3 =
    dz[t + 1..t + 3]). The walk starts W - 1 rows past the span (its halo, the next span's rows, inside the
    sequence), whose dz only feed dx at the span's last rows: they are not stored nor summed into dw, db. dw and
    db are summed in float32 (BC,) rows over the span's positions and stored as the span's partial sums, as
    _dz_kernel's (dwp (B * spans, W, C), dbp (B * spans, C))."""
    b, tb, c, mc, base, u0, u1, u2, u3, bv = _seq_setup(w, bias, T, C, BM, W, HAS_BIAS, BC)
    x += base
    dy += base
    dx += base
    t0 = tb * TB
    t_end = t0 + TB                                           # the span's end (the halo from there)
    t_hi = tl.minimum(t_end + (W - 2), T - 1)                 # the first row walked: the halo's last in the sequence
    # the window's rows at t_hi but its oldest, at the lags they take when it comes in (x[t_hi + 1 - k] at lag k)
    x1 = tl.zeros([BC], tl.float32)
    x2 = tl.zeros([BC], tl.float32)
    x3 = tl.zeros([BC], tl.float32)
    if W > 1:
        x1 = _row(x, t_hi, T, C, c, mc)
    if W > 2:
        x2 = _row(x, t_hi - 1, T, C, c, mc)
    if W > 3:
        x3 = _row(x, t_hi - 2, T, C, c, mc)
    g1 = tl.zeros([BC], tl.float32)                           # dz[t + 1], dz[t + 2], dz[t + 3] (zero from T on)
    g2 = tl.zeros([BC], tl.float32)
    g3 = tl.zeros([BC], tl.float32)
    a0 = tl.zeros([BC], tl.float32)                           # a_k = sum_t dz[t] x[t - k] = dw[W - 1 - k]
    a1 = tl.zeros([BC], tl.float32)
    a2 = tl.zeros([BC], tl.float32)
    a3 = tl.zeros([BC], tl.float32)
    db = tl.zeros([BC], tl.float32)
    for i in tl.range(0, t_hi - t0 + 1, num_stages=NS, loop_unroll_factor=UF):
        t = t_hi - i
        xn = _row(x, t - (W - 1), T, C, c, mc)
        if W == 1:                                            # one lag back; the new row at lag W - 1
            x0 = xn
        else:
            x0 = x1
        if W == 2:
            x1 = xn
        if W > 2:
            x1 = x2
        if W == 3:
            x2 = xn
        if W > 3:
            x2 = x3
            x3 = xn
        z = _conv_row(bv, x0, x1, x2, x3, u0, u1, u2, u3, W)
        g = _row(dy, t, T, C, c, mc)
        if SILU:
            s = tl.sigmoid(z)
            g = g * (s + z * s * (1. - s))
        # _dx_kernel's order: j ascending (dz[t + W - 1] first), the forward's sum over the carried dz
        acc = _conv_row(tl.zeros([BC], tl.float32), g, g1, g2, g3, u0, u1, u2, u3, W)
        own = t < t_end                                       # the span's own row (not the halo)
        tl.store(dx + t.to(tl.int64) * C + c, acc.to(dx.dtype.element_ty), mask=mc & own)
        gs = tl.where(own, g, 0.)
        db += gs
        a0 += gs * x0
        if W > 1:
            a1 += gs * x1
        if W > 2:
            a2 += gs * x2
        if W > 3:
            a3 += gs * x3
        if W > 3:                                             # dz one step later
            g3 = g2
        if W > 2:
            g2 = g1
        if W > 1:
            g1 = g
    part = b.to(tl.int64) * tl.num_programs(2) + tb
    tl.store(dbp + part * C + c, db, mask=mc)
    tl.store(dwp + (part * W + (W - 1)) * C + c, a0, mask=mc)
    if W > 1:
        tl.store(dwp + (part * W + (W - 2)) * C + c, a1, mask=mc)
    if W > 2:
        tl.store(dwp + (part * W + (W - 3)) * C + c, a2, mask=mc)
    if W > 3:
        tl.store(dwp + (part * W + (W - 4)) * C + c, a3, mask=mc)


BT, BC = 32, 64
# the weight-gradient pass holds W windows of x and their sums with dz, (BW, DZ_BT, BC) each: at 8 positions
# and 2 warps ptxas gives sm_90a 128 registers and no spills (16 positions and 4 warps: 225)
DZ_BT, DZ_WARPS = 8, 2
TB = 128               # positions per program (a multiple of BT and DZ_BT)
# the one-row kernels (_bwd_seq_kernel, _fwd_seq_kernel; widths up to SEQ_MAX_W): channels per program (a power of
# 2), warps (128 channels on 1 warp: 4 consecutive channels a thread, 8-byte bf16 loads; cp.async copies need 4
# bytes or more a thread), positions per program (any; the backward walks W - 1 more), the stages the row loop is
# pipelined into (tl.range's num_stages; 1: none) and its unrolling (loop_unroll_factor; at least W - 1 for the
# pipeliner to take the loop). Picked from the tilings timed on the H200 in benchmarks/conv_tiles.py (bf16, 384
# channels, width 4); no spills in ptxas's sm_90a counts
SEQ_BC, SEQ_WARPS, SEQ_TB, SEQ_STAGES, SEQ_UNROLL = 128, 1, 128, 2, 4                        # the backward's
SEQ_FWD_BC, SEQ_FWD_WARPS, SEQ_FWD_TB, SEQ_FWD_STAGES, SEQ_FWD_UNROLL = 128, 1, 128, 3, 4    # the forward's
SEQ_MAX_W = 4


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


def _choice(var: str, allowed: tuple[str, ...]) -> str:
    """The path ``var`` asks for (validated at the command line), the first of ``allowed`` by default."""
    v = os.environ.get(var) or allowed[0]
    if v not in allowed:
        raise ValueError(switch_error())
    return v


def _seq_tiles(tiles, W: int) -> tuple[int, int, int, int, int]:
    """(channels per program, warps, positions per program, stages, unrolling) for the one-row kernels, checked."""
    if not 1 <= W <= SEQ_MAX_W:
        raise ValueError(f"causal_conv: the one-row kernels take widths 1 to {SEQ_MAX_W}, not {W}")
    bc, warps, tb, ns, uf = map(int, tiles)
    if bc < 1 or warps < 1 or bc & (bc - 1) or warps & (warps - 1) or min(tb, ns, uf) < 1:
        raise ValueError(f"causal_conv: one-row tiles {tiles} (channels and warps powers of 2, the rest >= 1)")
    return bc, warps, tb, ns, uf


def _reduce(dwp, dbp, M: int, W: int, C: int, w, bias):
    """The partials, per (sequence, span) with the sequences in model order, summed over each model's own."""
    dw = dwp.view(M, -1, W, C).sum(1).transpose(1, 2).contiguous()                   # (M, C, W)
    db = dbp.view(M, -1, C).sum(1) if bias is not None else None                     # (M, C)
    if w.dim() == 2:
        return dw[0], (db[0] if db is not None else None)
    return dw, db


def forward(x, w, bias, silu: bool, out_dtype):
    """x (B, T, C) contiguous, w (C, W) or (M, C, W) contiguous, bias (C,) / (M, C) or None -> y (B, T, C).
    ``MIXZOO_CONV_FWD`` (read at each call): ``seq`` (the default) ``forward_seq`` for widths up to SEQ_MAX_W,
    ``forward_tiles`` for wider ones; ``tiles`` ``forward_tiles``."""
    if _choice("MIXZOO_CONV_FWD", CONV_FWD) == "seq" and w.shape[-1] <= SEQ_MAX_W:
        return forward_seq(x, w, bias, silu, out_dtype)
    return forward_tiles(x, w, bias, silu, out_dtype)


def forward_tiles(x, w, bias, silu: bool, out_dtype):
    """``forward`` by _fwd_kernel: (BT, BC) tiles, the W windows of x loaded as W tiles."""
    B, T, C = x.shape
    y = torch.empty(B, T, C, dtype=out_dtype, device=x.device)
    if B and T and C:
        _fwd_kernel[_grid(B, T, C)](x, w, bias if bias is not None else w, y, T, C, _per_model(B, w), W=w.shape[-1],
                                    HAS_BIAS=bias is not None, SILU=silu, BT=BT, BC=BC, TB=_span(T))
    return y


def forward_seq(x, w, bias, silu: bool, out_dtype, tiles=None):
    """``forward`` by _fwd_seq_kernel, one row at a time (each row of x loaded once): widths up to SEQ_MAX_W
    (ValueError beyond). ``tiles``: (channels, warps, positions per program, stages, unrolling), default
    SEQ_FWD_BC, SEQ_FWD_WARPS, SEQ_FWD_TB, SEQ_FWD_STAGES, SEQ_FWD_UNROLL."""
    B, T, C = x.shape
    W = w.shape[-1]
    bc, warps, tb, ns, uf = _seq_tiles(tiles or (SEQ_FWD_BC, SEQ_FWD_WARPS, SEQ_FWD_TB, SEQ_FWD_STAGES,
                                                 SEQ_FWD_UNROLL), W)
    y = torch.empty(B, T, C, dtype=out_dtype, device=x.device)
    if B and T and C:
        _fwd_seq_kernel[(B, triton.cdiv(C, bc), triton.cdiv(T, tb))](
            x, w, bias if bias is not None else w, y, T, C, _per_model(B, w), W=W, HAS_BIAS=bias is not None,
            SILU=silu, BC=bc, TB=tb, NS=ns, UF=uf, num_warps=warps)
    return y


def backward(x, w, bias, silu: bool, dy):
    """-> dx (x's dtype), dw like w (C, W) or (M, C, W) float32, db like bias float32 or None (each model's sums over
    its own sequences). ``MIXZOO_CONV_BWD`` (read at each call): ``seq`` (the default) ``backward_seq`` for widths
    up to SEQ_MAX_W, ``backward_two_pass`` for wider ones; ``two-pass`` ``backward_two_pass``."""
    if _choice("MIXZOO_CONV_BWD", CONV_BWD) == "seq" and w.shape[-1] <= SEQ_MAX_W:
        return backward_seq(x, w, bias, silu, dy)
    return backward_two_pass(x, w, bias, silu, dy)


def backward_two_pass(x, w, bias, silu: bool, dy):
    """``backward`` in two passes: dz (float32) with the weight and bias gradients' partial sums, then dx from dz.
    (One pass recomputing dz at the W - 1 later positions instead of writing it, in the same (BT, BC) tiles, gave
    the same numbers and was 1.4-2.3x slower on the H200, 2026-12-03: benchmarks/h200-2026-12-03d.)"""
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
    return (dx, *_reduce(dwp, dbp, M, W, C, w, bias))


def backward_seq(x, w, bias, silu: bool, dy, tiles=None):
    """``backward`` in one pass by _bwd_seq_kernel, one row at a time backwards in time, dx written directly (no
    dz buffer); the weight and bias gradients' partial sums per (sequence, span) as ``backward_two_pass``'s. Widths
    up to SEQ_MAX_W (ValueError beyond). ``tiles``: (channels, warps, positions per program, stages, unrolling),
    default SEQ_BC, SEQ_WARPS, SEQ_TB, SEQ_STAGES, SEQ_UNROLL."""
    B, T, C = x.shape
    W, BM = w.shape[-1], _per_model(B, w)
    bc, warps, tb, ns, uf = _seq_tiles(tiles or (SEQ_BC, SEQ_WARPS, SEQ_TB, SEQ_STAGES, SEQ_UNROLL), W)
    M = B // BM if B else (1 if w.dim() == 2 else w.shape[0])
    spans = max(1, triton.cdiv(T, tb))
    dwp = torch.empty(B * spans, W, C, dtype=torch.float32, device=x.device)
    dbp = torch.empty(B * spans, C, dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x)
    if B and T and C:
        _bwd_seq_kernel[(B, triton.cdiv(C, bc), spans)](
            x, w, bias if bias is not None else w, dy, dx, dwp, dbp, T, C, BM, W=W, HAS_BIAS=bias is not None,
            SILU=silu, BC=bc, TB=tb, NS=ns, UF=uf, num_warps=warps)
    else:
        dwp.zero_()
        dbp.zero_()
    return (dx, *_reduce(dwp, dbp, M, W, C, w, bias))
