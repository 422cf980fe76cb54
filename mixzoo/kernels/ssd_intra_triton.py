"""The Triton kernels behind ``mixzoo.kernels.ssd_intra`` (imported only when they are to run).

One program per (sequence, chunk) runs over the heads: the chunk's score matrix S = q kᵀ (C x C,
shared by the heads) stays in registers, each head's decay matrix is built from its cumulative
log-decays, and the backward sums dS over the heads before dq = dS k and dk = dSᵀ q. Products of
float32 operands in full float32 (``input_precision="ieee"``), as the PyTorch form's matmuls. (As three
TF32 products, ``"tf32x3"``, ptxas reports no register spills where ieee spills about 1.4 KB per thread, but on
the H200 with Triton 3.6 the kernels then stopped with an illegal memory access at chunks of 64, 2026-12-03.)"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decay(gc, ks, base_h, o_c, C: tl.constexpr):
    """E (C x C): exp(g_t - g_s) for s <= t, else 0; and E scaled by ks_s (columns)."""
    g = tl.load(gc + base_h + o_c)
    s = tl.load(ks + base_h + o_c)
    keep = o_c[:, None] >= o_c[None, :]
    E = tl.where(keep, tl.exp(tl.where(keep, g[:, None] - g[None, :], 0.)), 0.)
    return E, E * s[None, :]


@triton.jit
def _voff(b, h, n, sv, o_c, o_v):
    """Offsets of the (C, BV) value tile of (sequence b, head h, chunk n) in a tensor of strides sv =
    (sequence, head, chunk, position), its value dimension contiguous."""
    return (b.to(tl.int64) * sv[0] + h * sv[1] + n * sv[2]) + o_c[:, None] * sv[3] + o_v[None, :]


@triton.jit
def _fwd_kernel(q, k, v, gc, ks, o, H, N, K, V, svb, svh, svn, svc, sob, soh, son, soc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, so = (svb, svh, svn, svc), (sob, soh, son, soc)
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = tl.dot(bq, tl.trans(bk), input_precision="ieee")
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        _, M = _decay(gc, ks, bh * C, o_c, C)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.)
        tl.store(o + _voff(b, h, n, so, o_c, o_v), tl.dot(S * M, bv, input_precision="ieee"), mask=mv[None, :])


@triton.jit
def _bwd_kernel(q, k, v, gc, ks, do, dq, dk, dv, dgc, dks, H, N, K, V, svb, svh, svn, svc, sdb, sdh, sdn, sdc,
                sob, soh, son, soc, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, sd, so = (svb, svh, svn, svc), (sdb, sdh, sdn, sdc), (sob, soh, son, soc)
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = tl.dot(bq, tl.trans(bk), input_precision="ieee")
    dS = tl.zeros([C, C], tl.float32)
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        E, M = _decay(gc, ks, bh * C, o_c, C)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.)
        tl.store(dv + _voff(b, h, n, so, o_c, o_v), tl.dot(tl.trans(S * M), bdo, input_precision="ieee"),
                 mask=mv[None, :])
        dA = tl.dot(bdo, tl.trans(bv), input_precision="ieee")           # (C, C): do_t . v_s
        dS += dA * M
        dM = dA * S
        P = dM * M
        tl.store(dgc + bh * C + o_c, tl.sum(P, axis=1) - tl.sum(P, axis=0))
        tl.store(dks + bh * C + o_c, tl.sum(dM * E, axis=0))
    tl.store(dq + qk, tl.dot(dS, bk, input_precision="ieee"), mask=mk[None, :])
    tl.store(dk + qk, tl.dot(tl.trans(dS), bq, input_precision="ieee"), mask=mk[None, :])


@triton.jit
def _states_kernel(q, k, v, gc, ks, es, o, H, N, K, V, svb, svh, svn, svc, sob, soh, son, soc,
                   C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """One (sequence, head), the chunks in order: es[n] (K x V), the state entering chunk n (es[0] = 0,
    es[n + 1] = exp(g_last[n]) es[n] + k[n]ᵀ (u[n] v[n]), u_s = exp(g_last - g_s) ks_s), and the output's
    inter-chunk part exp(g) q[n] es[n], added to what o holds (the within-chunk part)."""
    b, h = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, so = (svb, svh, svn, svc), (sob, soh, son, soc)
    last = o_c == C - 1
    st = tl.zeros([BK, BV], tl.float32)
    for n in range(N):
        bh = ((b * H + h) * N + n).to(tl.int64)
        tl.store(es + (bh * K + o_k)[:, None] * V + o_v[None, :], st, mask=mk[:, None] & mv[None, :])
        g = tl.load(gc + bh * C + o_c)
        qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
        if n > 0:
            bq = tl.load(q + qk, mask=mk[None, :], other=0.)
            oo = o + _voff(b, h, n, so, o_c, o_v)
            out = tl.load(oo, mask=mv[None, :], other=0.) + tl.exp(g)[:, None] * tl.dot(bq, st, input_precision="ieee")
            tl.store(oo, out, mask=mv[None, :])
        if n < N - 1:
            s = tl.load(ks + bh * C + o_c)
            gl = tl.sum(tl.where(last, g, 0.), axis=0)
            bk = tl.load(k + qk, mask=mk[None, :], other=0.)
            bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.)
            st = st * tl.exp(gl) + tl.dot(tl.trans(bk), bv * (tl.exp(gl - g) * s)[:, None], input_precision="ieee")


@triton.jit
def _dstates_kernel(q, k, v, gc, ks, es, do, dst, dvp, dgc, dks, H, N, K, V, svb, svh, svn, svc, sdb, sdh, sdn, sdc,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Backward of ``_states_kernel`` for one (sequence, head), the chunks in reverse. G, the gradient of
    es[n + 1], is that of chunk n's state: its value, key-scale and log-decay parts are written (``dvp``
    (B, H, N, C, V) contiguous, dgc, dks), with those of the output's read of es[n] and of the decay
    exp(g_last[n]) that carries es[n]; then G <- exp(g_last[n]) G + q[n]ᵀ (exp(g) do[n]). The key's part,
    summed over the heads, is ``_dqk_kernel``'s, from G written as ``dst[n]``."""
    b, h = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, sd = (svb, svh, svn, svc), (sdb, sdh, sdn, sdc)
    last = o_c == C - 1
    G = tl.zeros([BK, BV], tl.float32)
    for i in range(N):
        n = N - 1 - i
        bh = ((b * H + h) * N + n).to(tl.int64)
        eo = (bh * K + o_k)[:, None] * V + o_v[None, :]
        em = mk[:, None] & mv[None, :]
        g = tl.load(gc + bh * C + o_c)
        s = tl.load(ks + bh * C + o_c)
        gl = tl.sum(tl.where(last, g, 0.), axis=0)
        qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.)
        be = tl.load(es + eo, mask=em, other=0.)
        tl.store(dst + eo, G, mask=em)
        w = tl.exp(gl - g)
        u = w * s
        # the key tile's products first, then the query tile's: one C x K tile live at a time
        kd = tl.dot(tl.load(k + qk, mask=mk[None, :], other=0.), G, input_precision="ieee")   # (C, V)
        du = tl.sum(bv * kd, axis=1)
        tl.store(dvp + (bh * C + o_c)[:, None] * V + o_v[None, :], u[:, None] * kd, mask=mv[None, :])
        tl.store(dks + bh * C + o_c, du * w)
        dgl = tl.sum(du * u, axis=0) + tl.exp(gl) * tl.sum(tl.sum(G * be, axis=1), axis=0)
        fs = tl.exp(g)
        bq = tl.load(q + qk, mask=mk[None, :], other=0.)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.)
        bdg = fs * tl.sum(bdo * tl.dot(bq, be, input_precision="ieee"), axis=1) - du * u
        tl.store(dgc + bh * C + o_c, bdg + tl.where(last, dgl, 0.))
        G = G * tl.exp(gl) + tl.dot(tl.trans(bq), bdo * fs[:, None], input_precision="ieee")


