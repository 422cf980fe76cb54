"""Recurrent scans at narrow heads, one position at a time (recurrent_triton): gdn's gated delta rule and GLA.

The gated delta rule (``delta_rule_rec``):

    S_t = a_t S_{t-1} (I - β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ,   o_t = scale · S_t q̂_t,   a_t = exp(g_t),

with q̂, k̂ the L2-normalized q, k (``l2norm``, F.normalize's eps). Gated DeltaNet's core (``models.gdn``) at the
mad recipe's heads of 8: fla's chunked kernels need every dot dimension >= 16, so those heads went to fla padded
to 16 in memory, through a dozen launches a layer whose tiles are mostly idle at that width. Here the state of a
head is 64 floats in registers, a program walks its sequence once forward and once backward, and the backward
reads each step's state back from the forward's (``states``, B·T·H·DV·DK float32: 3.2 GB a layer at 768
sequences of 1024 with 16 heads of 8).

GLA (``gla_rec``): S_t = S_{t-1} diag(exp g_t) + v_t k_tᵀ, o_t = scale · S_t q_t, with a log-decay per key
dimension; GLA's keys of 4 and values of 8 at the mad recipe went to fla padded to 16 likewise.

``delta_rule_rec_torch`` and ``gla_rec_torch`` are the references: the same recurrences, step by step in PyTorch
(float32, float64 for float64 inputs), differentiated by autograd. ``delta_rule_rec`` and ``gla_rec`` run the
kernels for CUDA tensors (or under Triton's interpreter) once they have matched the references on that device
(``usable``), else the references. Their arguments all carry the batch, so under stacking
(``mixzoo.train.vmapfold``) the K models fold into the batch. Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ._check import DeviceCheck, interpreting, matches

#: the widest head the kernels take: a state of MAX_HEAD x MAX_HEAD floats per head in registers
MAX_HEAD = 16
EPS = 1e-6


def delta_rule_rec_torch(q, k, v, g, beta, scale: float, l2norm: bool = True) -> torch.Tensor:
    """q, k (B, T, H, DK), v (B, T, H, DV), g, beta (B, T, H) -> o (B, T, H, DV) in q's dtype; computed in
    float32 (float64 for float64 q)."""
    out_dtype = q.dtype
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (t.to(cdt) for t in (q, k, v, g, beta))
    if l2norm:
        q, k = F.normalize(q, dim=-1, eps=EPS), F.normalize(k, dim=-1, eps=EPS)
    B, T, H, DK = q.shape
    S = q.new_zeros(B, H, v.shape[-1], DK)
    out = []
    for t in range(T):
        a, b = g[:, t].exp()[..., None, None], beta[:, t, :, None]
        kt = k[:, t]
        u = v[:, t] - a[..., 0] * (S @ kt.unsqueeze(-1)).squeeze(-1)
        S = a * S + (b * u).unsqueeze(-1) * kt.unsqueeze(-2)
        out.append((S @ q[:, t].unsqueeze(-1)).squeeze(-1) * scale)
    return torch.stack(out, 1).to(out_dtype)


class _Rec(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, l2norm):
        from . import recurrent_triton as K
        store = any(ctx.needs_input_grad[:5])
        o, states = K.delta_forward(q, k, v, g, beta, scale, EPS, l2norm, store)
        if store:
            ctx.save_for_backward(q, k, v, g, beta, states)
        ctx.scale, ctx.l2norm = scale, l2norm
        return o

    @staticmethod
    def backward(ctx, do):
        from . import recurrent_triton as K
        q, k, v, g, beta, states = ctx.saved_tensors
        dq, dk, dv, dg, db = K.delta_backward(q, k, v, g, beta, states, do, ctx.scale, EPS, ctx.l2norm)
        return dq, dk, dv, dg.to(g.dtype), db, None, None


def gla_rec_torch(q, k, v, g, scale: float) -> torch.Tensor:
    """q, k, g (B, T, H, DK), v (B, T, H, DV) -> o (B, T, H, DV) in q's dtype; computed in float32 (float64 for
    float64 q)."""
    out_dtype = q.dtype
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, g = (t.to(cdt) for t in (q, k, v, g))
    B, T, H, DK = q.shape
    S = q.new_zeros(B, H, v.shape[-1], DK)
    out = []
    for t in range(T):
        S = S * g[:, t].exp().unsqueeze(-2) + v[:, t].unsqueeze(-1) * k[:, t].unsqueeze(-2)
        out.append((S @ q[:, t].unsqueeze(-1)).squeeze(-1) * scale)
    return torch.stack(out, 1).to(out_dtype)


class _GlaRec(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale):
        from . import recurrent_triton as K
        store = any(ctx.needs_input_grad[:4])
        o, states = K.gla_forward(q, k, v, g, scale, store)
        if store:
            ctx.save_for_backward(q, k, v, g, states)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        from . import recurrent_triton as K
        q, k, v, g, states = ctx.saved_tensors
        return (*K.gla_backward(q, k, v, g, states, do, ctx.scale), None)


def _fits(x: torch.Tensor, dk: int, dv: int) -> bool:
    """Heads of at most ``MAX_HEAD``, x on a CUDA device (or the interpreter on), not under torch.compile, and the
    kernels matched on that device."""
    return (dk <= MAX_HEAD and dv <= MAX_HEAD and (x.is_cuda or interpreting()) and not torch.compiler.is_compiling()
            and usable((x.device.index or 0) if x.is_cuda else -1))


def runs_on(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``delta_rule_rec`` and ``gla_rec`` take the kernels for these heads on q's device."""
    return _fits(q, q.shape[-1], v.shape[-1])


