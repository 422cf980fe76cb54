"""Local Linear Attention: each query solves a softmax-weighted local linear regression.

The exact estimator (``mixzoo.kernels.lla.lla_reference``) runs everywhere; on a GPU the
Triton kernel of ``mixzoo.kernels.lla`` is used when it is present and ``backend="auto"``.
``solve`` picks the kernel's solve of each query's system (``mixzoo.kernels.lla.triton_lla``: "direct",
explicit in registers, for heads of at most 8 dims; "cg", conjugate gradients over the keys; default
"auto", the first where it applies); the backend a run records names the one used (``triton-direct``,
``triton-cg``). The ridge λ is a fixed knob, or learned
per head (softplus, initialized at ``ridge``, kept at or above ``MIN_LEARNED_RIDGE``, the smallest λ the
kernel is tested at).

The kernel compiles a precision level from the smallest λ of a launch (smaller λ, worse
conditioned systems, more careful arithmetic). Reading λ from the device every step would stall
the host, so the level is worked out without that: for a fixed ridge once per change of the stored
value (tracked by the parameter's version counter), for a learned ridge from a copy of min λ taken
asynchronously at the previous step and halved as a margin.

Stacked training (``mixzoo.train.stacked``) runs K models' layers under ``torch.func.vmap``: the
kernel is looked up through ``mixzoo.models._fla._op``, which ``mixzoo.train.vmapfold.folding``
makes fold the K models into the kernel's batch, and the precision level is taken over the K
models' ridges together (the stacked tensor under vmap's wrapper), so no step reads the device.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.lla import lla_reference
from ..registry import register_mixer
from .common import merge_heads, qkv_heads


def lla_core(q, k, v, *, ridge: float = 1.0, scale=None):
    """Causal LLA on (..., T, D) inputs; the exact solve."""
    return lla_reference(q, k, v, ridge=ridge, scale=scale)


MIN_LEARNED_RIDGE = 1e-2
# q, k, v by the qkv prologue kernel on the GPU where ``MIXZOO_QKV_PROLOGUE`` is unset (``common.qkv_heads``): its
# (B, T, H, D) heads read through their strides by the kernels (``MIXZOO_LLA_HEADS=strided``, the default) need no
# copy; 1.03-1.07x the stacked+graphed K = 6 step of the padded copies at MAD's lengths on an H200, 2026-12-06
# (benchmarks/calls-2026-12-06f)
QKV_PROLOGUE_DEFAULT = "fused"


@functools.cache
def _precision_eager():
    """``LocalLinearAttention.precision`` kept out of torch.compile graphs (host-side
    bookkeeping); made on first use, since torch's compiler pulls in triton."""
    return torch.compiler.disable(LocalLinearAttention.precision)


# Heads of at most this many dims have the kernel's explicit solve (triton_lla.DIRECT_MAX_DIM, kept here so that
# building a layer does not import Triton; tests/test_lla_kernel_interpret.py checks the two agree).
DIRECT_MAX_DIM = 8


def _fast_lla(x: torch.Tensor):
    """The Triton kernel's entry point for inputs like ``x``, or None where it is absent or cannot
    run (off CUDA, unless Triton's interpreter is on: ``TRITON_INTERPRET=1``, as the CPU tests
    run it). Looked up through ``_fla._op`` (a cached import) so that stacked training folds it."""
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    from . import _fla
    return _fla._op("mixzoo.kernels.lla.triton_lla", "lla")


def _models_together(t: torch.Tensor) -> torch.Tensor:
    """Under vmap (stacked training), the tensor of all K models that ``t`` is one model's view of;
    else ``t``. For host-side bookkeeping over every model at once (no gradient flows through it)."""
    from torch._C import _functorch as ft
    while ft.is_batchedtensor(t):
        t = ft.get_unwrapped(t)
    return t


