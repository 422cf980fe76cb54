"""The Triton kernels behind ``mixzoo.kernels.ssd_intra`` (imported only when they are to run).

``_fwd_kernel`` / ``_bwd_kernel``: one program per (sequence, chunk) runs over the heads: the chunk's
score matrix S = q kᵀ (C x C, shared by the heads) stays in registers, each head's decay matrix is
built from its cumulative log-decays, and the backward sums dS over the heads before dq = dS k and
dk = dSᵀ q. For the whole scan, ``_states_kernel`` (one program per (sequence, head)) first carries
the K x V state over the chunks and writes the output's inter-chunk part, which ``_fwd_kernel`` adds
to (``ACC``); backward, ``_dstates_kernel`` carries the state's gradient back over the chunks and
writes the per-head inter-chunk gradients, ``_dqk_kernel`` (per (sequence, chunk)) those of q and k
summed over the heads in registers (no atomics: the same numbers every run), and ``_bwd_kernel`` adds
the within-chunk ones. The per-head work is kept out of the per-chunk programs: there, with the C x C
matrices live, it made Triton 3.6's sm_90 code spill 15-20 KB per thread (``ptxas -v``).

Products of float32 operands as three TF32 tensor-core products (``input_precision="tf32x3"``: the
operands split into high and low TF32 parts, float32-level accuracy, within a few 1e-7 of float64 in
the self-check as the PyTorch form's float32 matmuls): the full-float32 FMA form (``"ieee"``) needs
far more registers (1.4-22 KB of spills per thread against 0-1 KB) and no tensor cores."""
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
def _fwd_kernel(q, k, v, gc, ks, dsk, o, H, N, K, V, svb, svh, svn, svc, sob, soh, son, soc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ACC: tl.constexpr, SKIP: tl.constexpr):
    """o = the within-chunk part (+ D v with ``SKIP``), added to what o holds with ``ACC`` (the
    inter-chunk part, written by ``_states_kernel``)."""
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, so = (svb, svh, svn, svc), (sob, soh, son, soc)
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = tl.dot(bq, tl.trans(bk), input_precision="tf32x3")
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        _, M = _decay(gc, ks, bh * C, o_c, C)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        out = tl.dot(S * M, bv, input_precision="tf32x3")
        if SKIP:        # + D v (Mamba's skip, one D per sequence and head)
            out += tl.load(dsk + b * H + h) * bv
        oo = o + _voff(b, h, n, so, o_c, o_v)
        if ACC:
            out += tl.load(oo, mask=mv[None, :], other=0.)
        tl.store(oo, out, mask=mv[None, :])


@triton.jit
def _bwd_kernel(q, k, v, gc, ks, dsk, do, dq, dk, dv, dvp, dgc, dks, ddsk, H, N, K, V,
                svb, svh, svn, svc, sdb, sdh, sdn, sdc, sob, soh, son, soc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ACC: tl.constexpr, SKIP: tl.constexpr):
    """The within-chunk part's gradients (and the skip's with ``SKIP``); with ``ACC`` added to the
    inter-chunk parts: dq, dk, dgc, dks as they hold them, the value gradient's from ``dvp`` (float32,
    (B, H, N, C, V) contiguous)."""
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, sd, so = (svb, svh, svn, svc), (sdb, sdh, sdn, sdc), (sob, soh, son, soc)
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = tl.dot(bq, tl.trans(bk), input_precision="tf32x3")
    dS = tl.zeros([C, C], tl.float32)
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        E, M = _decay(gc, ks, bh * C, o_c, C)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        bdv = tl.dot(tl.trans(S * M), bdo, input_precision="tf32x3")
        dA = tl.dot(bdo, tl.trans(bv), input_precision="tf32x3")           # (C, C): do_t . v_s
        dS += dA * M
        dM = dA * S
        P = dM * M
        bdg = tl.sum(P, axis=1) - tl.sum(P, axis=0)
        bdks = tl.sum(dM * E, axis=0)
        if SKIP:
            bdv += tl.load(dsk + b * H + h) * bdo
            tl.store(ddsk + bh, tl.sum(tl.sum(bdo * bv, axis=1), axis=0))     # summed over the chunks outside
        if ACC:
            bdv += tl.load(dvp + (bh * C + o_c)[:, None] * V + o_v[None, :], mask=mv[None, :], other=0.)
            bdg += tl.load(dgc + bh * C + o_c)
            bdks += tl.load(dks + bh * C + o_c)
        tl.store(dv + _voff(b, h, n, so, o_c, o_v), bdv.to(dv.dtype.element_ty), mask=mv[None, :])
        tl.store(dgc + bh * C + o_c, bdg)
        tl.store(dks + bh * C + o_c, bdks)
    bdq = tl.dot(dS, bk, input_precision="tf32x3")
    bdk = tl.dot(tl.trans(dS), bq, input_precision="tf32x3")
    if ACC:
        bdq += tl.load(dq + qk, mask=mk[None, :], other=0.)
        bdk += tl.load(dk + qk, mask=mk[None, :], other=0.)
    tl.store(dq + qk, bdq, mask=mk[None, :])
    tl.store(dk + qk, bdk, mask=mk[None, :])


