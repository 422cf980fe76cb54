"""Parallax's prologue, from its two projections to the four tensors its kernels take, as one Triton kernel each way
(``parallax_prologue_triton``).

The layer projects x to qkv (B, T, 3C) and to the probe's input rr (B, T, C); its kernels (fla's, at mixzoo's tiles)
take q, k, v and r as contiguous (B, T, H, D). In between: q and k rotated (``rope``), r normed per head (its RMS norm
with one weight of D) and rotated, and all four made contiguous in that layout. As PyTorch ops and mixzoo's separate
kernels that is a rotation kernel for each of q, k and r (each writing (B, H, T, D), r in float32), the norm's kernel
(after a copy of the strided head view, writing float32), a cast of r, four copies into (B, T, H, D), and backward the
same again plus the concatenation of the three gradients of qkv's chunks: about twenty passes over activations of the
layer's width. Here one kernel reads qkv and rr once and writes q, k, v, r once; backward one kernel reads their four
gradients and rr once and writes qkv's gradient whole, rr's, and the norm weight's partial sums.

The numbers are those of the composition (``prologue_torch``: rope and the norm in float32, each result rounded once
to its dtype) up to the order of the norm's row sums (the two halves of a head summed apart, then added) and of the
weight gradient's sum. ``prologue`` runs the kernels for a CUDA tensor (or under Triton's interpreter, as the CPU tests
run them) with an even head width whose half is a power of two, once they have matched ``prologue_torch`` on that
device (``usable``); ``runs_on`` says whether they will. ``MIXZOO_PARALLAX_PROLOGUE=torch`` turns them off (the
layer's ops as before), and so does ``torch.compile``. Under ``torch.func.vmap`` the K models fold into the groups,
one weight row each (``prologue.__mixzoo_fold__``). Imports nothing of mixzoo.

Softmax attention and LLA take q, k, v alone from the same projection: ``qkv_prologue`` is the kernels without r
(nothing of rr, r or the norm touched), q and k rotated, in place of two rotation kernels each way and, backward, the
concatenation of the three chunks' gradients; ``qkv_prologue_torch`` is its composition, ``qkv_runs_on`` says where
it runs, ``MIXZOO_QKV_PROLOGUE=torch`` turns it off alone (``mixzoo.models.common.qkv_heads``: the layers' split and
rotation as before).
"""
from __future__ import annotations

import os

import torch

from . import QKV_PROLOGUE, chosen, enabled
from ._check import DeviceCheck, interpreting, matches

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def prologue_torch(qkv: torch.Tensor, rr: torch.Tensor, w: torch.Tensor | None, H: int, eps: float, rope_qk: bool,
                   rope_r: bool, base: float = 10000.0):
    """The composition: qkv (B, T, 3C), rr (B, T, C), w (D,) or None -> q, k, v, r (B, T, H, D) contiguous in qkv's
    dtype: q, k rotated; r normed in float32 with w (without w: not normed), rotated, cast."""
    from .rmsnorm import rms_norm_torch
    from .rope import rope_torch
    B, T, C3 = qkv.shape
    q, k, v = (t.reshape(B, T, H, -1) for t in qkv.chunk(3, dim=-1))
    r = rr.reshape(B, T, H, -1)
    tt = lambda t: t.transpose(1, 2)                                           # noqa: E731
    if w is not None:
        r = rms_norm_torch(r, w, eps)
    if rope_qk:
        q, k = tt(rope_torch(tt(q), base)), tt(rope_torch(tt(k), base))
    if rope_r:
        r = tt(rope_torch(tt(r), base))
    return tuple(t.to(qkv.dtype).contiguous() for t in (q, k, v, r))


def qkv_prologue_torch(qkv: torch.Tensor, H: int, base: float = 10000.0):
    """The composition without r: qkv (B, T, 3C) -> q, k (rotated by ``rope_torch``), v (B, T, H, D) contiguous in
    qkv's dtype."""
    from .rope import rope_torch
    B, T, C3 = qkv.shape
    q, k, v = (t.reshape(B, T, H, -1) for t in qkv.chunk(3, dim=-1))
    q, k = (rope_torch(t.transpose(1, 2), base).transpose(1, 2) for t in (q, k))
    return tuple(t.contiguous() for t in (q, k, v))


def switch() -> str:
    return chosen("MIXZOO_PARALLAX_PROLOGUE")


def qkv_switch(default: str | None = None) -> str:
    """``MIXZOO_QKV_PROLOGUE``; unset, the calling mechanism's ``default`` (``models.common.qkv_heads``: softmax's
    ``torch``, LLA's ``fused``), else ``QKV_PROLOGUE[0]``."""
    return os.environ.get("MIXZOO_QKV_PROLOGUE") or default or QKV_PROLOGUE[0]


