"""Parallax (Zuo et al., 2026): parameterized local linear attention.

With softmax weights a_ij = softmax_j(q_i·k_j / √d) over j <= i and a learned query-side vector
r_i = W_R x_i, each output is a_ij-weighted with corrected weights
w_ij = a_ij (1 + t̄_i - r_i·k_j), t̄_i = Σ_j a_ij r_i·k_j,  o_i = Σ_j w_ij v_j,
equivalently o_i = v̄_i - Σ_VK,i r_i with the softmax-weighted key-value cross-covariance.
The weights sum to one; W_R = 0 gives softmax attention exactly. r passes through a per-head
RMSNorm (``r_norm``) and, as an option, the same rotary embedding as q and k (``rope_r``) and a
learnable sigmoid gate per head and token (``gate_r``, the paper's gated variant). Diagnostics:
the correction-to-output ratio, the stable rank of W_R and the gate (``diagnostics``).

Paths: ``fla-parallel`` (fla's Triton ``parallel_parallax``, GPU, bf16/fp16 inputs only),
``fla-parallel+tiles`` (the same kernels launched at mixzoo's tiles, ``mixzoo.kernels.parallax_tiles``; the
default, ``MIXZOO_PARALLAX_TILES=fla`` for fla's launcher; heads narrower than 16 go to it unpadded,
``+unpadded``, unless ``MIXZOO_FLA_PAD=16``) and ``torch`` (the exact O(T²) form above, any device and dtype).
"""
from __future__ import annotations

import torch
from torch import nn

from ..kernels import parallax_prologue as _prologue
from ..kernels import parallax_tiles as _tiles
from ..registry import register_mixer
from . import _fla
from .common import RMSNorm, merge_heads, rope, split_heads


def parallax_reference(q, r, k, v, *, scale=None):
    """Causal Parallax on (..., T, D) inputs, computed in float32 (float64 for float64)."""
    dt = q.dtype
    cdt = torch.float64 if dt == torch.float64 else torch.float32
    q, r, k, v = (t.to(cdt) for t in (q, r, k, v))
    T = q.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    with torch.autocast(q.device.type, enabled=False):
        a = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
        s2 = r @ k.transpose(-1, -2)
        tbar = (a * s2).sum(-1, keepdim=True)
        return ((a * (1.0 + tbar - s2)) @ v).to(dt)


# the width Parallax's narrower heads are padded to on mixzoo's launch unless MIXZOO_FLA_PAD says: "none" (bit for bit
# the padded launch on an H100, its stacked+graphed K = 6 step 1.08-1.12x, 2026-12-06, benchmarks/calls-2026-12-06d)
PARALLAX_PAD = "none"