@triton.jit
def _states_kernel(q, k, v, gc, ks, es, o, H, N, K, V, svb, svh, svn, svc, sob, soh, son, soc,
                   C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """One (sequence, head), the chunks in order: es[n] (K x V), the state entering chunk n (es[0] = 0,
    es[n + 1] = exp(g_last[n]) es[n] + k[n]ᵀ (u[n] v[n]), u_s = exp(g_last - g_s) ks_s), and the
    inter-chunk part of the output, o[n] = exp(g) q[n] es[n] (written, for ``_fwd_kernel`` to add to)."""
    b, h = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, so = (svb, svh, svn, svc), (sob, soh, son, soc)
    last = o_c == C - 1
    st = tl.zeros([BK, BV], tl.float32)
    for n in range(N):
        bh = ((b * H + h) * N + n).to(tl.int64)
        eo = (bh * K + o_k)[:, None] * V + o_v[None, :]
        tl.store(es + eo, st, mask=mk[:, None] & mv[None, :])
        g = tl.load(gc + bh * C + o_c)
        qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
        bq = tl.load(q + qk, mask=mk[None, :], other=0.)
        tl.store(o + _voff(b, h, n, so, o_c, o_v), tl.exp(g)[:, None] * tl.dot(bq, st, input_precision="tf32x3"),
                 mask=mv[None, :])
        if n < N - 1:
            s = tl.load(ks + bh * C + o_c)
            gl = tl.sum(tl.where(last, g, 0.), axis=0)
            bk = tl.load(k + qk, mask=mk[None, :], other=0.)
            bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
            st = st * tl.exp(gl) + tl.dot(tl.trans(bk), bv * (tl.exp(gl - g) * s)[:, None], input_precision="tf32x3")


@triton.jit
def _dstates_kernel(q, k, v, gc, ks, es, do, dst, dvp, dgc, dks, H, N, K, V, svb, svh, svn, svc, sdb, sdh, sdn, sdc,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Backward of ``_states_kernel`` for one (sequence, head), the chunks in reverse. G, the gradient of
    es[n + 1], is that of chunk n's state: its value, key-scale and log-decay parts are written (``dvp``
    float32 (B, H, N, C, V) contiguous, dgc, dks), with those of the output's read of es[n] and of the
    decay exp(g_last[n]) that carries es[n]; then G <- exp(g_last[n]) G + q[n]ᵀ (exp(g) do[n]). The
    key's part, summed over the heads, is ``_dqk_kernel``'s, from G written as ``dst[n]``."""
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
        bq = tl.load(q + qk, mask=mk[None, :], other=0.)
        bk = tl.load(k + qk, mask=mk[None, :], other=0.)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        be = tl.load(es + eo, mask=em, other=0.)
        tl.store(dst + eo, G, mask=em)
        fs = tl.exp(g)
        w = tl.exp(gl - g)
        u = w * s
        kd = tl.dot(bk, G, input_precision="tf32x3")                          # (C, V)
        du = tl.sum(bv * kd, axis=1)
        bdg = fs * tl.sum(bdo * tl.dot(bq, be, input_precision="tf32x3"), axis=1) - du * u
        dgl = tl.sum(du * u, axis=0) + tl.exp(gl) * tl.sum(tl.sum(G * be, axis=1), axis=0)
        tl.store(dvp + (bh * C + o_c)[:, None] * V + o_v[None, :], u[:, None] * kd, mask=mv[None, :])
        tl.store(dgc + bh * C + o_c, bdg + tl.where(last, dgl, 0.))
        tl.store(dks + bh * C + o_c, du * w)
        G = G * tl.exp(gl) + tl.dot(tl.trans(bq), bdo * fs[:, None], input_precision="tf32x3")


@triton.jit
def _dqk_kernel(gc, ks, v, es, dst, do, dq, dk, H, N, K, V, svb, svh, svn, svc, sdb, sdh, sdn, sdc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The inter-chunk parts of dq and dk for one (sequence, chunk), summed over the heads:
    dq = exp(g) do es[n]ᵀ, dk = (u v) dst[n]ᵀ (dst[n] the gradient of chunk n's state)."""
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
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.).to(tl.float32)
        bdq += tl.dot(bdo * tl.exp(g)[:, None], tl.trans(tl.load(es + eo, mask=em, other=0.)), input_precision="tf32x3")
        bdk += tl.dot(bv * (tl.exp(gl - g) * s)[:, None], tl.trans(tl.load(dst + eo, mask=em, other=0.)),
                      input_precision="tf32x3")
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    tl.store(dq + qk, bdq, mask=mk[None, :])
    tl.store(dk + qk, bdk, mask=mk[None, :])


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
        _states_kernel[(B, H)](q, k, v, gc, ks, es, o, H, N, K, V, *_strides(v), *_strides(o), C=C, BK=BK, BV=BV,
                               num_warps=8)
    _fwd_kernel[(B, N)](q, k, v, gc, ks, o if skip is None else skip, o, H, N, K, V, *_strides(v), *_strides(o),
                        C=C, BK=BK, BV=BV, ACC=inter, SKIP=skip is not None, num_warps=8)
    return o, es


