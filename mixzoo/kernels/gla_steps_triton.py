"""The Triton kernels behind ``mixzoo.kernels.gla_steps`` (imported only when they are to run): steps of fla's
chunked GLA with tiles as narrow as the heads.

One program per (chunk, sequence x head) holds the whole value head and key head in one tile each, padded only
to the next power of two of at least 16 (``tl.dot``'s least): at the mad recipe's GLA (keys of 4 and values of
8 per head, zero-padded to 16 by mixzoo before fla) the tiles are 16 wide, where fla's own kernels take value
tiles of at least 64 and key tiles of at least 32 on Hopper (``BV_LIST``, ``BK_LIST``). Each computes what fla's
kernel computes, with the same products and sums in the same order (fla's loops over key or value tiles have
one pass here):

- ``_dv_kernel`` (fla's ``chunk_gla_bwd_kernel_dv``): the in-chunk scores A (float32) against the output
  gradient in full float32 (``input_precision="ieee"``, no TF32, as fla), the decayed keys and the state gradient
  rounded to the keys' dtype for the tensor cores with float32 accumulation.
- ``_dqkg_kernel`` (fla's ``chunk_gla_bwd_kernel_inter``): the state's parts of dq, dk and the log-decays'
  gradient: the output gradient against the state and the values against the state gradient in the inputs' dtype
  with float32 accumulation, everything else float32.
- ``_o_kernel`` (fla's ``chunk_gla_fwd_kernel_o``): the output, the decayed queries against the state plus the
  in-chunk scores (rounded to the values' dtype) against the values, float32 accumulation."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chunk(T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
           BV: tl.constexpr):
    """This program's chunk of (sequence, head): the chunk's index, its positions' (sequence, position, head)
    rows and their mask, the key and value columns and masks, the row of the chunk's last position, and the offset
    of its (K, V) state."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    row = (i_b * T + o_t.to(tl.int64)) * H + i_h
    last = (i_b * T + tl.minimum(i_t * BT + BT, T) - 1) * H + i_h
    state = ((i_b * NT + i_t) * H + i_h) * K * V
    return row, o_t < T, o_k, o_k < K, o_v, o_v < V, last, state