@register_mixer("lla", core=lla_core, core_grid={"ridge": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1], "scale": [8.0, 32.0, 128.0]},
                search_space={
    "lr": ("log", 1e-4, 3e-2),
    "weight_decay": ("cat", [0.0, 0.1]),
    "ridge": ("log", 1e-2, 1e2),
})
class LocalLinearAttention(nn.Module):
    """Local Linear Attention (Zuo et al.): softmax-weighted local linear regression per query."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0,
                 ridge: float = 1.0, learn_ridge: bool = False, rope: bool = True,
                 backend: str = "auto", solve: str = "auto"):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"backend={backend!r}; allowed: auto, torch, triton")
        if solve not in ("auto", "cg", "direct"):
            raise ValueError(f"solve={solve!r}; allowed: auto, cg, direct")
        if solve == "direct" and d_model // num_heads > DIRECT_MAX_DIM:
            raise ValueError(f"solve='direct' needs heads of at most {DIRECT_MAX_DIM} dims, got {d_model // num_heads}")
        if isinstance(ridge, (bool, str)) or not 0 < float(ridge) <= 700:
            # softplus^{-1} below needs ridge > 0 and overflows past ~700 (nan fails the range too)
            raise ValueError(f"ridge={ridge!r}; must be a number in (0, 700]")
        self.h, self.use_rope, self.requested = num_heads, rope, backend
        # the kernel's solve, resolved here so that the row's backend names it ("auto" picks as the kernel does)
        self.solve = solve if solve != "auto" else ("direct" if d_model // num_heads <= DIRECT_MAX_DIM else "cg")
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        init = math.log(math.expm1(ridge))           # softplus^{-1}(ridge)
        self.ridge_raw = nn.Parameter(torch.full((num_heads,), init), requires_grad=learn_ridge)
        self.backend = "torch"
        self._level_key, self._level, self._lam_host = None, None, None

    def ridge(self) -> torch.Tensor:
        lam = F.softplus(self.ridge_raw)
        return lam.clamp_min(MIN_LEARNED_RIDGE) if self.ridge_raw.requires_grad else lam

    def precision(self, lam: torch.Tensor) -> int:
        """The kernel's precision level for ridge ``lam`` without a per-step device read."""
        from ..kernels.lla.triton_lla import precision_level
        raw = _models_together(self.ridge_raw)
        if not raw.requires_grad:
            key = (raw._version, raw.data_ptr())
            if key != self._level_key:      # first call, or the stored ridge was overwritten
                low = F.softplus(raw.detach()).min()
                self._level_key, self._level = key, precision_level(float(low))
            return self._level
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # the level of a learned ridge is read on the host at every step: a CUDA graph would
            # keep the captured one (the graphed step mode falls back to eager on this error)
            raise RuntimeError("lla: a learned ridge picks the kernel's precision on the host each step; "
                               "such a step cannot be captured in a CUDA graph")
        low = _models_together(lam.detach()).min().float()
        if self._lam_host is None:          # first step: one read
            self._lam_host = torch.empty((), pin_memory=low.is_cuda)
            self._lam_host.copy_(low)
        level = precision_level(0.5 * float(self._lam_host))
        self._lam_host.copy_(low, non_blocking=True)   # lands by the next step; read then
        return level

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the kernel reads the heads through their strides: the projection's views, or with rotary positions on the
        # GPU one prologue kernel's (B, T, H, D) output; its own output is (B, T, H, D) too, so merging is a view
        q, k, v = qkv_heads(self.qkv(x), self.h, self.use_rope, prologue=QKV_PROLOGUE_DEFAULT)
        lam = self.ridge()[None, :, None]                  # (1, H, 1) -> per head
        fast = _fast_lla(x) if (self.requested == "triton" or (self.requested == "auto" and x.is_cuda)) else None
        if self.requested == "triton" and fast is None:
            raise RuntimeError("lla: backend='triton' asked for but the kernel is unavailable "
                               "(it needs a CUDA device, or Triton's interpreter: TRITON_INTERPRET=1)")
        if fast is not None:
            self.backend = f"triton-{self.solve}"
            # λ per (sequence, head), broadcast over the positions inside the kernel: stacked, the K models' λ fold
            # into a (K·B, H, 1) copy of a few floats in place of a (K·B, H, T) one
            o = fast(q, k, v, ridge=lam.expand(x.shape[0], -1, 1), prec=_precision_eager()(self, lam),
                     solve=self.solve)
        else:
            self.backend = "torch"
            o = lla_reference(q, k, v, ridge=lam)
        return self.out(merge_heads(o.to(x.dtype)))

    @torch.no_grad()
    def diagnostics(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The smallest ridge of the layer (learned or fixed)."""
        return {"ridge_min": self.ridge().min()}

    def state_size(self, seq_len: int) -> int:
        d = self.qkv.in_features
        return 2 * d * seq_len
