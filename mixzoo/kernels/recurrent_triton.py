"""The Triton kernels behind ``mixzoo.kernels.recurrent`` (imported only when they are to run).

One program per (sequence, block of BH heads) walks the sequence one position at a time with the BH states
(BV x BK each, float32) in registers: at a head of 8 a state is 64 floats, so a step is a few hundred flops for
the block and the walk is bound by its loads (q, k, v, g, β of one position: the heads of a position lie side by
side in memory, one coalesced row). Chunked kernels (fla's) turn the scan into matmuls, which pays only where a
head is wide enough to feed tensor cores; at heads of 8 they run a dozen launches of mostly idle tiles.

Forward (``_delta_fwd_kernel``): per position, q̂, k̂ = q / ‖q‖, k / ‖k‖ (``L2``), a = exp(g),
    u = v - a S k̂,  S ← a S + β u k̂ᵀ,  o = scale · S q̂,
and, where a backward will follow (``STORE``), the state after the step to ``states`` (B, T, H, DV, DK) float32.

Backward (``_delta_bwd_kernel``): the same walk backwards in time with the state's gradient dS carried in registers and
S_{t-1} read back from ``states``:
    G = dS + scale · do q̂ᵀ,  dq̂ = scale · S_tᵀ do,  u = v - a S_{t-1} k̂,  du = β G k̂ (= dv),
    dβ = uᵀ G k̂,  dk̂ = β Gᵀ u - a S_{t-1}ᵀ du,  da = <G, S_{t-1}> - duᵀ S_{t-1} k̂,  dg = a · da,
    dS ← a (G - du k̂ᵀ),
then the L2 norm's backward, dq = (dq̂ - q̂ (q̂·dq̂)) / ‖q‖ (dq̂ / eps where ‖q‖ <= eps), likewise dk.

GLA (``_gla_fwd_kernel``, ``_gla_bwd_kernel``), a log-decay per key dimension g (B, T, H, DK):
    S ← S diag(exp g) + v kᵀ,  o = scale · S q;
backwards, with P = S_{t-1}:  G = dS + scale · do qᵀ,  dq = scale · S_tᵀ do,  dv = G k,  dk = Gᵀ v,
    dg = exp(g) ⊙ colsum(G ⊙ P),  dS ← G diag(exp g)."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _unit(x, eps, L2: tl.constexpr):
    """x / max(‖x‖, eps) over the last axis (F.normalize) and the norm used, or x and 1."""
    if L2:
        n = tl.maximum(tl.sqrt(tl.sum(x * x, 1)), eps)
        return x / n[:, None], n
    else:
        return x, tl.full([x.shape[0]], 1.0, tl.float32)


@triton.jit
def _unit_bwd(xh, n, dxh, eps, L2: tl.constexpr):
    if L2:
        # F.normalize's gradient: the projection off x̂ where the norm is above eps, else a plain 1 / eps
        proj = dxh - xh * tl.sum(xh * dxh, 1)[:, None]
        return tl.where((n > eps)[:, None], proj, dxh) / n[:, None]
    else:
        return dxh


@triton.jit
def _ld4(qp, kp, vp, gp, t, sqt, skt, svt, sgt, mk, mv, mg, ok):
    """q, k, v (BH, D) and g ((BH,) or GLA's (BH, BK)) of position t in float32 (zeros where not ``ok``)."""
    qt = tl.load(qp + t * sqt, mask=mk & ok, other=0.).to(tl.float32)
    kt = tl.load(kp + t * skt, mask=mk & ok, other=0.).to(tl.float32)
    vt = tl.load(vp + t * svt, mask=mv & ok, other=0.).to(tl.float32)
    gt = tl.load(gp + t * sgt, mask=mg & ok, other=0.).to(tl.float32)
    return qt, kt, vt, gt


@triton.jit
def _ld5(qp, kp, vp, gp, bp, t, sqt, skt, svt, sgt, sbt, mk, mv, mh, ok):
    """``_ld4`` and β (BH,)."""
    qt, kt, vt, gt = _ld4(qp, kp, vp, gp, t, sqt, skt, svt, sgt, mk, mv, mh, ok)
    return qt, kt, vt, gt, tl.load(bp + t * sbt, mask=mh & ok, other=0.).to(tl.float32)


@triton.jit
def _delta_fwd_kernel(q, k, v, g, beta, o, states, T, H,
                sqb, sqt, sqh, sqd, skb, skt, skh, skd, svb, svt, svh, svd, sgb, sgt, sgh, sbb, sbt, sbh,
                scale, eps,
                DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BH: tl.constexpr,
                L2: tl.constexpr, STORE: tl.constexpr, PF: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    ik, iv = tl.arange(0, BK), tl.arange(0, BV)
    mh = h < H
    mk = mh[:, None] & (ik < DK)[None, :]
    mv = mh[:, None] & (iv < DV)[None, :]
    ms = mv[:, :, None] & (ik < DK)[None, None, :]
    qp = q + b * sqb + h[:, None] * sqh + ik[None, :] * sqd
    kp = k + b * skb + h[:, None] * skh + ik[None, :] * skd
    vp = v + b * svb + h[:, None] * svh + iv[None, :] * svd
    gp = g + b * sgb + h * sgh
    bp = beta + b * sbb + h * sbh
    op = o + b * T * H * DV + h[:, None] * DV + iv[None, :]
    sp = states + b * T * H * DV * DK + (h[:, None, None] * DV + iv[None, :, None]) * DK + ik[None, None, :]
    S = tl.zeros([BH, BV, BK], tl.float32)
    t = T * 0
    qn, kn, vn, gn, bn = _ld5(qp, kp, vp, gp, bp, t, sqt, skt, svt, sgt, sbt, mk, mv, mh, t < T)
    while t < T:       # a while loop: Triton's interpreter (the CPU tests) cannot range over a runtime bound
        if PF:         # this step's inputs were loaded during the last; load the next step's now
            qt, kt, vt, gt, bt = qn, kn, vn, gn, bn
            qn, kn, vn, gn, bn = _ld5(qp, kp, vp, gp, bp, t + 1, sqt, skt, svt, sgt, sbt, mk, mv, mh, t + 1 < T)
        else:
            qt, kt, vt, gt, bt = _ld5(qp, kp, vp, gp, bp, t, sqt, skt, svt, sgt, sbt, mk, mv, mh, t < T)
        a = tl.exp(gt)
        qt, _ = _unit(qt, eps, L2)
        kt, _ = _unit(kt, eps, L2)
        u = vt - a[:, None] * tl.sum(S * kt[:, None, :], 2)
        S = a[:, None, None] * S + (bt[:, None] * u)[:, :, None] * kt[:, None, :]
        ot = tl.sum(S * qt[:, None, :], 2) * scale
        tl.store(op + t * H * DV, ot.to(o.dtype.element_ty), mask=mv)
        if STORE:
            tl.store(sp + t * H * DV * DK, S, mask=ms)
        t += 1


@triton.jit
def _delta_bwd_kernel(q, k, v, g, beta, do, states, dq, dk, dv, dg, dbeta, T, H,
                sqb, sqt, sqh, sqd, skb, skt, skh, skd, svb, svt, svh, svd, sgb, sgt, sgh, sbb, sbt, sbh,
                scale, eps,
                DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BH: tl.constexpr,
                L2: tl.constexpr, PF: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    ik, iv = tl.arange(0, BK), tl.arange(0, BV)
    mh = h < H
    mk = mh[:, None] & (ik < DK)[None, :]
    mv = mh[:, None] & (iv < DV)[None, :]
    ms = mv[:, :, None] & (ik < DK)[None, None, :]
    qp = q + b * sqb + h[:, None] * sqh + ik[None, :] * sqd
    kp = k + b * skb + h[:, None] * skh + ik[None, :] * skd
    vp = v + b * svb + h[:, None] * svh + iv[None, :] * svd
    gp = g + b * sgb + h * sgh
    bp = beta + b * sbb + h * sbh
    # do, dq, dk, dv, dg, dbeta: contiguous (B, T, H, D) / (B, T, H)
    kvo = b * T * H * DV + h[:, None] * DV + iv[None, :]
    kko = b * T * H * DK + h[:, None] * DK + ik[None, :]
    gho = b * T * H + h
    sp = states + b * T * H * DV * DK + (h[:, None, None] * DV + iv[None, :, None]) * DK + ik[None, None, :]
    S = tl.load(sp + (T - 1) * H * DV * DK, mask=ms, other=0.)
    dS = tl.zeros([BH, BV, BK], tl.float32)
    t = T - 1
    qn, kn, vn, gn, bn = _ld5(qp, kp, vp, gp, bp, t, sqt, skt, svt, sgt, sbt, mk, mv, mh, t >= 0)
    don = tl.load(do + kvo + t * H * DV, mask=mv & (t >= 0), other=0.).to(tl.float32)
    Pn = tl.load(sp + (t - 1) * H * DV * DK, mask=ms & (t > 0), other=0.)
    while t >= 0:
        if PF:         # this step's inputs were loaded during the last; load the next step's (t - 1) now
            qt, kt, vt, gt, bt, dot, P = qn, kn, vn, gn, bn, don, Pn
            qn, kn, vn, gn, bn = _ld5(qp, kp, vp, gp, bp, t - 1, sqt, skt, svt, sgt, sbt, mk, mv, mh, t >= 1)
            don = tl.load(do + kvo + (t - 1) * H * DV, mask=mv & (t >= 1), other=0.).to(tl.float32)
            Pn = tl.load(sp + (t - 2) * H * DV * DK, mask=ms & (t > 1), other=0.)
        else:
            qt, kt, vt, gt, bt = _ld5(qp, kp, vp, gp, bp, t, sqt, skt, svt, sgt, sbt, mk, mv, mh, t >= 0)
            dot = tl.load(do + kvo + t * H * DV, mask=mv, other=0.).to(tl.float32)
            P = tl.load(sp + (t - 1) * H * DV * DK, mask=ms & (t > 0), other=0.)
        a = tl.exp(gt)
        qh, nq = _unit(qt, eps, L2)
        kh, nk = _unit(kt, eps, L2)
        G = dS + (scale * dot)[:, :, None] * qh[:, None, :]
        dqh = scale * tl.sum(S * dot[:, :, None], 1)
        Pk = tl.sum(P * kh[:, None, :], 2)
        u = vt - a[:, None] * Pk
        Gk = tl.sum(G * kh[:, None, :], 2)
        du = bt[:, None] * Gk
        dkh = bt[:, None] * tl.sum(G * u[:, :, None], 1) - a[:, None] * tl.sum(P * du[:, :, None], 1)
        da = tl.sum(tl.sum(G * P, 2), 1) - tl.sum(du * Pk, 1)
        tl.store(dq + kko + t * H * DK, _unit_bwd(qh, nq, dqh, eps, L2).to(dq.dtype.element_ty), mask=mk)
        tl.store(dk + kko + t * H * DK, _unit_bwd(kh, nk, dkh, eps, L2).to(dk.dtype.element_ty), mask=mk)
        tl.store(dv + kvo + t * H * DV, du.to(dv.dtype.element_ty), mask=mv)
        tl.store(dg + gho + t * H, (a * da).to(dg.dtype.element_ty), mask=mh)
        tl.store(dbeta + gho + t * H, tl.sum(u * Gk, 1).to(dbeta.dtype.element_ty), mask=mh)
        dS = a[:, None, None] * (G - du[:, :, None] * kh[:, None, :])
        S = P
        t -= 1


@triton.jit
def _gla_fwd_kernel(q, k, v, g, o, states, T, H,
                    sqb, sqt, sqh, sqd, skb, skt, skh, skd, svb, svt, svh, svd, sgb, sgt, sgh, sgd,
                    scale,
                    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BH: tl.constexpr,
                    STORE: tl.constexpr, PF: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    ik, iv = tl.arange(0, BK), tl.arange(0, BV)
    mh = h < H
    mk = mh[:, None] & (ik < DK)[None, :]
    mv = mh[:, None] & (iv < DV)[None, :]
    ms = mv[:, :, None] & (ik < DK)[None, None, :]
    qp = q + b * sqb + h[:, None] * sqh + ik[None, :] * sqd
    kp = k + b * skb + h[:, None] * skh + ik[None, :] * skd
    vp = v + b * svb + h[:, None] * svh + iv[None, :] * svd
    gp = g + b * sgb + h[:, None] * sgh + ik[None, :] * sgd
    op = o + b * T * H * DV + h[:, None] * DV + iv[None, :]
    sp = states + b * T * H * DV * DK + (h[:, None, None] * DV + iv[None, :, None]) * DK + ik[None, None, :]
    S = tl.zeros([BH, BV, BK], tl.float32)
    t = T * 0
    qn, kn, vn, gn = _ld4(qp, kp, vp, gp, t, sqt, skt, svt, sgt, mk, mv, mk, t < T)
    while t < T:
        if PF:
            qt, kt, vt, gt = qn, kn, vn, gn
            qn, kn, vn, gn = _ld4(qp, kp, vp, gp, t + 1, sqt, skt, svt, sgt, mk, mv, mk, t + 1 < T)
        else:
            qt, kt, vt, gt = _ld4(qp, kp, vp, gp, t, sqt, skt, svt, sgt, mk, mv, mk, t < T)
        a = tl.exp(gt)
        S = S * a[:, None, :] + vt[:, :, None] * kt[:, None, :]
        ot = tl.sum(S * qt[:, None, :], 2) * scale
        tl.store(op + t * H * DV, ot.to(o.dtype.element_ty), mask=mv)
        if STORE:
            tl.store(sp + t * H * DV * DK, S, mask=ms)
        t += 1


@triton.jit
def _gla_bwd_kernel(q, k, v, g, do, states, dq, dk, dv, dg, T, H,
                    sqb, sqt, sqh, sqd, skb, skt, skh, skd, svb, svt, svh, svd, sgb, sgt, sgh, sgd,
                    scale,
                    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BH: tl.constexpr,
                    PF: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    ik, iv = tl.arange(0, BK), tl.arange(0, BV)
    mh = h < H
    mk = mh[:, None] & (ik < DK)[None, :]
    mv = mh[:, None] & (iv < DV)[None, :]
    ms = mv[:, :, None] & (ik < DK)[None, None, :]
    qp = q + b * sqb + h[:, None] * sqh + ik[None, :] * sqd
    kp = k + b * skb + h[:, None] * skh + ik[None, :] * skd
    vp = v + b * svb + h[:, None] * svh + iv[None, :] * svd
    gp = g + b * sgb + h[:, None] * sgh + ik[None, :] * sgd
    # do, dq, dk, dv, dg: contiguous (B, T, H, D)
    kvo = b * T * H * DV + h[:, None] * DV + iv[None, :]
    kko = b * T * H * DK + h[:, None] * DK + ik[None, :]
    sp = states + b * T * H * DV * DK + (h[:, None, None] * DV + iv[None, :, None]) * DK + ik[None, None, :]
    S = tl.load(sp + (T - 1) * H * DV * DK, mask=ms, other=0.)
    dS = tl.zeros([BH, BV, BK], tl.float32)
    t = T - 1
    qn, kn, vn, gn = _ld4(qp, kp, vp, gp, t, sqt, skt, svt, sgt, mk, mv, mk, t >= 0)
    don = tl.load(do + kvo + t * H * DV, mask=mv & (t >= 0), other=0.).to(tl.float32)
    Pn = tl.load(sp + (t - 1) * H * DV * DK, mask=ms & (t > 0), other=0.)
    while t >= 0:
        if PF:
            qt, kt, vt, gt, dot, P = qn, kn, vn, gn, don, Pn
            qn, kn, vn, gn = _ld4(qp, kp, vp, gp, t - 1, sqt, skt, svt, sgt, mk, mv, mk, t >= 1)
            don = tl.load(do + kvo + (t - 1) * H * DV, mask=mv & (t >= 1), other=0.).to(tl.float32)
            Pn = tl.load(sp + (t - 2) * H * DV * DK, mask=ms & (t > 1), other=0.)
        else:
            qt, kt, vt, gt = _ld4(qp, kp, vp, gp, t, sqt, skt, svt, sgt, mk, mv, mk, t >= 0)
            dot = tl.load(do + kvo + t * H * DV, mask=mv, other=0.).to(tl.float32)
            P = tl.load(sp + (t - 1) * H * DV * DK, mask=ms & (t > 0), other=0.)
        a = tl.exp(gt)
        G = dS + (scale * dot)[:, :, None] * qt[:, None, :]
        tl.store(dq + kko + t * H * DK, (scale * tl.sum(S * dot[:, :, None], 1)).to(dq.dtype.element_ty), mask=mk)
        tl.store(dk + kko + t * H * DK, tl.sum(G * vt[:, :, None], 1).to(dk.dtype.element_ty), mask=mk)
        tl.store(dv + kvo + t * H * DV, tl.sum(G * kt[:, None, :], 2).to(dv.dtype.element_ty), mask=mv)
        tl.store(dg + kko + t * H * DK, (a * tl.sum(G * P, 1)).to(dg.dtype.element_ty), mask=mk)
        dS = G * a[:, None, :]
        S = P
        t -= 1


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


#: the tiling of each op by default: (floats of state per program, warps per program, prefetch the next position's
#: inputs during a step). Chosen by benchmarks/recurrent_tiles.py on an H200 (2026-12-05, benchmarks/h200-2026-12-05c:
#: at 768 sequences of 1024, 16 heads, forward + backward: the delta rule 13.5 -> 4.6 ms with one warp a program and
#: prefetch, GLA 5.7 -> 2.9 ms with 8 heads a program, one warp and prefetch)
TILES = {"delta": (1024, 1, True), "gla": (256, 1, True)}
#: the tiling of both before benchmarks/recurrent_tiles.py chose ``TILES`` (MIXZOO_REC_TILES=old, for timing the
#: one against the other in a step)
OLD_TILES = (1024, 4, False)


def _tiling(op: str, H: int, DK: int, DV: int, tiles=None) -> tuple[int, int, int, int, bool]:
    """(BK, BV, BH, warps, prefetch) of ``op`` ("delta" or "gla"): heads per program so that a block's states are
    about ``tiles[0]`` floats (``TILES[op]`` by default); fewer warps where a block is smaller than 256 floats a
    warp."""
    floats, warps, pf = tiles or (OLD_TILES if os.environ.get("MIXZOO_REC_TILES") == "old" else TILES[op])
    BK, BV = _pow2(DK), _pow2(DV)
    BH = max(1, min(_pow2(H), floats // (BK * BV)))
    return BK, BV, BH, max(1, min(warps, BH * BK * BV // 256)), bool(pf)


def delta_forward(q, k, v, g, beta, scale: float, eps: float, l2: bool, store: bool, tiles=None):
    """o (B, T, H, DV) in q's dtype, and the states (B, T, H, DV, DK) float32 where ``store``."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    o = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
    states = torch.empty((B, T, H, DV, DK) if store else (1,), dtype=torch.float32, device=q.device)
    BK, BV, BH, w, pf = _tiling("delta", H, DK, DV, tiles)
    _delta_fwd_kernel[(B, triton.cdiv(H, BH))](
        q, k, v, g, beta, o, states, T, H, *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
        float(scale), float(eps), DK=DK, DV=DV, BK=BK, BV=BV, BH=BH, L2=l2, STORE=store, PF=pf, num_warps=w)
    return o, states


def delta_backward(q, k, v, g, beta, states, do, scale: float, eps: float, l2: bool, tiles=None):
    """dq, dk, dv (in q's, k's, v's dtypes), dg (float32), dβ (β's dtype)."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    do = do.contiguous()
    dq = torch.empty(B, T, H, DK, dtype=q.dtype, device=q.device)
    dk = torch.empty(B, T, H, DK, dtype=k.dtype, device=q.device)
    dv = torch.empty(B, T, H, DV, dtype=v.dtype, device=q.device)
    dg = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    db = torch.empty(B, T, H, dtype=beta.dtype, device=q.device)
    BK, BV, BH, w, pf = _tiling("delta", H, DK, DV, tiles)
    _delta_bwd_kernel[(B, triton.cdiv(H, BH))](
        q, k, v, g, beta, do, states, dq, dk, dv, dg, db, T, H,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
        float(scale), float(eps), DK=DK, DV=DV, BK=BK, BV=BV, BH=BH, L2=l2, PF=pf, num_warps=w)
    return dq, dk, dv, dg, db


def gla_forward(q, k, v, g, scale: float, store: bool, tiles=None):
    """o (B, T, H, DV) in q's dtype, and the states (B, T, H, DV, DK) float32 where ``store``."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    o = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
    states = torch.empty((B, T, H, DV, DK) if store else (1,), dtype=torch.float32, device=q.device)
    BK, BV, BH, w, pf = _tiling("gla", H, DK, DV, tiles)
    _gla_fwd_kernel[(B, triton.cdiv(H, BH))](
        q, k, v, g, o, states, T, H, *q.stride(), *k.stride(), *v.stride(), *g.stride(),
        float(scale), DK=DK, DV=DV, BK=BK, BV=BV, BH=BH, STORE=store, PF=pf, num_warps=w)
    return o, states


def gla_backward(q, k, v, g, states, do, scale: float, tiles=None):
    """dq, dk, dv (in q's, k's, v's dtypes), dg (g's dtype)."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    do = do.contiguous()
    dq = torch.empty(B, T, H, DK, dtype=q.dtype, device=q.device)
    dk = torch.empty(B, T, H, DK, dtype=k.dtype, device=q.device)
    dv = torch.empty(B, T, H, DV, dtype=v.dtype, device=q.device)
    dg = torch.empty(B, T, H, DK, dtype=g.dtype, device=q.device)
    BK, BV, BH, w, pf = _tiling("gla", H, DK, DV, tiles)
    _gla_bwd_kernel[(B, triton.cdiv(H, BH))](
        q, k, v, g, do, states, dq, dk, dv, dg, T, H, *q.stride(), *k.stride(), *v.stride(), *g.stride(),
        float(scale), DK=DK, DV=DV, BK=BK, BV=BV, BH=BH, PF=pf, num_warps=w)
    return dq, dk, dv, dg
