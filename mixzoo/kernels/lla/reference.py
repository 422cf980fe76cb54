"""Exact causal Local Linear Attention in plain PyTorch (the oracle and the CPU path).

For query i over keys j <= i, with softmax weights a_ij = softmax_j(scale * q_i . k_j):

    k̄ = Σ a k,  v̄ = Σ a v,  Σ_KK = Σ a (k - k̄)(k - k̄)ᵀ,  Σ_VK = Σ a (v - v̄)(k - k̄)ᵀ
    o_i = v̄ - Σ_VK (Σ_KK + λ I)^{-1} (k̄ - q_i)

which is the intercept of the weighted ridge regression
``min_{b,W} Σ_j a_ij ||v_j - b - W (k_j - q_i)||² + λ ||W||²_F`` — FlashLLA's estimator with
its ridge λ·ω_i written for normalized weights. The output is a weighted sum of values with
weights a_ij (1 - (k_j - k̄_i) . x_i), x_i = (Σ_KK + λI)^{-1}(k̄_i - q_i); they sum to one.

Memory: queries are processed in chunks; the largest tensors are the (chunk, T) weights
and the (T, D²) key outer products, computed once per call (per slice of the leading dimensions
when they would exceed ``KK_BUDGET`` elements), never T x T x D.
"""
from __future__ import annotations

import math

import torch

# the most elements of the (..., T, D²) key outer products held at once (fp32: 1 GiB): a call
# whose leading dimensions would exceed it runs over slices of them
KK_BUDGET = 1 << 28


def _outer(k):
    return (k.unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2)       # (..., T, D²)


def _solve_directions(q, k, a, ridge, kk=None):
    """x_i = (Σ_KK,i + λI)^{-1}(k̄_i - q_i) and k̄_i for one chunk of queries.

    q: (..., C, D) queries; k: (..., T, D) keys; a: (..., C, T) normalized weights; kk: the keys'
    outer products ``_outer(k)`` when the caller has them (they do not depend on the chunk).
    """
    D = q.shape[-1]
    kbar = a @ k                                                  # (..., C, D)
    kk = _outer(k) if kk is None else kk
    second = (a @ kk).unflatten(-1, (D, D))                       # (..., C, D, D)
    cov = second - kbar.unsqueeze(-1) * kbar.unsqueeze(-2)
    cov = 0.5 * (cov + cov.transpose(-1, -2))
    eye = torch.eye(D, dtype=q.dtype, device=q.device)
    lam = ridge if not torch.is_tensor(ridge) else ridge[..., None, None]
    x = torch.linalg.solve(cov + lam * eye, (kbar - q).unsqueeze(-1)).squeeze(-1)
    return x, kbar


def _causal_softmax(q, k, scale, q_offset):
    s = (q @ k.transpose(-1, -2)) * scale                        # (..., C, T)
    C, T = s.shape[-2], s.shape[-1]
    qi = torch.arange(q_offset, q_offset + C, device=q.device)[:, None]
    kj = torch.arange(T, device=q.device)[None, :]
    s = s.masked_fill(kj > qi, float("-inf"))
    return torch.softmax(s, dim=-1)


def lla_weights(q, k, *, ridge=1.0, scale=None, chunk: int = 256):
    """The (..., T, T) effective weights on the values (for tests and inspection)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = []
    T = q.shape[-2]
    kk = _outer(k)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        a = _causal_softmax(q[..., s:e, :], k, scale, s)
        x, kbar = _solve_directions(q[..., s:e, :], k, a, _ridge_slice(ridge, s, e), kk)
        corr = (k @ x.transpose(-1, -2)).transpose(-1, -2) - (kbar * x).sum(-1, keepdim=True)
        out.append(a * (1 - corr))
    return torch.cat(out, dim=-2)


def _ridge_slice(ridge, s, e):
    if torch.is_tensor(ridge) and ridge.dim() > 0 and ridge.shape[-1] > 1:
        return ridge[..., s:e]
    return ridge


def lla_reference(q, k, v, *, ridge=1.0, scale=None, chunk: int | None = None,
                  compute_dtype=None):
    """Causal LLA. q, k: (..., T, D); v: (..., T, Dv) -> (..., T, Dv).

    ``ridge`` is λ: a float, or a tensor broadcastable to (..., T) (per head or per token).
    ``compute_dtype`` defaults to float32 (float64 stays float64). Differentiable.
    """
    out_dtype = v.dtype
    cd = compute_dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    if torch.is_tensor(ridge):
        ridge = ridge.to(cd)
    T, D = q.shape[-2], q.shape[-1]
    scale = D ** -0.5 if scale is None else scale
    if q.dim() > 2 and q.shape[0] > 1 and q[:1].numel() // D * D * D * q.shape[0] > KK_BUDGET:
        # too many sequences for their key outer products at once: slices of the first dimension
        n = max(1, KK_BUDGET // max(1, q[:1].numel() // D * D * D))
        rs = (lambda s, e: ridge[s:e] if torch.is_tensor(ridge) and ridge.dim() == q.dim() - 1
              and ridge.shape[0] == q.shape[0] else ridge)
        return torch.cat([lla_reference(q[s:s + n], k[s:s + n], v[s:s + n], ridge=rs(s, s + n), scale=scale,
                                        chunk=chunk, compute_dtype=cd) for s in range(0, q.shape[0], n)]
                         ).to(out_dtype)
    if chunk is None:
        lead = math.prod(q.shape[:-2]) or 1
        chunk = max(1, min(T, (1 << 22) // max(1, lead * max(D * D, T))))
    outs = []
    kk = _outer(k)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        a = _causal_softmax(q[..., s:e, :], k, scale, s)
        x, kbar = _solve_directions(q[..., s:e, :], k, a, _ridge_slice(ridge, s, e), kk)
        vbar = a @ v
        kx = (x @ k.transpose(-1, -2))                          # (..., C, T): k_j . x_i
        corr = (a * kx) @ v - vbar * (kbar * x).sum(-1, keepdim=True)
        outs.append(vbar - corr)
    return torch.cat(outs, dim=-2).to(out_dtype)
