"""Gated DeltaNet (Yang et al., 2025): a delta-rule fast-weight memory with a data-dependent decay.

S_t = a_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ,  o_t = S_t q_t / √d, with q, k L2-normalized
after a short convolution, a_t = exp(-exp(A) softplus(W_a x + dt_bias)), β_t = σ(W_b x) and a
gated RMSNorm on the output. ``allow_neg_eigval`` takes β in [0, 2], so the transition
I - β k kᵀ can have eigenvalue down to -1 (Grazzi et al., 2025: needed for state tracking).

Paths: ``torch-chunk`` (``_scan.gated_delta_chunk``, the WY/UT chunk form in plain PyTorch; the
CPU path and the reference), ``triton-rec`` (heads of at most 16: mixzoo's recurrent Triton scan,
``mixzoo.kernels.recurrent``, one position at a time with each head's state in registers; the default
there on a GPU, ``MIXZOO_GDN=fla`` for fla's chunk kernels instead), ``fla-chunk`` (fla's Triton
``chunk_gated_delta_rule``, where its gated backward is trusted) and ``fla-chunk+triton-dqkwg`` /
``fla-chunk+torch-dqkwg`` (on Hopper with 3.4 <= Triton < 3.7.1, where fla refuses one backward kernel, ``chunk_bwd_dqkwg``: fla's
kernels run with that one step replaced by mixzoo's one-launch Triton version where it has matched
mixzoo's batched PyTorch version on the device, else by the PyTorch version;
``mixzoo.kernels.fla_dqkwg``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import recurrent
from ..registry import register_mixer
from . import _fla
from ._parts import ConvAct, GatedNorm, dt_bias_init, l2norm
from ._scan import gated_delta_chunk
from .common import split_heads


def gdn_core(q, k, v, *, beta: float = 0.5, decay: float = 1.0, normalize: bool = True):
    """Gated delta rule with fixed β and decay on (..., T, D) inputs, causal:
    S_i = decay·S_{i-1} + β_i (v_i - decay·S_{i-1} k_i) k_iᵀ, o_i = S_i q_i, with
    β_i = beta / ||k_i||² when ``normalize`` (the normalized LMS step), else beta."""
    lead, T, V = q.shape[:-2], q.shape[-2], v.shape[-1]
    q3, k3, v3 = (t.reshape(-1, 1, T, t.shape[-1]) for t in (q, k, v))
    b = torch.full(k3.shape[:3], float(beta), dtype=q.dtype, device=q.device)
    if normalize:
        b = b / k3.pow(2).sum(-1).clamp_min(1e-12)
    g = torch.full_like(b, math.log(decay) if decay > 0 else -1e4)
    o = gated_delta_chunk(q3, k3, v3, g, b)
    return o.to(q.dtype).reshape(*lead, T, V)


@register_mixer("gdn", core=gdn_core,
                core_grid={"beta": [0.1, 0.3, 0.5, 1.0], "decay": [1.0, 0.99, 0.95, 0.9]},
                search_space={
                    "lr": ("log", 1e-4, 3e-2),
                    "weight_decay": ("cat", [0.0, 0.1]),
                    "allow_neg_eigval": ("cat", [False, True]),
                })
class GatedDeltaNet(nn.Module):
    """Gated DeltaNet: gated delta-rule memory, short convolutions, gated output norm."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0,
                 allow_neg_eigval: bool = False, conv_size: int = 4, chunk_size: int = 64,
                 backend: str = "auto"):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        if backend not in ("auto", "torch", "fla"):
            raise ValueError(f"backend={backend!r}; allowed: auto, torch, fla")
        self.h, self.dh, self.neg, self.chunk, self.requested = (
            num_heads, d_model // num_heads, allow_neg_eigval, chunk_size, backend)
        # one projection for q, k, v (through one short convolution), the output gate, a and β
        self.proj = nn.Linear(d_model, 4 * d_model + 2 * num_heads, bias=False)
        self.conv = ConvAct(3 * d_model, conv_size)
        self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(1, 16)))
        self.dt_bias = nn.Parameter(dt_bias_init(num_heads))
        self.o_norm = GatedNorm(self.dh)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.backend = "torch-chunk"

    def _fast(self, x):
        """fla's chunk kernel and the backend name, or (None, "torch-chunk")."""
        if not x.is_cuda or self.requested == "torch":
            return None, "torch-chunk"
        width = max(self.dh, _fla.fla_pad_width())
        fn, suffix = _fla.gated_chunk_op("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", width, width)
        if fn is None:
            if self.requested == "fla":
                raise RuntimeError("gdn: backend='fla' asked for but fla's chunk kernel cannot run here")
            return None, "torch-chunk"
        return fn, "fla-chunk" + suffix + _fla.unpadded_suffix(self.dh)

    def _gates(self, a, b):
        """The log-decay -exp(A) softplus(a + dt_bias) and β = σ(b) (x2 with allow_neg_eigval), (B, T, H) float32."""
        return (-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias),
                b.float().sigmoid() * (2.0 if self.neg else 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        qkv, gate, a, b = self.proj(x).split([3 * d, d, self.h, self.h], dim=-1)
        qkv = self.conv(qkv)
        if self.requested == "auto" and recurrent.wanted(x, self.dh, self.dh, "MIXZOO_GDN"):
            self.backend = "triton-rec"
            q, k, v = (t.reshape(B, T, self.h, self.dh) for t in qkv.chunk(3, dim=-1))
            g, beta = self._gates(a, b)
            o = _fla._op("mixzoo.kernels.recurrent", "delta_rule_rec")(q, k, v, g, beta, self.dh ** -0.5)  # folded when stacking
            return self.o_proj(self.o_norm(o.transpose(1, 2), gate))
        fast, self.backend = self._fast(x)
        if fast is not None:
            # fla's kernels do the L2 norm of q and k, the decay -exp(A) softplus(a + dt_bias) with
            # its chunk cumsum, and β = σ(b) (x2 with allow_neg_eigval)
            q, k, v = _fla.pad_heads(*(t.reshape(B, T, self.h, self.dh) for t in qkv.chunk(3, dim=-1)),
                                     width=_fla.fla_pad_width())
            o = fast(q, k, v, g=a.contiguous(), beta=b.contiguous(), scale=self.dh ** -0.5,
                     use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=self.A_log,
                     dt_bias=self.dt_bias, use_beta_sigmoid_in_kernel=True,
                     allow_neg_eigval=self.neg)[0][..., :self.dh]
            return self.o_proj(self.o_norm(o.transpose(1, 2), gate))
        q, k, v = (split_heads(t, self.h) for t in qkv.chunk(3, dim=-1))
        q, k = l2norm(q), l2norm(k)
        g, beta = self._gates(a, b)
        o = gated_delta_chunk(q, k, v, g.transpose(1, 2), beta.transpose(1, 2),
                              scale=self.dh ** -0.5, chunk=self.chunk)
        return self.o_proj(self.o_norm(o, gate))

    def state_size(self, seq_len: int) -> int:
        return self.h * self.dh * self.dh
