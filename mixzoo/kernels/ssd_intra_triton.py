"""The Triton kernels behind ``mixzoo.kernels.ssd_intra`` (imported only when they are to run).

``_fwd_kernel`` / ``_bwd_kernel``: one program per (sequence, chunk) runs over the heads: the chunk's
score matrix S = q kᵀ (C x C, shared by the heads) stays in registers, each head's decay matrix is
built from its cumulative log-decays, and the backward sums dS over the heads before dq = dS k and
dk = dSᵀ q. With ``INTER`` they also read the state entering the chunk (output exp(g_t) q_t . S) and,
backward, take the gradients through it and through the chunk's own state, summing those of q and k
over the heads in the same program (no atomics: the same numbers every run). ``_states_kernel`` /
``_dstates_kernel``: one program per (sequence, head) carries the K x V state over the chunks and
its gradient back. Products of float32 operands in full float32 (``input_precision="ieee"``), as
the PyTorch form's matmuls."""
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
    (sequence, head, chunk, position); the value dimension is contiguous."""
    return (b.to(tl.int64) * sv[0] + h * sv[1] + n * sv[2]) + o_c[:, None] * sv[3] + o_v[None, :]


@triton.jit
def _fwd_kernel(q, k, v, gc, ks, es, dsk, o, H, N, K, V, svb, svh, svn, svc, sob, soh, son, soc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, INTER: tl.constexpr, SKIP: tl.constexpr):
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
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        out = tl.dot(S * M, bv, input_precision="ieee")
        if INTER:       # + exp(g_t) q_t . (the state entering the chunk)
            eo = (bh * K + o_k)[:, None] * V + o_v[None, :]
            be = tl.load(es + eo, mask=mk[:, None] & mv[None, :], other=0.)
            fs = tl.exp(tl.load(gc + bh * C + o_c))
            out += fs[:, None] * tl.dot(bq, be, input_precision="ieee")
        if SKIP:        # + D v (Mamba's skip, one D per sequence and head)
            out += tl.load(dsk + b * H + h) * bv
        tl.store(o + _voff(b, h, n, so, o_c, o_v), out, mask=mv[None, :])


@triton.jit
def _bwd_kernel(q, k, v, gc, ks, es, dst, dgl, dsk, do, dq, dk, dv, dgc, dks, ddsk, H, N, K, V,
                svb, svh, svn, svc, sdb, sdh, sdn, sdc, sob, soh, son, soc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, INTER: tl.constexpr, SKIP: tl.constexpr):
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, sd, so = (svb, svh, svn, svc), (sdb, sdh, sdn, sdc), (sob, soh, son, soc)
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = tl.dot(bq, tl.trans(bk), input_precision="ieee")
    dS = tl.zeros([C, C], tl.float32)
    dqi = tl.zeros([C, BK], tl.float32)         # the inter-chunk parts of dq and dk, summed over the heads
    dki = tl.zeros([C, BK], tl.float32)
    last = o_c == C - 1
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        E, M = _decay(gc, ks, bh * C, o_c, C)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        bdv = tl.dot(tl.trans(S * M), bdo, input_precision="ieee")
        dA = tl.dot(bdo, tl.trans(bv), input_precision="ieee")           # (C, C): do_t . v_s
        dS += dA * M
        dM = dA * S
        P = dM * M
        bdg = tl.sum(P, axis=1) - tl.sum(P, axis=0)
        bdks = tl.sum(dM * E, axis=0)
        if INTER:
            g = tl.load(gc + bh * C + o_c)
            s = tl.load(ks + bh * C + o_c)
            gl = tl.sum(tl.where(last, g, 0.), axis=0)
            eo = (bh * K + o_k)[:, None] * V + o_v[None, :]
            em = mk[:, None] & mv[None, :]
            be = tl.load(es + eo, mask=em, other=0.)
            bd = tl.load(dst + eo, mask=em, other=0.)
            # output side: o_t += exp(g_t) q_t . es
            fs = tl.exp(g)
            dqi += tl.dot(bdo * fs[:, None], tl.trans(be), input_precision="ieee")
            bdg += fs * tl.sum(bdo * tl.dot(bq, be, input_precision="ieee"), axis=1)
            # state side: the chunk's state kᵀ (u v), u_s = exp(g_last - g_s) ks_s, with gradient bd
            w = tl.exp(gl - g)
            u = w * s
            kd = tl.dot(bk, bd, input_precision="ieee")                      # (C, V)
            bdv += u[:, None] * kd
            du = tl.sum(bv * kd, axis=1)
            dki += tl.dot(bv * u[:, None], tl.trans(bd), input_precision="ieee")
            bdks += du * w
            bdg += -du * u + tl.where(last, tl.sum(du * u, axis=0) + tl.load(dgl + bh), 0.)
        if SKIP:
            bdv += tl.load(dsk + b * H + h) * bdo
            tl.store(ddsk + bh, tl.sum(tl.sum(bdo * bv, axis=1), axis=0))     # summed over the chunks outside
        tl.store(dv + _voff(b, h, n, so, o_c, o_v), bdv.to(dv.dtype.element_ty), mask=mv[None, :])
        tl.store(dgc + bh * C + o_c, bdg)
        tl.store(dks + bh * C + o_c, bdks)
    tl.store(dq + qk, tl.dot(dS, bk, input_precision="ieee") + dqi, mask=mk[None, :])
    tl.store(dk + qk, tl.dot(tl.trans(dS), bq, input_precision="ieee") + dki, mask=mk[None, :])


@triton.jit
def _states_kernel(k, v, gc, ks, es, H, N, K, V, svb, svh, svn, svc,
                   C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """es[n] (K x V), the state entering chunk n of one (sequence, head): es[0] = 0,
    es[n + 1] = exp(g_last[n]) es[n] + k[n]ᵀ (u[n] v[n]), u_s = exp(g_last - g_s) ks_s."""
    b, h = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv = (svb, svh, svn, svc)
    last = o_c == C - 1
    st = tl.zeros([BK, BV], tl.float32)
    for n in range(N):
        bh = ((b * H + h) * N + n).to(tl.int64)
        eo = (bh * K + o_k)[:, None] * V + o_v[None, :]
        tl.store(es + eo, st, mask=mk[:, None] & mv[None, :])
        if n < N - 1:
            g = tl.load(gc + bh * C + o_c)
            s = tl.load(ks + bh * C + o_c)
            gl = tl.sum(tl.where(last, g, 0.), axis=0)
            bk = tl.load(k + ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :], mask=mk[None, :], other=0.)
            bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
            st = st * tl.exp(gl) + tl.dot(tl.trans(bk), bv * (tl.exp(gl - g) * s)[:, None], input_precision="ieee")


@triton.jit
def _dstates_kernel(q, gc, es, do, dst, dgl, H, N, K, V, sdb, sdh, sdn, sdc,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Backward of ``_states_kernel`` and of the outputs' read of the states, one (sequence, head), the chunks
    in reverse: G (the gradient of es[n + 1]) gives the gradient of chunk n's state, dst[n] = G, and of its
    decay's log, dgl[n] = exp(g_last[n]) <G, es[n]>; then G <- exp(g_last[n]) G + q[n]ᵀ (exp(g) do[n])."""
    b, h = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sd = (sdb, sdh, sdn, sdc)
    last = o_c == C - 1
    G = tl.zeros([BK, BV], tl.float32)
    for i in range(N):
        n = N - 1 - i
        bh = ((b * H + h) * N + n).to(tl.int64)
        eo = (bh * K + o_k)[:, None] * V + o_v[None, :]
        em = mk[:, None] & mv[None, :]
        tl.store(dst + eo, G, mask=em)
        g = tl.load(gc + bh * C + o_c)
        a = tl.exp(tl.sum(tl.where(last, g, 0.), axis=0))
        be = tl.load(es + eo, mask=em, other=0.)
        tl.store(dgl + bh, a * tl.sum(tl.sum(G * be, axis=1), axis=0))
        bq = tl.load(q + ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :], mask=mk[None, :], other=0.)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        G = G * a + tl.dot(tl.trans(bq), bdo * tl.exp(g)[:, None], input_precision="ieee")


