"""The gated chunk_bwd_dqkwg step (``mixzoo.kernels.fla_dqkwg``) as one Triton kernel.

The PyTorch stand-in is some fifty kernel launches per call, and this step runs in every gated fla
backward (gdn, Mamba-2) at shapes where the launches, not the arithmetic, take the time. This is
the same computation in one launch: one program per (chunk, sequence x head), every product of
bf16 operands accumulated in float32 (as the stand-in's float32 matmuls of the same values), the
in-chunk score matrix rounded to the input dtype before its two products, as fla does.

It is the default (``MIXZOO_DQKWG=torch`` asks for the stand-in) and runs only after it has matched
the PyTorch stand-in on the device it runs on at the call's sizes (:func:`usable`: a small problem
with a partial last chunk); otherwise the stand-in runs. It
handles the cases the stand-in's callers produce in mixzoo (fixed length, as many value heads as
key heads, state as (K, V)); any other call goes to the stand-in. Imported only on a CUDA device.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._check import DeviceCheck, interpreting


@triton.jit
def _dqkwg_kernel(q, k, v, do, h, dh, w_out, dv, g, dq_out, dk_out, dg_out, scale,
                  T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_W: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    t0 = i_t * BT
    o_t = t0 + tl.arange(0, BT)
    m_t = o_t < T
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = tl.arange(0, BV)
    m_v = o_v < V
    row = ((i_b * T + o_t) * H + i_h).to(tl.int64)                      # (BT,) row of (B, T, H, .)
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    b_q = tl.load(q + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_k = tl.load(k + row[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
    b_v = tl.load(v + row[:, None] * V + o_v[None, :], mask=m_tv, other=0.)
    b_do = tl.load(do + row[:, None] * V + o_v[None, :], mask=m_tv, other=0.)
    st = ((i_b * NT + i_t) * H + i_h).to(tl.int64) * K * V              # (B, NT, H, K, V)
    m_kv = m_k[:, None] & m_v[None, :]
    b_h = tl.load(h + st + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.)
    b_dh32 = tl.load(dh + st + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.).to(tl.float32)
    b_dh = b_dh32.to(b_v.dtype)                                         # rounded like the stand-in's dhh
    b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32)
    last = tl.minimum(t0 + BT, T) - 1 - t0
    g_last = tl.sum(tl.where(tl.arange(0, BT) == last, b_g, 0.), axis=0)

    b_dq = tl.dot(b_do, tl.trans(b_h)) * (tl.exp2(b_g) * scale)[:, None]
    decay = tl.where(m_t, tl.exp2(g_last - b_g), 0.)
    b_dk = tl.dot(b_v, tl.trans(b_dh)) * decay[:, None]
    qf, kf = b_q.to(tl.float32), b_k.to(tl.float32)
    hdh = tl.sum(tl.sum(b_h.to(tl.float32) * b_dh32, axis=1), axis=0)
    dg_last = hdh * tl.exp2(g_last) + tl.sum(tl.sum(b_dk * kf, axis=1), axis=0)

    b_ds = tl.dot(b_do, tl.trans(b_v))                                  # (BT, BT): do_t . v_s
    o_s = tl.arange(0, BT)
    keep = (o_s[:, None] >= o_s[None, :]) & m_t[:, None] & m_t[None, :]
    diff = tl.where(keep, b_g[:, None] - b_g[None, :], 0.)
    b_ds = tl.where(keep, b_ds * tl.exp2(diff), 0.) * scale
    b_ds = b_ds.to(b_k.dtype)
    b_dq += tl.dot(b_ds, b_k)
    b_dk += tl.dot(tl.trans(b_ds), b_q)
    b_dg = tl.sum(b_dq * qf, axis=1) - tl.sum(b_dk * kf, axis=1)
    b_dg += tl.where(o_s == last, dg_last, 0.)

    tl.store(dq_out + row[:, None] * K + o_k[None, :], b_dq.to(dq_out.dtype.element_ty), mask=m_tk)
    tl.store(dk_out + row[:, None] * K + o_k[None, :], b_dk.to(dk_out.dtype.element_ty), mask=m_tk)
    tl.store(dg_out + (i_b * T + o_t) * H + i_h, b_dg, mask=m_t)
    if HAS_W:
        b_dv = tl.load(dv + row[:, None] * V + o_v[None, :], mask=m_tv, other=0.).to(b_v.dtype)
        b_dw = -tl.dot(b_dv, tl.trans(b_h))
        tl.store(w_out + row[:, None] * K + o_k[None, :], b_dw.to(w_out.dtype.element_ty), mask=m_tk)


def supported(q, k, v, h, w=None, g=None, g_gamma=None, state_v_first=False, cu_seqlens=None) -> bool:
    """Whether this kernel takes the call (else the PyTorch stand-in does)."""
    return (g is not None and g_gamma is None and cu_seqlens is None and not state_v_first
            and v.shape[2] == k.shape[2] and q.shape == k.shape and h.dtype == k.dtype
            and k.dtype in (torch.bfloat16, torch.float16)
            and all(t.is_cuda or interpreting() for t in (q, k, v, h)))


def chunk_bwd_dqkwg_triton(q, k, v, do, h, dh, w=None, g=None, dv=None, scale=None, chunk_size=64):
    """The stand-in's contract (``chunk_bwd_dqkwg_torch``) for :func:`supported` calls."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    BT = chunk_size
    NT = -(-T // BT)
    if scale is None:
        scale = K ** -0.5
    c = lambda t: t.contiguous()            # noqa: E731
    q, k, v, do, h, dh, g = (c(t) for t in (q, k, v, do, h, dh, g))
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dg = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    dw = torch.empty_like(w) if w is not None else None
    dvc = c(dv) if (w is not None and dv is not None) else do
    _dqkwg_kernel[(NT, B * H)](q, k, v, do, h, dh, dw if dw is not None else dq, dvc, g, dq, dk, dg, float(scale),
                               T, NT, H=H, K=K, V=V, BT=BT, BK=max(16, triton.next_power_of_2(K)),
                               BV=max(16, triton.next_power_of_2(V)), HAS_W=dw is not None,
                               num_warps=8 if max(K, V) >= 64 else 4)
    return dq, dk, dw, dg


def usable(K: int = 16, V: int = 32, BT: int = 64, device_index: int = 0) -> bool:
    """Whether the kernel matches the PyTorch stand-in on this device at these head and chunk
    sizes (checked once per (K, V, BT, device): bf16, a partial last chunk, with w). The stand-in is
    the reference it replaces: fla's own Triton version of this step is miscompiled on Hopper with
    some Triton versions, so this one is trusted only where it has been compared. Asked for from
    gdn's and Mamba-2's forward, also under vmap and in graph captures (``_check.DeviceCheck``)."""
    return _USABLE((K, V, BT, device_index))


def _matches_here(K: int, V: int, BT: int, device_index: int) -> bool:
    from .fla_dqkwg import chunk_bwd_dqkwg_torch
    try:
        dev = torch.device("cuda", device_index) if not interpreting() else torch.device("cpu")
        gen = torch.Generator(device="cpu").manual_seed(0)
        B, H = 2, 2
        T = BT + BT // 2 + 3
        NT = -(-T // BT)
        bf = torch.bfloat16
        r = lambda *s: torch.randn(*s, generator=gen)            # noqa: E731
        q, k, w = (torch.nn.functional.normalize(r(B, T, H, K), dim=-1).to(bf).to(dev) for _ in range(3))
        v, do, dv = (r(B, T, H, V).to(bf).to(dev) for _ in range(3))
        h, dh = r(B, NT, H, K, V).to(bf).to(dev), r(B, NT, H, K, V).to(dev)
        g = torch.cat([(-torch.rand(B, BT, H, generator=gen) * 0.3).cumsum(1) for _ in range(NT)], 1)[:, :T]
        g = (g / math.log(2)).to(dev)
        want = chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g, dv=dv, chunk_size=BT)
        got = chunk_bwd_dqkwg_triton(q, k, v, do, h, dh, w=w, g=g, dv=dv, chunk_size=BT)
        for a, b in zip(got, want):
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)) > 1e-2:
                return False
        return True
    except Exception:
        return False


_USABLE = DeviceCheck(lambda key: _matches_here(*key))