@triton.jit
def _dv_kernel(k, g, A, do, dh, dv, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    row, m_t, o_k, m_k, o_v, m_v, last, state = _chunk(T, H, K, V, BT, BK, BV)
    o_s = tl.arange(0, BT)                      # a key's place in the chunk (A's last dimension)
    # A[t, s]: query t's score for key s of its chunk, s <= t; dv_s = sum_t A[t, s] do_t
    b_A = tl.load(A + row[:, None] * BT + o_s[None, :], mask=m_t[:, None], other=0.)
    b_A = tl.where(o_s[None, :] <= tl.arange(0, BT)[:, None], b_A, 0.)
    b_do = tl.load(do + row[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
    b_dv = tl.dot(tl.trans(b_A), b_do.to(tl.float32), input_precision="ieee")
    # the state term: (k_s 2^{g_last - g_s}) dh, with g the chunk-local cumulative log2-decay
    m_tk = m_t[:, None] & m_k[None, :]
    b_k = tl.load(k + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_g = tl.load(g + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_gn = tl.load(g + last * K + o_k, mask=m_k, other=0.)
    b_kd = (b_k.to(tl.float32) * tl.exp2(b_gn[None, :] - b_g)).to(k.dtype.element_ty)
    b_dh = tl.load(dh + state + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
    b_dv += tl.dot(b_kd, b_dh.to(k.dtype.element_ty))
    tl.store(dv + row[:, None] * V + o_v[None, :], b_dv.to(dv.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])


@triton.jit
def _dqkg_kernel(q, k, v, g, h, do, dh, dq, dk, dq2, dk2, dg, scale, T, H: tl.constexpr, K: tl.constexpr,
                 V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    row, m_t, o_k, m_k, o_v, m_v, last, state = _chunk(T, H, K, V, BT, BK, BV)
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    b_gk = tl.load(g + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_gn = tl.load(g + last * K + o_k, mask=m_k, other=0.)
    b_v = tl.load(v + row[:, None] * V + o_v[None, :], mask=m_tv, other=0.)
    b_do = tl.load(do + row[:, None] * V + o_v[None, :], mask=m_tv, other=0.)
    m_vk = m_v[:, None] & m_k[None, :]
    b_h = tl.load(h + state + o_v[:, None] + o_k[None, :] * V, mask=m_vk, other=0.)       # (BV, BK): hᵀ
    b_dh = tl.load(dh + state + o_v[:, None] + o_k[None, :] * V, mask=m_vk, other=0.)
    b_dgk = tl.sum(b_h * b_dh, axis=0)
    b_dq = tl.dot(b_do, b_h.to(b_do.dtype))
    b_dk = tl.dot(b_v, b_dh.to(b_v.dtype))
    b_dgk *= tl.exp2(b_gn)
    b_dq *= scale
    b_dq = b_dq * tl.exp2(b_gk)
    b_dk = b_dk * tl.exp2(b_gn[None, :] - b_gk)
    b_q = tl.load(q + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_k = tl.load(k + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_dgk += tl.sum(b_dk * b_k, axis=0)
    b_dq += tl.load(dq + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_dk += tl.load(dk + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_dg = b_q * b_dq - b_k * b_dk
    # the reverse cumulative sum over the chunk's positions (sum over s >= t), plus the state's part
    b_dg = b_dg - tl.cumsum(b_dg, axis=0) + tl.sum(b_dg, axis=0)[None, :] + b_dgk[None, :]
    tl.store(dq2 + row[:, None] * K + o_k[None, :], b_dq.to(dq2.dtype.element_ty), mask=m_tk)
    tl.store(dk2 + row[:, None] * K + o_k[None, :], b_dk.to(dk2.dtype.element_ty), mask=m_tk)
    tl.store(dg + row[:, None] * K + o_k[None, :], b_dg.to(dg.dtype.element_ty), mask=m_tk)


@triton.jit
def _o_kernel(q, v, g, h, A, o, scale, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
              BK: tl.constexpr, BV: tl.constexpr):
    row, m_t, o_k, m_k, o_v, m_v, last, state = _chunk(T, H, K, V, BT, BK, BV)
    o_i = tl.arange(0, BT)
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    b_q = tl.load(q + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_g = tl.load(g + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.).to(tl.float32)
    b_qg = (b_q * tl.exp2(b_g)).to(b_q.dtype)
    b_h = tl.load(h + state + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
    b_o = tl.dot(b_qg, b_h.to(b_qg.dtype))
    b_o *= scale
    b_v = tl.load(v + row[:, None] * V + o_v[None, :], mask=m_tv, other=0.)
    b_A = tl.load(A + row[:, None] * BT + o_i[None, :], mask=m_t[:, None], other=0.)
    b_A = tl.where(o_i[:, None] >= o_i[None, :], b_A, 0.).to(b_v.dtype)
    b_o = tl.dot(b_A, b_v, b_o)
    tl.store(o + row[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_tv)


# the dv kernel's warps: at 4 ptxas gives sm_90a 255 registers and 124 bytes of spills at the mad recipe's heads,
# at 8 172 registers and none; on the H200 (2026-12-03, tests/gpu/test_gla_steps_gpu.py) 8 warps took 2.097 ms
# against 3.006 at batch 768, length 1024 (0.346 / 0.513 at batch 128, 0.054 / 0.075 at length 128)
DV_WARPS = 8


def _tile(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def bwd_dv(k: torch.Tensor, g: torch.Tensor, A: torch.Tensor, do: torch.Tensor, dh: torch.Tensor,
           chunk_size: int = 64) -> torch.Tensor:
    """k (B, T, H, K); g (B, T, H, K) float32, chunk-local cumulative log2-decays; A (B, T, H, BT) float32;
    do (B, T, H, V); dh (B, NT, H, K, V) float32 -> dv (B, T, H, V) in do's dtype. Contiguous inputs."""
    B, T, H, K = k.shape
    V = do.shape[-1]
    dv = torch.empty_like(do)
    grid = (triton.cdiv(T, chunk_size), B * H)
    _dv_kernel[grid](k, g, A, do, dh, dv, T, H=H, K=K, V=V, BT=chunk_size, BK=_tile(K), BV=_tile(V),
                     num_warps=DV_WARPS)
    return dv


def bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, scale: float, chunk_size: int = 64):
    """q, k (B, T, H, K); v, do (B, T, H, V); h, dh (B, NT, H, K, V); g (B, T, H, K) float32, chunk-local
    cumulative log2-decays; dq, dk (B, T, H, K) the in-chunk parts -> (dq, dk, dg) whole, in dq's, dk's and g's
    dtypes. Contiguous inputs."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    dq2, dk2, dg = torch.empty_like(dq), torch.empty_like(dk), torch.empty_like(g)
    grid = (triton.cdiv(T, chunk_size), B * H)
    _dqkg_kernel[grid](q, k, v, g, h, do, dh, dq, dk, dq2, dk2, dg, scale, T, H=H, K=K, V=V, BT=chunk_size,
                       BK=_tile(K), BV=_tile(V), num_warps=4)
    return dq2, dk2, dg


def fwd_o(q, v, g, A, h, scale: float, chunk_size: int = 64):
    """q, g (B, T, H, K), g float32 chunk-local cumulative log2-decays; v (B, T, H, V); A (B, T, H, BT) the in-chunk
    scores; h (B, NT, H, K, V) the states entering the chunks -> o (B, T, H, V) in v's dtype. Contiguous inputs."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty_like(v)
    grid = (triton.cdiv(T, chunk_size), B * H)
    _o_kernel[grid](q, v, g, h, A, o, scale, T, H=H, K=K, V=V, BT=chunk_size, BK=_tile(K), BV=_tile(V), num_warps=4)
    return o