def backward(q, k, v, gc, ks, do, es=None, skip=None):
    """Gradients of q, k, v (in v's dtype, its memory ordered as v's), gc, ks and skip (None without);
    ``es`` from ``forward`` (None: the within-chunk part only)."""
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
    dvp = dq
    if inter:       # the inter-chunk parts first: per (sequence, head) over the chunks, then dq, dk per chunk
        dst, dvp = torch.empty_like(es), q.new_empty(B, H, N, C, V)
        _dstates_kernel[(B, H)](q, k, v, gc, ks, es, do, dst, dvp, dgc, dks, H, N, K, V, *_strides(v), *_strides(do),
                                C=C, BK=BK, BV=BV, num_warps=8)
        _dqk_kernel[(B, N)](gc, ks, v, es, dst, do, dq, dk, H, N, K, V, *_strides(v), *_strides(do),
                            C=C, BK=BK, BV=BV, num_warps=8)
    dsk = None if skip is None else gc.new_empty(B, H, N)
    _bwd_kernel[(B, N)](q, k, v, gc, ks, dq if skip is None else skip, do, dq, dk, dv, dvp, dgc, dks,
                        dq if skip is None else dsk, H, N, K, V, *_strides(v), *_strides(do), *_strides(dv),
                        C=C, BK=BK, BV=BV, ACC=inter, SKIP=skip is not None, num_warps=8)
    return dq, dk, dv, dgc, dks, None if skip is None else dsk.sum(-1)