@register_mixer("parallax", search_space={
    "lr": ("log", 1e-4, 3e-2),
    "weight_decay": ("cat", [0.0, 0.1]),
    "rope_r": ("cat", [True, False]),
})
class Parallax(nn.Module):
    """Parallax: softmax attention corrected by a learned local-linear direction r = W_R x."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0,
                 rope: bool = True, rope_r: bool = True, r_norm: bool = True, gate_r: bool = False,
                 backend: str = "auto"):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        if backend not in ("auto", "torch", "fla"):
            raise ValueError(f"backend={backend!r}; allowed: auto, torch, fla")
        self.h, self.use_rope, self.rope_r, self.requested = num_heads, rope, rope_r, backend
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.r_proj = nn.Linear(d_model, d_model, bias=False)
        self.r_norm = RMSNorm(d_model // num_heads) if r_norm else None
        # the paper's gated variant, r = σ(w_g · x) W_R x, one gate per head and token; starting at
        # σ(0) = 1/2 (zero weights and bias) is our choice, the paper does not say
        self.gate = nn.Linear(d_model, num_heads) if gate_r else None
        if self.gate is not None:
            nn.init.zeros_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.backend = "torch"

    def _fast(self, q):
        if not q.is_cuda or self.requested == "torch" or q.dtype not in (torch.bfloat16, torch.float16):
            if self.requested == "fla":
                raise RuntimeError("parallax: backend='fla' needs CUDA bf16/fp16 inputs")
            return None
        fn = _fla.triton_op("fla.ops.parallax", "parallel_parallax")
        if fn is None and self.requested == "fla":
            raise RuntimeError("parallax: backend='fla' asked for but fla's Triton kernel is unavailable")
        return fn

    def _qkvr(self, x: torch.Tensor):
        """q, k, v, r as (B, H, T, D), and the gate (B, H, T) or None. Without the gate, where its kernels run, by
        ``mixzoo.kernels.parallax_prologue`` (one pass each way; q, k, v, r then views of contiguous (B, T, H, D),
        the layout fla's kernels take)."""
        qkv, rr = self.qkv(x), self.r_proj(x)
        if self.gate is None and (self.r_norm is None or self.r_norm.weight is not None) and _prologue.runs_on(qkv, self.h):
            w = None if self.r_norm is None else self.r_norm.weight
            eps = 0.0 if self.r_norm is None else self.r_norm.eps
            outs = _fla._op("mixzoo.kernels.parallax_prologue", "prologue")(            # folded when stacking
                qkv, rr, w, self.h, eps, self.use_rope, self.use_rope and self.rope_r)
            q, k, v, r = (t.transpose(1, 2) for t in outs)
            return q, k, v, r, None
        q, k, v = (split_heads(t, self.h) for t in qkv.chunk(3, dim=-1))
        r = split_heads(rr, self.h)
        if self.r_norm is not None:
            r = self.r_norm(r)
        if self.use_rope:
            q, k = rope(q), rope(k)
            if self.rope_r:
                r = rope(r)
        gate = None
        if self.gate is not None:
            gate = torch.sigmoid(self.gate(x).float()).transpose(1, 2)          # (B, H, T)
            r = r * gate.unsqueeze(-1).to(r.dtype)
        return q, k, v, r.to(q.dtype), gate

    @torch.no_grad()
    def diagnostics(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The correction-to-output ratio |Σ_VK r| / |o_SA| (over the given examples), the stable rank
        |W_R|_F² / |W_R|_2² of the probe's projection, and the mean probe gate (with ``gate_r``)."""
        T = x.shape[1]
        x = x[: max(1, (1 << 26) // (self.h * T * T))]          # bound the T x T weights of the check
        q, k, v, r, gate = (t.float() if t is not None else None for t in self._qkvr(x.float()))
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        a = ((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        o_sa = a @ v
        corr = o_sa - parallax_reference(q, r, k, v)                               # = Σ_VK r
        sv = torch.linalg.svdvals(self.r_proj.weight.float())
        out = {"correction_ratio": corr.norm() / o_sa.norm().clamp_min(1e-30),
               "stable_rank_WR": sv.pow(2).sum() / sv[0].pow(2).clamp_min(1e-30)}
        if gate is not None:
            out["gate_r"] = gate.mean()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, r, _ = self._qkvr(x)
        fast = self._fast(q)
        if fast is not None:
            self.backend = "fla-parallel"
            D = v.shape[-1]
            tt = lambda t: t.transpose(1, 2)
            width = _fla.MIN_DOT
            if _tiles.runs_on(q):                  # fla's kernels at mixzoo's tiles (folded when stacking)
                # which can take narrow heads unpadded (masked in registers; MIXZOO_FLA_PAD=none, PARALLAX_PAD)
                width = _fla.fla_pad_width(PARALLAX_PAD)
                self.backend = "fla-parallel+tiles" + _fla.unpadded_suffix(D, PARALLAX_PAD)
                fast = _fla._op("mixzoo.kernels.parallax_tiles", "parallax")
            q, r, k, v = _fla.pad_heads(tt(q), tt(r), tt(k), tt(v), width=width)
            o = fast(q, r, k, v, scale=D ** -0.5)
            if o.shape[-1] != D:                   # padded: the zero columns dropped (unpadded, no slice's backward)
                o = o[..., :D]
            o = o.transpose(1, 2)
        else:
            self.backend = "torch"
            o = parallax_reference(q, r, k, v)
        return self.out(merge_heads(o.to(x.dtype)))

    def state_size(self, seq_len: int) -> int:
        return 2 * self.qkv.in_features * seq_len
