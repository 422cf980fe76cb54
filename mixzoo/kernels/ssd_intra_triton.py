"""The Triton kernels behind ``mixzoo.kernels.ssd_intra`` (imported only when they are to run).

One program per (sequence, chunk) runs over the heads: the chunk's score matrix S = q kᵀ (C x C,
shared by the heads) stays in registers, each head's decay matrix is built from its cumulative
log-decays, and the backward sums dS over the heads before dq = dS k and dk = dSᵀ q. Products of
float32 operands in full float32, two forms (``SPLIT``): ``ieee`` (``input_precision="ieee"``, FMA
products, as the PyTorch form's matmuls; ptxas spills about 1.4 KB per thread) and ``bf16x6`` (each
operand split into three bfloat16 parts, x = h + m + l, and the six products of parts whose sum of
orders is below 3 accumulated in float32 on the tensor cores, smallest first: float32's accuracy,
against float64 as close as ieee; the path fla's bf16 kernels take through the compiler). As three TF32
products (``"tf32x3"``) ptxas reports no spills, but on the H200 with Triton 3.6 the kernels then stopped
with an illegal memory access at chunks of 64 (2026-12-03), as Triton's reports of TF32 wgmma at small N
describe."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import SSD_FORMS as FORMS  # the products' form (module docstring); index = SPLIT


@triton.jit
def _parts(x):
    """x (float32) as three bfloat16 parts h + m + l (each the rounding of what the others leave)."""
    h = x.to(tl.bfloat16)
    r = x - h.to(tl.float32)
    m = r.to(tl.bfloat16)
    return h, m, (r - m.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _dot(a, b, SPLIT: tl.constexpr):
    """a @ b of float32 operands in float32's accuracy: FMA products (ieee), or six bfloat16 products."""
    if SPLIT:
        ah, am, al = _parts(a)
        bh, bm, bl = _parts(b)
        acc = tl.dot(al, bh, out_dtype=tl.float32)
        acc = tl.dot(ah, bl, acc)
        acc = tl.dot(am, bm, acc)
        acc = tl.dot(am, bh, acc)
        acc = tl.dot(ah, bm, acc)
        return tl.dot(ah, bh, acc)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _decay(gc, ks, base_h, o_c, C: tl.constexpr):
    """E (C x C): exp(g_t - g_s) for s <= t, else 0; and E scaled by ks_s (columns)."""
    g = tl.load(gc + base_h + o_c)
    s = tl.load(ks + base_h + o_c)
    keep = o_c[:, None] >= o_c[None, :]
    E = tl.where(keep, tl.exp(tl.where(keep, g[:, None] - g[None, :], 0.)), 0.)
    return E, E * s[None, :]


@triton.jit
def _fwd_kernel(q, k, v, gc, ks, o, H, N, K, V, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                SPLIT: tl.constexpr):
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = _dot(bq, tl.trans(bk), SPLIT)
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        _, M = _decay(gc, ks, bh * C, o_c, C)
        vo = (bh * C + o_c)[:, None] * V + o_v[None, :]
        bv = tl.load(v + vo, mask=mv[None, :], other=0.)
        tl.store(o + vo, _dot(S * M, bv, SPLIT), mask=mv[None, :])


@triton.jit
def _bwd_kernel(q, k, v, gc, ks, do, dq, dk, dv, dgc, dks, H, N, K, V,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SPLIT: tl.constexpr):
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = _dot(bq, tl.trans(bk), SPLIT)
    dS = tl.zeros([C, C], tl.float32)
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        E, M = _decay(gc, ks, bh * C, o_c, C)
        vo = (bh * C + o_c)[:, None] * V + o_v[None, :]
        bv = tl.load(v + vo, mask=mv[None, :], other=0.)
        bdo = tl.load(do + vo, mask=mv[None, :], other=0.)
        tl.store(dv + vo, _dot(tl.trans(S * M), bdo, SPLIT), mask=mv[None, :])
        dA = _dot(bdo, tl.trans(bv), SPLIT)           # (C, C): do_t . v_s
        dS += dA * M
        dM = dA * S
        P = dM * M
        tl.store(dgc + bh * C + o_c, tl.sum(P, axis=1) - tl.sum(P, axis=0))
        tl.store(dks + bh * C + o_c, tl.sum(dM * E, axis=0))
    tl.store(dq + qk, _dot(dS, bk, SPLIT), mask=mk[None, :])
    tl.store(dk + qk, _dot(tl.trans(dS), bq, SPLIT), mask=mk[None, :])


def _blocks(K: int, V: int) -> tuple[int, int]:
    return max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))


def forward(q, k, v, gc, ks, form: str = FORMS[0]):
    """q, k (B, N, C, K); v (B, H, N, C, V); gc, ks (B, H, N, C); all float32 contiguous -> o like v."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    o = torch.empty_like(v)
    BK, BV = _blocks(K, V)
    _fwd_kernel[(B, N)](q, k, v, gc, ks, o, H, N, K, V, C=C, BK=BK, BV=BV,
                        SPLIT=FORMS.index(form), num_warps=8)
    return o


def backward(q, k, v, gc, ks, do, form: str = FORMS[0]):
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dgc, dks = torch.empty_like(gc), torch.empty_like(ks)
    BK, BV = _blocks(K, V)
    _bwd_kernel[(B, N)](q, k, v, gc, ks, do, dq, dk, dv, dgc, dks, H, N, K, V, C=C, BK=BK, BV=BV,
                        SPLIT=FORMS.index(form), num_warps=8)
    return dq, dk, dv, dgc, dks