def _runs(qkv: torch.Tensor, H: int, sw: str) -> bool:
    C = qkv.shape[-1] // 3
    D = C // H if H and C % H == 0 else 0
    half = D // 2
    return (sw == "fused" and enabled() and (qkv.is_cuda or interpreting()) and qkv.dim() == 3
            and D >= 2 and D % 2 == 0 and half & (half - 1) == 0 and qkv.dtype in _DTYPES
            and not torch.compiler.is_compiling() and usable((qkv.device.index or 0) if qkv.is_cuda else -1))


def runs_on(qkv: torch.Tensor, H: int) -> bool:
    """Whether ``prologue`` of qkv (B, T, 3C) with H heads takes the kernels (qkv may be a tensor vmap batches)."""
    return _runs(qkv, H, switch())


def qkv_runs_on(qkv: torch.Tensor, H: int, use_rope: bool = True, default: str | None = None) -> bool:
    """Whether ``qkv_prologue`` of qkv (B, T, 3C) with H heads takes the kernels: only for a layer that rotates q and
    k (without the rotation its q, k, v are views of the projection, no pass at all); ``default``: ``qkv_switch``'s."""
    return use_rope and _runs(qkv, H, qkv_switch(default))


class _Prologue(torch.autograd.Function):
    """qkv (G, R, 3C), rr (G, R, C), w (G, D) or None -> q, k, v, r (G, R, C); without rr (None) q, k, v alone."""

    @staticmethod
    def forward(ctx, qkv, rr, w, T, H, eps, rope_qk, rope_r):
        from . import RAN, parallax_prologue_triton
        from .rope_triton import inv_freq
        RAN.add("parallax_prologue" if rr is not None else "qkv_prologue")
        qkv = qkv.contiguous()
        rr = None if rr is None else rr.contiguous()
        w = None if w is None else w.contiguous()
        G, R, C3 = qkv.shape
        inv = inv_freq(C3 // 3 // H // 2, 10000.0, qkv.device)
        q, k, v, r, rstd = parallax_prologue_triton.forward(qkv, rr, w, inv, T, H, eps, rope_qk, rope_r)
        ctx.save_for_backward(rr, w, rstd, inv)
        ctx.shape = (G, R, C3 // 3), T, H, rope_qk, rope_r, qkv.dtype
        return (q, k, v) if r is None else (q, k, v, r)

    @staticmethod
    def backward(ctx, *grads):
        from . import parallax_prologue_triton
        rr, w, rstd, inv = ctx.saved_tensors
        shape, T, H, rope_qk, rope_r, qkv_dtype = ctx.shape
        dts = (qkv_dtype,) * 3 + (() if rr is None else (rr.dtype,))
        grads = [torch.zeros(shape, dtype=dt, device=inv.device) if g is None else g.contiguous()
                 for g, dt in zip(grads, dts)]
        dqkv, drr, dw = parallax_prologue_triton.backward(*grads[:3], grads[3] if rr is not None else None, rr, w,
                                                           rstd, inv, T, H, rope_qk, rope_r, qkv_dtype)
        return dqkv, drr, (None if dw is None else dw.to(w.dtype)), None, None, None, None, None


def _heads(ts, B: int, T: int, H: int):
    return tuple(t.view(B, T, H, -1) for t in ts)


def prologue(qkv: torch.Tensor, rr: torch.Tensor, w: torch.Tensor | None, H: int, eps: float, rope_qk: bool,
             rope_r: bool):
    """qkv (B, T, 3C), rr (B, T, C), w (D,) or None -> q, k, v, r (B, T, H, D) contiguous in qkv's dtype (module
    docstring): the kernels where ``runs_on(qkv, H)`` and not under an unfolded vmap, else ``prologue_torch``."""
    if torch._C._are_functorch_transforms_active() or not runs_on(qkv, H):
        return prologue_torch(qkv, rr, w, H, eps, rope_qk, rope_r)
    B, T, C3 = qkv.shape
    outs = _Prologue.apply(qkv.reshape(1, B * T, C3), rr.reshape(1, B * T, -1), None if w is None else w.reshape(1, -1),
                           T, H, float(eps), bool(rope_qk), bool(rope_r))
    return _heads(outs, B, T, H)


def _front(K: int, t: torch.Tensor, d: int | None) -> torch.Tensor:
    return t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(K, *t.shape)


def _fold(K: int, in_dims: tuple, qkv, rr, w, H, eps, rope_qk, rope_r):
    """vmap over K models (``mixzoo.train.vmapfold``): their tokens as K groups, their norm weights as K rows."""
    qkv, rr = _front(K, qkv, in_dims[0]), _front(K, rr, in_dims[1])
    w = None if w is None else _front(K, w, in_dims[2])
    B, T, C3 = qkv.shape[1:]
    if not runs_on(qkv[0], H):
        outs = [prologue_torch(qkv[m], rr[m], None if w is None else w[m], H, eps, rope_qk, rope_r) for m in range(K)]
        return tuple(torch.stack(ts) for ts in zip(*outs)), (0, 0, 0, 0)
    outs = _Prologue.apply(qkv.reshape(K, B * T, C3), rr.reshape(K, B * T, -1), w, T, H, float(eps), bool(rope_qk),
                           bool(rope_r))
    return tuple(t.view(K, B, T, H, -1) for t in outs), (0, 0, 0, 0)


prologue.__mixzoo_fold__ = _fold


def qkv_prologue(qkv: torch.Tensor, H: int, default: str | None = None):
    """qkv (B, T, 3C) -> q, k (rotated), v (B, T, H, D) contiguous in qkv's dtype, the numbers of
    ``qkv_prologue_torch``: the kernels without r where ``qkv_runs_on(qkv, H, default=default)`` and not under an
    unfolded vmap, else that composition."""
    if torch._C._are_functorch_transforms_active() or not qkv_runs_on(qkv, H, default=default):
        return qkv_prologue_torch(qkv, H)
    B, T, C3 = qkv.shape
    return _heads(_Prologue.apply(qkv.reshape(1, B * T, C3), None, None, T, H, 0.0, True, False), B, T, H)


def _qkv_fold(K: int, in_dims: tuple, qkv, H, default=None):
    """vmap over K models: their tokens as K groups of one call."""
    qkv = _front(K, qkv, in_dims[0])
    B, T, C3 = qkv.shape[1:]
    if not qkv_runs_on(qkv[0], H, default=default):
        return tuple(torch.stack(ts) for ts in zip(*(qkv_prologue_torch(t, H) for t in qkv))), (0, 0, 0)
    outs = _Prologue.apply(qkv.reshape(K, B * T, C3), None, None, T, H, 0.0, True, False)
    return tuple(t.view(K, B, T, H, -1) for t in outs), (0, 0, 0)


qkv_prologue.__mixzoo_fold__ = _qkv_fold


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``prologue_torch``'s and ``qkv_prologue_torch``'s outputs and gradients on this device
    (-1: the interpreter), checked once (``_check.DeviceCheck``): float32 and bf16, heads of 8 and 16, with and
    without the norm and r's rotation, without r, two groups of a partial block of tokens."""
    return _USABLE(device_index)


def _matches_here(device_index: int) -> bool:
    from . import parallax_prologue_triton as P
    from .rope_triton import inv_freq
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    B, T = 2, 37
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        for H, D, has_r, norm, rope_qk, rope_r in ((3, 8, True, True, True, True), (2, 16, True, True, True, False),
                                                   (3, 8, True, False, False, True), (3, 8, False, False, True, False),
                                                   (2, 16, False, False, True, False)):
            C = H * D
            qkv = torch.randn(B, T, 3 * C, generator=gen).to(dt).to(dev)
            rr = (torch.randn(B, T, C, generator=gen) * 2).to(dt).to(dev) if has_r else None
            w = (1 + 0.3 * torch.randn(B, D, generator=gen)).to(dev) if norm else None
            gs = [torch.randn(B, T, H, D, generator=gen).to(dt).to(dev) for _ in range(3 + has_r)]
            ins = [t.double().requires_grad_() for t in (qkv, rr, w) if t is not None]
            per = [prologue_torch(ins[0][b:b + 1], ins[1][b:b + 1], ins[2][b] if norm else None, H, 1e-6, rope_qk,
                                  rope_r) if has_r else qkv_prologue_torch(ins[0][b:b + 1], H) for b in range(B)]
            want = [torch.stack(ts).squeeze(1) for ts in zip(*per)]
            wants = torch.autograd.grad(want, ins, [g.double() for g in gs])
            inv = inv_freq(D // 2, 10000.0, dev)
            q, k, v, r, rstd = P.forward(qkv, rr, w, inv, T, H, 1e-6, rope_qk, rope_r)
            gs = [g.reshape(B, T, C).contiguous() for g in gs]
            dqkv, drr, dw = P.backward(*gs[:3], gs[3] if has_r else None, rr, w, rstd, inv, T, H, rope_qk, rope_r, dt)
            got = [t.view(B, T, H, D) for t in (q, k, v, r) if t is not None] + [t for t in (dqkv, drr, dw) if t is not None]
            if len(got) != len(want) + len(wants) or any(a.dtype != dt for a in got[:len(got) - norm]):
                return False
            if not all(matches(a, b, tol) for a, b in zip(got, [t.detach() for t in want] + list(wants))):
                return False
    return True


_USABLE = DeviceCheck(_matches_here)