def _blocks(K: int, V: int) -> tuple[int, int]:
    return max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))


def like(v, dtype=None):
    """An empty tensor of v's shape (and dtype, or ``dtype``) whose memory is ordered as v's is (by
    decreasing stride), dense: where v is a view of (B, T, H, V) memory, so are the outputs and value
    gradients written in its layout, and the callers' reshapes of them are views."""
    order = sorted(range(v.dim()), key=lambda d: -v.stride(d))
    t = torch.empty([v.shape[d] for d in order], dtype=dtype or v.dtype, device=v.device)
    return t.permute([order.index(d) for d in range(v.dim())])


def _strides(x) -> tuple[int, int, int, int]:
    """(sequence, head, chunk, position) strides of a (B, H, N, C, V) tensor whose last dimension is contiguous."""
    return tuple(x.stride()[:4])


def forward(q, k, v, gc, ks, inter: bool = False, skip=None):
    """q, k (B, N, C, K); gc, ks (B, H, N, C), float32 contiguous; v (B, H, N, C, V) float32 or bfloat16,
    any strides (a view of (B, T, H, V) memory, or of a part of it, is read in place); skip: None or
    (B, H) float32 -> (o float32, its memory ordered as v's (``like``), the states entering each chunk
    (B, H, N, K, V) or None). ``inter``: o is the whole chunked scan (the states carried between chunks
    too), else the within-chunk part only; ``skip``: o also has skip[b, h] v added."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    if v.stride(-1) != 1:
        v = v.contiguous()
    o = like(v, torch.float32)
    BK, BV = _blocks(K, V)
    inter = inter and N > 1
    es = None
    if inter:
        es = q.new_empty(B, H, N, K, V)
        _states_kernel[(B, H)](k, v, gc, ks, es, H, N, K, V, *_strides(v), C=C, BK=BK, BV=BV, num_warps=4)
    _fwd_kernel[(B, N)](q, k, v, gc, ks, es if inter else o, o if skip is None else skip, o, H, N, K, V,
                        *_strides(v), *_strides(o), C=C, BK=BK, BV=BV, INTER=inter, SKIP=skip is not None, num_warps=8)
    return o, es


def backward(q, k, v, gc, ks, do, es=None, skip=None):
    """Gradients of q, k, v (in v's dtype and layout), gc, ks and skip (None without); ``es`` from
    ``forward`` (None: the within-chunk part only), v as ``forward`` read it."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    if v.stride(-1) != 1:
        v = v.contiguous()
    if do.stride(-1) != 1:
        do = do.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), like(v)
    dgc, dks = torch.empty_like(gc), torch.empty_like(ks)
    BK, BV = _blocks(K, V)
    inter = es is not None
    dst = dgl = dq
    if inter:
        dst, dgl = torch.empty_like(es), gc.new_empty(B, H, N)
        _dstates_kernel[(B, H)](q, gc, es, do, dst, dgl, H, N, K, V, *_strides(do), C=C, BK=BK, BV=BV,
                                num_warps=4)
    dsk = None if skip is None else gc.new_empty(B, H, N)
    _bwd_kernel[(B, N)](q, k, v, gc, ks, es if inter else dq, dst, dgl, dq if skip is None else skip, do,
                        dq, dk, dv, dgc, dks, dq if skip is None else dsk, H, N, K, V, *_strides(v), *_strides(do), *_strides(dv),
                        C=C, BK=BK, BV=BV, INTER=inter, SKIP=skip is not None, num_warps=8)
    return dq, dk, dv, dgc, dks, None if skip is None else dsk.sum(-1)
