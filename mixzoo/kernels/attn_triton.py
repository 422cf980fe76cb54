"""The Triton kernels behind ``mixzoo.kernels.attn`` (imported only when they are to run): causal softmax
attention for heads of at most 16 dims, forward and backward.

The algorithm is FlashAttention-2's (online softmax over key tiles forward; backward with the row sums
δ = rowsum(o ∘ do), one kernel over key tiles for dk, dv and one over query tiles for dq, each recomputing
the probabilities from the forward's log-sum-exp), in base 2 with the scale folded into the scores. What is
particular: heads are loaded at their width D and padded with zeros in registers to DP = 16 (``tl.dot``'s
least K), so nothing is padded in memory; q, k, v are read through their strides (the projection's views);
the tiles of the causal prefix below the diagonal run without a mask, the diagonal ones with it.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_rows(X, rows, T, offs_d, D: tl.constexpr, st):
    return tl.load(X + rows.to(tl.int64)[:, None] * st + offs_d[None, :],
                   mask=(rows < T)[:, None] & (offs_d < D)[None, :], other=0.0)


@triton.jit
def _fwd_kernel(Q, K, V, OUT, LSE, T, H, sc2,
                sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                D: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, VEC: tl.constexpr):
    """One tile of BM query rows of one (sequence, head): o (B, T, H, D) contiguous, LSE (B·H, T) base 2. The strides
    come in units of VEC elements (``attn._launch_fwd``)."""
    sqb, sqh, sqt, skb, skh, skt = sqb * VEC, sqh * VEC, sqt * VEC, skb * VEC, skh * VEC, skt * VEC
    svb, svh, svt = svb * VEC, svh * VEC, svt * VEC
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)       # longest rows first
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    Qb, Kb, Vb = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, DP)
    q = _load_rows(Qb, offs_m, T, offs_d, D, sqt)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DP], tl.float32)
    lo = pid_m * BM                                   # keys below the tile's first row: no mask (BM % BN == 0)
    for start in range(0, lo, BN):
        offs_n = start + tl.arange(0, BN)
        k = _load_rows(Kb, offs_n, T, offs_d, D, skt)
        v = _load_rows(Vb, offs_n, T, offs_d, D, svt)
        s = tl.dot(q, tl.trans(k)) * sc2
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    for start in range(lo, tl.minimum(lo + BM, T), BN):   # the diagonal: causal mask
        offs_n = start + tl.arange(0, BN)
        k = _load_rows(Kb, offs_n, T, offs_d, D, skt)
        v = _load_rows(Vb, offs_n, T, offs_d, D, svt)
        s = tl.dot(q, tl.trans(k)) * sc2
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))        # finite: row i sees key i
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    l_i = tl.where(l_i > 0, l_i, 1.0)                 # rows past T
    o = acc / l_i[:, None]
    rmask = offs_m < T
    dst = OUT + ((b * T + offs_m.to(tl.int64)) * H + h)[:, None] * D + offs_d[None, :]
    tl.store(dst, o.to(OUT.dtype.element_ty), mask=rmask[:, None] & (offs_d < D)[None, :])
    tl.store(LSE + bh.to(tl.int64) * T + offs_m, m_i + tl.math.log2(l_i), mask=rmask)


@triton.jit
def _delta_kernel(OUT, DO, DELTA, T, H, sdb, sdt, sdh, D: tl.constexpr, DP: tl.constexpr, BT: tl.constexpr,
                  VEC: tl.constexpr):
    """δ = rowsum(o ∘ do) in float32, into (B·H, T); o (B, T, H, D) contiguous, do at strides (sdb, sdt, sdh, 1)
    in units of VEC."""
    sdb, sdt, sdh = sdb * VEC, sdt * VEC, sdh * VEC
    bh, tb = tl.program_id(0), tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    t = tb * BT + tl.arange(0, BT)
    offs_d = tl.arange(0, DP)
    m = (t < T)[:, None] & (offs_d < D)[None, :]
    o = tl.load(OUT + ((b * T + t.to(tl.int64)) * H + h)[:, None] * D + offs_d[None, :], mask=m, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + t.to(tl.int64)[:, None] * sdt + offs_d[None, :], mask=m, other=0.0)
    tl.store(DELTA + bh.to(tl.int64) * T + t, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=t < T)


@triton.jit
def _dkdv_tile(k, v, Qb, DOb, LSEb, DELb, start, offs_n, T, sqt, sdt, sc2, dk, dv, offs_d,
               D: tl.constexpr, BM: tl.constexpr, MASK: tl.constexpr):
    offs_m = start + tl.arange(0, BM)
    q = _load_rows(Qb, offs_m, T, offs_d, D, sqt)
    do = _load_rows(DOb, offs_m, T, offs_d, D, sdt)
    lse = tl.load(LSEb + offs_m, mask=offs_m < T, other=float("inf"))    # rows past T: p = 0
    dl = tl.load(DELb + offs_m, mask=offs_m < T, other=0.0)
    pT = tl.math.exp2(tl.dot(k, tl.trans(q)) * sc2 - lse[None, :])        # (BN, BM): keys x queries
    if MASK:
        pT = tl.where(offs_n[:, None] <= offs_m[None, :], pT, 0.0)
    dv = tl.dot(pT.to(do.dtype), do, dv)
    dpT = tl.dot(v, tl.trans(do))
    dsT = pT * (dpT - dl[None, :])
    dk = tl.dot(dsT.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, T, H, sc2, scale,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                 D: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, VEC: tl.constexpr):
    """One tile of BN keys of one (sequence, head) over the queries at and after it: dk, dv (B, T, H, D)."""
    sqb, sqh, sqt, skb, skh, skt = sqb * VEC, sqh * VEC, sqt * VEC, skb * VEC, skh * VEC, skt * VEC
    svb, svh, svt, sdb, sdh, sdt = svb * VEC, svh * VEC, svt * VEC, sdb * VEC, sdh * VEC, sdt * VEC
    pid_n = tl.program_id(0)                          # (the first key tiles see the most queries)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    Qb, Kb, Vb, DOb = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh, DO + b * sdb + h * sdh
    LSEb, DELb = LSE + bh.to(tl.int64) * T, DELTA + bh.to(tl.int64) * T
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, DP)
    k = _load_rows(Kb, offs_n, T, offs_d, D, skt)
    v = _load_rows(Vb, offs_n, T, offs_d, D, svt)
    dk = tl.zeros([BN, DP], tl.float32)
    dv = tl.zeros([BN, DP], tl.float32)
    n0 = pid_n * BN
    for start in range(n0, tl.minimum(n0 + BN, T), BM):        # the diagonal (BN % BM == 0): causal mask
        dk, dv = _dkdv_tile(k, v, Qb, DOb, LSEb, DELb, start, offs_n, T, sqt, sdt, sc2, dk, dv, offs_d, D, BM, True)
    for start in range(n0 + BN, T, BM):
        dk, dv = _dkdv_tile(k, v, Qb, DOb, LSEb, DELb, start, offs_n, T, sqt, sdt, sc2, dk, dv, offs_d, D, BM, False)
    rmask = (offs_n < T)[:, None] & (offs_d < D)[None, :]
    dst = ((b * T + offs_n.to(tl.int64)) * H + h)[:, None] * D + offs_d[None, :]
    tl.store(DK + dst, (dk * scale).to(DK.dtype.element_ty), mask=rmask)
    tl.store(DV + dst, dv.to(DV.dtype.element_ty), mask=rmask)


@triton.jit
def _dq_tile(q, do, lse, dl, Kb, Vb, start, offs_m, T, skt, svt, sc2, dq, offs_d,
             D: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr):
    offs_n = start + tl.arange(0, BN)
    k = _load_rows(Kb, offs_n, T, offs_d, D, skt)
    v = _load_rows(Vb, offs_n, T, offs_d, D, svt)
    p = tl.math.exp2(tl.dot(q, tl.trans(k)) * sc2 - lse[:, None])
    if MASK:
        p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - dl[:, None])
    return tl.dot(ds.to(k.dtype), k, dq)


@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, T, H, sc2, scale,
               sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
               D: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, VEC: tl.constexpr):
    """One tile of BM query rows of one (sequence, head) over its causal prefix: dq (B, T, H, D)."""
    sqb, sqh, sqt, skb, skh, skt = sqb * VEC, sqh * VEC, sqt * VEC, skb * VEC, skh * VEC, skt * VEC
    svb, svh, svt, sdb, sdh, sdt = svb * VEC, svh * VEC, svt * VEC, sdb * VEC, sdh * VEC, sdt * VEC
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    Qb, Kb, Vb, DOb = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh, DO + b * sdb + h * sdh
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, DP)
    q = _load_rows(Qb, offs_m, T, offs_d, D, sqt)
    do = _load_rows(DOb, offs_m, T, offs_d, D, sdt)
    lse = tl.load(LSE + bh.to(tl.int64) * T + offs_m, mask=offs_m < T, other=float("inf"))
    dl = tl.load(DELTA + bh.to(tl.int64) * T + offs_m, mask=offs_m < T, other=0.0)
    dq = tl.zeros([BM, DP], tl.float32)
    lo = pid_m * BM
    for start in range(0, lo, BN):                    # BM % BN == 0
        dq = _dq_tile(q, do, lse, dl, Kb, Vb, start, offs_m, T, skt, svt, sc2, dq, offs_d, D, BN, False)
    for start in range(lo, tl.minimum(lo + BM, T), BN):
        dq = _dq_tile(q, do, lse, dl, Kb, Vb, start, offs_m, T, skt, svt, sc2, dq, offs_d, D, BN, True)
    dst = ((b * T + offs_m.to(tl.int64)) * H + h)[:, None] * D + offs_d[None, :]
    tl.store(DQ + dst, (dq * scale).to(DQ.dtype.element_ty), mask=(offs_m < T)[:, None] & (offs_d < D)[None, :])
