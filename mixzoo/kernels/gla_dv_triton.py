"""The Triton kernel behind ``mixzoo.kernels.gla_dv`` (imported only when it is to run).

One program per (chunk, sequence x head) holds the whole value head and key head in one tile each,
padded only to the next power of two of at least 16 (``tl.dot``'s least): at the mad recipe's GLA
(keys of 4 and values of 8 per head, zero-padded to 16 by mixzoo before fla) the tiles are 16 wide,
where fla's own kernel takes value tiles of at least 64 on Hopper (``BV_LIST``), four times the
products of the in-chunk term in float32 FMA. Products in fla's precision: the in-chunk scores A
(float32) against the output gradient in full float32 (``input_precision="ieee"``, no TF32), the
decayed keys and the state gradient rounded to the keys' dtype for the tensor cores with float32
accumulation."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dv_kernel(k, g, A, do, dh, dv, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, BT)
    o_t = i_t * BT + tl.arange(0, BT)           # the chunk's positions (rows t of A, and s)
    o_s = tl.arange(0, BT)                      # a key's place in the chunk (A's last dimension)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_t = o_t < T
    m_k = o_k < K
    m_v = o_v < V
    row = (i_b * T + o_t.to(tl.int64)) * H + i_h                  # (sequence, position, head) rows
    # A[t, s]: query t's score for key s of its chunk, s <= t; dv_s = sum_t A[t, s] do_t
    b_A = tl.load(A + row[:, None] * BT + o_s[None, :], mask=m_t[:, None], other=0.)
    b_A = tl.where(o_s[None, :] <= tl.arange(0, BT)[:, None], b_A, 0.)
    b_do = tl.load(do + row[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
    b_dv = tl.dot(tl.trans(b_A), b_do.to(tl.float32), input_precision="ieee")
    # the state term: (k_s 2^{g_last - g_s}) dh, with g the chunk-local cumulative log2-decay
    m_tk = m_t[:, None] & m_k[None, :]
    b_k = tl.load(k + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_g = tl.load(g + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    last = (i_b * T + tl.minimum(i_t * BT + BT, T) - 1) * H + i_h
    b_gn = tl.load(g + last * K + o_k, mask=m_k, other=0.)
    b_kd = (b_k.to(tl.float32) * tl.exp2(b_gn[None, :] - b_g)).to(k.dtype.element_ty)
    b_dh = tl.load(dh + ((i_b * NT + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                   mask=m_k[:, None] & m_v[None, :], other=0.)
    b_dv += tl.dot(b_kd, b_dh.to(k.dtype.element_ty))
    tl.store(dv + row[:, None] * V + o_v[None, :], b_dv.to(dv.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])


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
                     num_warps=4)
    return dv