@triton.jit
def _dqk_kernel(gc, ks, v, es, dst, do, dq, dk, H, N, K, V, svb, svh, svn, svc, sdb, sdh, sdn, sdc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The inter-chunk parts of dq and dk for one (sequence, chunk), summed over the heads in registers (no
    atomics: the same numbers every run): dq = exp(g) do es[n]ᵀ, dk = (u v) dst[n]ᵀ."""
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, sd = (svb, svh, svn, svc), (sdb, sdh, sdn, sdc)
    last = o_c == C - 1
    bdq = tl.zeros([C, BK], tl.float32)
    bdk = tl.zeros([C, BK], tl.float32)
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        eo = (bh * K + o_k)[:, None] * V + o_v[None, :]
        em = mk[:, None] & mv[None, :]
        g = tl.load(gc + bh * C + o_c)
        s = tl.load(ks + bh * C + o_c)
        gl = tl.sum(tl.where(last, g, 0.), axis=0)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.)
        bdq += tl.dot(bdo * tl.exp(g)[:, None], tl.trans(tl.load(es + eo, mask=em, other=0.)), input_precision="ieee")
        bdk += tl.dot(bv * (tl.exp(gl - g) * s)[:, None], tl.trans(tl.load(dst + eo, mask=em, other=0.)),
                      input_precision="ieee")
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    tl.store(dq + qk, bdq, mask=mk[None, :])
    tl.store(dk + qk, bdk, mask=mk[None, :])


def _blocks(K: int, V: int) -> tuple[int, int]:
    return max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))


def like(v):
    """An empty tensor of v's shape and dtype whose memory is ordered as v's (by decreasing stride), dense:
    where v is a view of (B, T, H, V) memory, the output and the value gradient are written in that layout
    too (and a caller's view of them as (B, T, H, V) needs no copy)."""
    order = sorted(range(v.dim()), key=lambda d: -v.stride(d))
    t = torch.empty([v.shape[d] for d in order], dtype=v.dtype, device=v.device)
    return t.permute([order.index(d) for d in range(v.dim())])


def _strides(x) -> tuple[int, int, int, int]:
    """(sequence, head, chunk, position) strides of a (B, H, N, C, V) tensor."""
    return tuple(x.stride()[:4])


def forward(q, k, v, gc, ks):
    """q, k (B, N, C, K); gc, ks (B, H, N, C), float32 contiguous; v (B, H, N, C, V) float32, any strides
    with the value dimension contiguous (a view of (B, T, H, V) memory is read in place) -> o, its memory
    ordered as v's (``like``)."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    o = like(v)
    BK, BV = _blocks(K, V)
    _fwd_kernel[(B, N)](q, k, v, gc, ks, o, H, N, K, V, *_strides(v), *_strides(o), C=C, BK=BK, BV=BV, num_warps=8)
    return o


def backward(q, k, v, gc, ks, do):
    """Gradients of ``forward``'s inputs; ``do`` any strides with the value dimension contiguous; dv's memory
    ordered as v's."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), like(v)
    dgc, dks = torch.empty_like(gc), torch.empty_like(ks)
    BK, BV = _blocks(K, V)
    _bwd_kernel[(B, N)](q, k, v, gc, ks, do, dq, dk, dv, dgc, dks, H, N, K, V, *_strides(v), *_strides(do),
                        *_strides(dv), C=C, BK=BK, BV=BV, num_warps=8)
    return dq, dk, dv, dgc, dks


def scan_forward(q, k, v, gc, ks):
    """The whole chunked scan: ``forward``'s within-chunk part, then ``_states_kernel`` (one program per
    (sequence, head)) adds the part carried between chunks. -> (o, es): es (B, H, N, K, V) float32, the states
    entering each chunk, kept for the backward."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    o = forward(q, k, v, gc, ks)
    es = q.new_empty(B, H, N, K, V)
    BK, BV = _blocks(K, V)
    _states_kernel[(B, H)](q, k, v, gc, ks, es, o, H, N, K, V, *_strides(v), *_strides(o), C=C, BK=BK, BV=BV,
                           num_warps=8)
    return o, es


def scan_backward(q, k, v, gc, ks, es, do):
    """Gradients of ``scan_forward``'s inputs: ``backward``'s within-chunk parts plus the inter-chunk ones
    (``_dstates_kernel`` per (sequence, head), then ``_dqk_kernel`` per (sequence, chunk)), added here."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    dq, dk, dv, dgc, dks = backward(q, k, v, gc, ks, do)
    BK, BV = _blocks(K, V)
    dst, dvp = torch.empty_like(es), q.new_empty(B, H, N, C, V)
    dgi, dksi, dqi, dki = torch.empty_like(gc), torch.empty_like(ks), torch.empty_like(q), torch.empty_like(k)
    _dstates_kernel[(B, H)](q, k, v, gc, ks, es, do, dst, dvp, dgi, dksi, H, N, K, V, *_strides(v), *_strides(do),
                            C=C, BK=BK, BV=BV, num_warps=8)
    _dqk_kernel[(B, N)](gc, ks, v, es, dst, do, dqi, dki, H, N, K, V, *_strides(v), *_strides(do),
                        C=C, BK=BK, BV=BV, num_warps=8)
    dv += dvp
    return dq + dqi, dk + dki, dv, dgc + dgi, dks + dksi