def wanted(x: torch.Tensor, dk: int, dv: int, switch: str) -> bool:
    """Whether a layer on x with key and value heads of dk, dv takes the scans: the named switch (``MIXZOO_GDN``,
    ``MIXZOO_GLA_CORE``) not ``fla``, and ``_fits``."""
    return os.environ.get(switch) != "fla" and _fits(x, dk, dv)


def delta_rule_rec(q, k, v, g, beta, scale: float, l2norm: bool = True) -> torch.Tensor:
    """The kernels where ``runs_on``, else the reference (same signature as ``delta_rule_rec_torch``). Under
    autocast the kernels take q, k, v as given (the projection's dtype) and write o in q's dtype."""
    if not runs_on(q, v):
        return delta_rule_rec_torch(q, k, v, g, beta, scale, l2norm)
    from . import RAN
    RAN.add("delta_rec")
    return _Rec.apply(q, k, v, g, beta, float(scale), bool(l2norm))


def gla_rec(q, k, v, g, scale: float) -> torch.Tensor:
    """The kernels where ``runs_on``, else the reference (same signature as ``gla_rec_torch``)."""
    if not runs_on(q, v):
        return gla_rec_torch(q, k, v, g, scale)
    from . import RAN
    RAN.add("gla_rec")
    return _GlaRec.apply(q, k, v, g, float(scale))


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give the references' outputs and gradients on this device (-1: the interpreter),
    checked once: float32 and bf16 inputs, head blocks that are not full (3 heads; 5 heads of 16 in blocks of 4),
    heads of 8, 4 x 8 and 16 (``MAX_HEAD``), the delta rule with and without the L2 norm, lengths of 37 and 19."""
    return _USABLE(device_index)


def _agrees(ref, op, ins, do, dt, dev, tol, *args) -> bool:
    """``op`` (a kernel's autograd Function) on ``ins`` (q, k, v in ``dt``, the gates in float32, on ``dev``) against
    ``ref`` on them in float64: output and every input's gradient within ``tol`` (norm-relative)."""
    want_ins = [t.double().requires_grad_() for t in ins]
    want = ref(*want_ins, *args)
    wants = torch.autograd.grad(want, want_ins, do.double())
    got_ins = [(t.to(dt) if i < 3 else t).to(dev).requires_grad_() for i, t in enumerate(ins)]
    got = op(*got_ins, *args)
    gots = torch.autograd.grad(got, got_ins, do.to(dt).to(dev))
    return all(matches(a, r, tol) for a, r in [(got, want.detach()), *zip(gots, wants)])


def _matches_here(device_index: int) -> bool:
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dt, tol, (B, T, H, DK, DV), l2 in ((torch.float32, 1e-4, (2, 37, 3, 8, 8), True),
                                           (torch.bfloat16, 2e-2, (2, 37, 3, 8, 8), True),
                                           (torch.float32, 1e-4, (1, 37, 2, 4, 8), False),
                                           (torch.float32, 1e-4, (1, 19, 5, 16, 16), True)):
        q, k = (torch.randn(B, T, H, DK, generator=gen) for _ in range(2))
        v = torch.randn(B, T, H, DV, generator=gen)
        if not l2:
            k = F.normalize(k, dim=-1)
        g = -torch.rand(B, T, H, generator=gen) * 0.5
        beta = torch.rand(B, T, H, generator=gen) * 1.5
        do = torch.randn(B, T, H, DV, generator=gen)
        if not (_agrees(delta_rule_rec_torch, _Rec.apply, (q, k, v, g, beta), do, dt, dev, tol, 0.35, l2)
                # GLA at the same sizes, log-decays per key dimension
                and _agrees(gla_rec_torch, _GlaRec.apply, (q, k, v, -torch.rand(B, T, H, DK, generator=gen) * 0.5),
                            do, dt, dev, tol, 0.35)):
            return False
    return True


_USABLE = DeviceCheck(_matches_here)
