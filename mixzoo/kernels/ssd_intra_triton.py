"""The Triton kernels behind ``mixzoo.kernels.ssd_intra`` (imported only when they are to run).

One program per (sequence, chunk) runs over the heads: the chunk's score matrix S = q kᵀ (C x C,
shared by the heads) stays in registers, each head's decay matrix is built from its cumulative
log-decays, and the backward sums dS over the heads before dq = dS k and dk = dSᵀ q. Products of
float32 operands in full float32 (``input_precision="ieee"``), as the PyTorch form's matmuls. (As three
TF32 products, ``"tf32x3"``, ptxas reports no register spills where ieee spills about 1.4 KB per thread, but on
the H200 with Triton 3.6 the kernels then stopped with an illegal memory access at chunks of 64, 2026-12-03.)

``BF16`` (``MIXZOO_SSD_DOT=bf16``, the default): every product's operands rounded to bfloat16 and
accumulated in float32 on the tensor cores, the decays and their products with the scores in float32 before
the rounding, as mamba-ssm's SSD kernels compute in bfloat16 training (there x, B and C are bfloat16, and the
decayed scores are cast to x's type before their product with it). ``ptxas -v`` for sm_90a at the mad recipe:
wgmma, no spills, 124 registers forward, where ieee spills 1.4 KB."""
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
def _mm(a, b, BF16: tl.constexpr):
    """a @ b in float32: the operands in full float32 (FMA), or with ``BF16`` rounded to bfloat16 for the tensor
    cores (float32 accumulation)."""
    if BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _voff(b, h, n, sv, o_c, o_v):
    """Offsets of the (C, BV) value tile of (sequence b, head h, chunk n) in a tensor of strides sv =
    (sequence, head, chunk, position), its value dimension contiguous."""
    return (b.to(tl.int64) * sv[0] + h * sv[1] + n * sv[2]) + o_c[:, None] * sv[3] + o_v[None, :]


@triton.jit
def _fwd_kernel(q, k, v, gc, ks, o, H, N, K, V, svb, svh, svn, svc, sob, soh, son, soc,
                C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BF16: tl.constexpr):
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, so = (svb, svh, svn, svc), (sob, soh, son, soc)
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = _mm(bq, tl.trans(bk), BF16)
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        _, M = _decay(gc, ks, bh * C, o_c, C)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.)
        tl.store(o + _voff(b, h, n, so, o_c, o_v), _mm(S * M, bv, BF16), mask=mv[None, :])


@triton.jit
def _bwd_kernel(q, k, v, gc, ks, do, dq, dk, dv, dgc, dks, H, N, K, V, svb, svh, svn, svc, sdb, sdh, sdn, sdc,
                sob, soh, son, soc, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BF16: tl.constexpr):
    b, n = tl.program_id(0), tl.program_id(1)
    o_c, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = o_k < K, o_v < V
    sv, sd, so = (svb, svh, svn, svc), (sdb, sdh, sdn, sdc), (sob, soh, son, soc)
    qk = ((b * N + n).to(tl.int64) * C + o_c)[:, None] * K + o_k[None, :]
    bq = tl.load(q + qk, mask=mk[None, :], other=0.)
    bk = tl.load(k + qk, mask=mk[None, :], other=0.)
    S = _mm(bq, tl.trans(bk), BF16)
    dS = tl.zeros([C, C], tl.float32)
    for h in range(H):
        bh = ((b * H + h) * N + n).to(tl.int64)
        E, M = _decay(gc, ks, bh * C, o_c, C)
        bv = tl.load(v + _voff(b, h, n, sv, o_c, o_v), mask=mv[None, :], other=0.)
        bdo = tl.load(do + _voff(b, h, n, sd, o_c, o_v), mask=mv[None, :], other=0.)
        tl.store(dv + _voff(b, h, n, so, o_c, o_v), _mm(tl.trans(S * M), bdo, BF16),
                 mask=mv[None, :])
        dA = _mm(bdo, tl.trans(bv), BF16)           # (C, C): do_t . v_s
        dS += dA * M
        dM = dA * S
        P = dM * M
        tl.store(dgc + bh * C + o_c, tl.sum(P, axis=1) - tl.sum(P, axis=0))
        tl.store(dks + bh * C + o_c, tl.sum(dM * E, axis=0))
    tl.store(dq + qk, _mm(dS, bk, BF16), mask=mk[None, :])
    tl.store(dk + qk, _mm(tl.trans(dS), bq, BF16), mask=mk[None, :])


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


FORMS = ("ieee", "bf16")             # the products' forms, as mixzoo.kernels.SSD_FORMS (BF16 = index)


def forward(q, k, v, gc, ks, form: str = FORMS[0]):
    """q, k (B, N, C, K); gc, ks (B, H, N, C), float32 contiguous; v (B, H, N, C, V) float32, any strides
    with the value dimension contiguous (a view of (B, T, H, V) memory is read in place) -> o, its memory
    ordered as v's (``like``)."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    o = like(v)
    BK, BV = _blocks(K, V)
    _fwd_kernel[(B, N)](q, k, v, gc, ks, o, H, N, K, V, *_strides(v), *_strides(o), C=C, BK=BK, BV=BV,
                        BF16=FORMS.index(form), num_warps=8)
    return o


def backward(q, k, v, gc, ks, do, form: str = FORMS[0]):
    """Gradients of ``forward``'s inputs; ``do`` any strides with the value dimension contiguous; dv's memory
    ordered as v's."""
    B, H, N, C, V = v.shape
    K = q.shape[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), like(v)
    dgc, dks = torch.empty_like(gc), torch.empty_like(ks)
    BK, BV = _blocks(K, V)
    _bwd_kernel[(B, N)](q, k, v, gc, ks, do, dq, dk, dv, dgc, dks, H, N, K, V, *_strides(v), *_strides(do),
                        *_strides(dv), C=C, BK=BK, BV=BV, BF16=FORMS.index(form), num_warps=8)
    return dq, dk, dv, dgc, dks
