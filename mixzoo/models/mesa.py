"""MesaNet (von Oswald et al., 2025): each query reads out the optimal ridge-regression fit of
its whole (decayed) prefix, o_t = H_kv,t (H_kk,t + Λ)^{-1} q_t with
H_kk,t = Σ_{j<=t} (Π a) β_j k_j k_jᵀ and H_kv,t the same with v_j k_jᵀ.

Layer: q, k, v after a short convolution and SiLU, q and k L2-normalized, forget gate
a = σ(W_a x), input gate β = σ(W_b x), per-head per-dimension Λ = softplus(λ) + λ_min,
gated RMSNorm on the output. Paths: ``fla-chunk`` (fla's Triton ``chunk_mesa_net``, conjugate
gradient, on a GPU) and ``torch-exact`` (``mesa_exact``: chunked prefix sums and one batched solve
per position; the CPU path).
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import register_mixer
from . import _fla
from ._parts import ConvAct, GatedNorm, l2norm
from ._scan import decayed_prefix_sums
from .common import split_heads

# Head widths fla's chunk_mesa_net is run at (a narrower head is zero-padded to the next): 16, 64 and
# 128 have matched the exact read-out on an H200; 32 faulted there (illegal memory access).
# benchmarks/mesa_head_pad.py measures each width against the float64 exact read-out, one process per
# width: at the mad recipe's 16 heads of 8, width 16 gave output / worst gradient errors 9.4e-3 /
# 3.1e-2 (the bf16 PyTorch path: 8.7e-3 / 3.5e-2) and a layer forward+backward of 2.13 ms as one CUDA
# graph at MAD's shape, against 3.61 ms padded to 64.
FLA_HEAD_DIMS = (16, 64, 128)


def _decayed_prefix(x: torch.Tensor, decay: float, chunk: int = 64) -> torch.Tensor:
    """h_i = Σ_{j<=i} decay^{i-j} x_j along dim -3 of (..., T, A, B), in O(T) chunks."""
    if decay == 1.0:
        return x.cumsum(-3)
    if not 0.0 < decay < 1.0:
        raise ValueError(f"decay={decay}; allowed: 0 < decay <= 1")
    T = x.shape[-3]
    out = torch.empty_like(x)
    carry = None
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        p = decay ** torch.arange(e - s, device=x.device, dtype=x.dtype)[:, None, None]   # decay^t
        h = (x[..., s:e, :, :] / p).cumsum(-3) * p
        if carry is not None:
            h = h + carry.unsqueeze(-3) * (p * decay)
        out[..., s:e, :, :] = h
        carry = h[..., -1, :, :]
    return out


def mesa_core(q, k, v, *, ridge: float = 1.0, decay: float = 1.0):
    """Global ridge least squares over the prefix on (..., T, D) inputs, causal:
    o_i = (Σ_{j<=i} γ^{i-j} v_j k_jᵀ)(Σ_{j<=i} γ^{i-j} k_j k_jᵀ + λI)^{-1} q_i."""
    K = q.shape[-1]
    hkk = _decayed_prefix(k.unsqueeze(-1) * k.unsqueeze(-2), decay)          # (..., T, K, K)
    hvk = _decayed_prefix(v.unsqueeze(-1) * k.unsqueeze(-2), decay)          # (..., T, V, K)
    eye = torch.eye(K, dtype=q.dtype, device=q.device)
    x = torch.linalg.solve(hkk + ridge * eye, q.unsqueeze(-1))
    return (hvk @ x).squeeze(-1)


def default_cg_steps(head_dim: int) -> int:
    """fla's conjugate-gradient steps (forward and backward solve) for ``cg_steps=None``: 10 for heads the fla
    path pads to 16 (at most 16 dims), fla's 30 above. With q zero in the padded dims each position's system is
    at most 16-dimensional (8 at the mad recipe), and CG with bf16 products reaches its floor in a few more steps
    than that: benchmarks/mesa_cg_steps.py on an H200 (16 heads of 8, against the float64 exact read-out, output /
    input gradient / parameter gradients) gave 8.07e-3 / 1.15e-2 / 1.08e-2 at 10 steps and 8.04e-3 / 1.14e-2 /
    1.08e-2 at 30 for the layer as built, 1.42e-2 / 1.85e-2 / 1.79e-2 and 1.41e-2 / 1.82e-2 / 1.76e-2 with a
    forget gate of 0.9975 and Λ at 0.05 (6 steps: 6.0e-2 there); the layer's forward+backward at batch 768,
    length 1024 took 29.5 against 39.2 ms (benchmarks/h200-2026-12-05)."""
    return 10 if head_dim <= 16 else 30


def mesa_exact(q, k, v, g, beta, lamb):
    """The exact Mesa read-out on (B, H, T, D) inputs with log forget gates g and input gates
    β (B, H, T) and Λ (H, D): prefix sums of β k kᵀ and β v kᵀ, one batched solve per position."""
    B, H, T, D = q.shape
    kb = k.float() * beta.unsqueeze(-1)
    hkk = decayed_prefix_sums((kb.unsqueeze(-1) * k.float().unsqueeze(-2)).flatten(-2), g).unflatten(-1, (D, D))
    hvk = decayed_prefix_sums((v.float().unsqueeze(-1) * kb.unsqueeze(-2)).flatten(-2), g).unflatten(-1, (D, D))
    with torch.autocast(q.device.type, enabled=False):
        x = torch.linalg.solve(hkk + torch.diag_embed(lamb.float())[None, :, None], q.float().unsqueeze(-1))
        return (hvk @ x).squeeze(-1)


@register_mixer("mesa", core=mesa_core,
                core_grid={"ridge": [1e-3, 1e-2, 1e-1, 1.0, 10.0], "decay": [1.0, 0.99, 0.95]},
                search_space={
                    "lr": ("log", 1e-4, 3e-2),
                    "weight_decay": ("cat", [0.0, 0.1]),
                    "lambda_min": ("log", 0.05, 1.0),
                })
class MesaNet(nn.Module):
    """MesaNet: a per-query ridge regression over the gated prefix (the Mesa layer)."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0,
                 lambda_min: float = 0.25, lambda_init: float = 1.0, conv_size: int = 4,
                 cg_steps: int | None = None, backend: str = "auto"):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        if backend not in ("auto", "torch", "fla"):
            raise ValueError(f"backend={backend!r}; allowed: auto, torch, fla")
        if lambda_init <= lambda_min:
            raise ValueError(f"lambda_init={lambda_init} must exceed lambda_min={lambda_min}")
        if cg_steps is not None and cg_steps < 1:
            raise ValueError(f"cg_steps={cg_steps}; allowed: an integer >= 1, or None (by head width)")
        self.h, self.dh, self.lmin, self.requested = num_heads, d_model // num_heads, lambda_min, backend
        self.cg = cg_steps if cg_steps is not None else default_cg_steps(self.dh)
        # one projection for q, k, v (through one short convolution), the output gate and β
        self.proj = nn.Linear(d_model, 4 * d_model + num_heads, bias=False)
        self.conv = ConvAct(3 * d_model, conv_size)
        self.a_proj = nn.Linear(d_model, num_heads, bias=True)
        nn.init.constant_(self.a_proj.bias, 3.0)          # forget gate starts near 0.95
        init = math.log(math.expm1(lambda_init - lambda_min))
        self.lam = nn.Parameter(torch.full((num_heads, self.dh), init))
        self.o_norm = GatedNorm(self.dh)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.backend = "torch-exact"

    def _fast(self, x):
        if not x.is_cuda or self.requested == "torch":
            return None
        fn = _fla.triton_op("fla.ops.mesa_net", "chunk_mesa_net") if self.dh <= max(FLA_HEAD_DIMS) else None
        if fn is None and self.requested == "fla":
            raise RuntimeError("mesa: backend='fla' asked for but fla's Triton kernel is unavailable")
        return fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tt = lambda t: t.transpose(1, 2).contiguous()          # (B, H, T, D) <-> (B, T, H, D)
        d = x.shape[-1]
        qkv, gate, b = self.proj(x).split([3 * d, d, self.h], dim=-1)
        q, k, v = (split_heads(t, self.h) for t in self.conv(qkv).chunk(3, dim=-1))
        fast = self._fast(x)
        in_kernel = fast is not None and os.environ.get("MIXZOO_MESA_L2NORM", "fla") == "fla"
        if not in_kernel:
            q, k = l2norm(q), l2norm(k)
        g = F.logsigmoid(self.a_proj(x).float())                # (B, T, H)
        beta = b.float().sigmoid()
        lamb = F.softplus(self.lam.float()) + self.lmin         # (H, D)
        if fast is not None:
            pad_to = self._pad_default()
            self.backend = "fla-chunk" + ("+fla-l2norm" if in_kernel else "") + _fla.unpadded_suffix(self.dh, pad_to)
            T, D = x.shape[1], self.dh
            # The kernel is run at shapes seen to work on an H200: whole chunks of 64 and the head
            # dims of FLA_HEAD_DIMS. Zero padding is exact: padded positions come
            # after t, padded dims have zero q, k, v (and Λ = 1), so they add nothing. q, k, v stay in
            # fla's (B, T, H, D) layout throughout (the transposed views of split_heads, moved back),
            # so the padding's copy is the only one; without padding, the contiguous copy is.
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            pad = -T % 64
            dpad = next(w for w in FLA_HEAD_DIMS if w >= D) - D if _fla.fla_pad_width(pad_to) else 0
            if pad or dpad:
                q, k, v = (F.pad(t, (0, dpad, 0, 0, 0, pad)) for t in (q, k, v))
                g, beta = F.pad(g, (0, 0, 0, pad)), F.pad(beta, (0, 0, 0, pad))
                lamb = F.pad(lamb, (0, dpad), value=1.0)
            else:
                q, k, v = (t.contiguous() for t in (q, k, v))
            # By default (MIXZOO_MESA_L2NORM=fla) q and k are L2-normalized by fla inside the call (its Triton l2norm,
            # float32 sums, written in float16, the precision the kernel casts q and k to either way), not
            # by F.normalize before it, which under bf16 autocast writes float32 copies with about ten
            # elementwise kernels forward and backward (12 % of a stacked MesaNet step's device time in the
            # H200 profile). Measured 1.21x to 1.23x a stacked step at lengths 128 to 1024 on the H200, where
            # the GPU tests of the fast path pass both ways (tests/gpu: mesa). MIXZOO_MESA_L2NORM=torch: F.normalize.
            # Zero-padded dims and positions stay zero (0 / sqrt(0 + eps)).
            o = fast(q, k, v, g=g, beta=beta, lamb=lamb, max_CG_iteration=self.cg,
                     use_qk_l2norm_in_kernel=in_kernel)[0][:, :T, :, :D]
            return self.o_proj(self.o_norm(o.transpose(1, 2), gate))
        else:
            self.backend = "torch-exact"
            o = tt(mesa_exact(q, k, v, g.transpose(1, 2), beta.transpose(1, 2), lamb))
        return self.o_proj(self.o_norm(tt(o), gate))

    def _pad_default(self) -> str:
        """Heads narrower than 16 go to fla unpadded by default (measured at heads of 8: _fla.fla_pad_width); wider
        ones keep their padding to FLA_HEAD_DIMS unless ``MIXZOO_FLA_PAD=none``."""
        return "none" if self.dh < _fla.MIN_DOT else "16"

    def state_size(self, seq_len: int) -> int:
        return 2 * self.h * self.dh * self.dh
