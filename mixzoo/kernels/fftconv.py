"""Hyena's gated long-convolution step, out = g ⊙ (h ∗ v + b ⊙ v), with h ∗ v each channel's causal linear
convolution by FFTs of size n >= 2T, as one autograd Function (``gated_fft_conv``) beside the composition autograd
differentiates (``gated_fft_conv_torch``, the reference).

Why: the composition's backward is the generic one of each operator it is made of, and at length 1024 that glue
was half of Hyena's stacked step on the H200 (benchmarks/h200-2026-12-05c/profile-1024.md: ``aten::mul`` 21.5 ms
and ``aten::copy_`` 21.1 ms of an 86 ms step, beside 8 ms of FFTs): rfft's zero-padding and irfft's slice become
``constant_pad_nd``, ``new_zeros`` and ``slice_backward`` copies at the padded size, the complex product's
gradients ``conj`` copies and float32 casts. Counted on the CPU (benchmarks/layer_bytes.py's dispatch log, a
Hyena layer at length 1024, batch 8), the layer wrote 473 MiB in one forward and backward.

The Function's backward is the convolution's adjoint written out, with the forward's spectra kept:
  dz = dout ⊙ g,  dg = dout ⊙ z (z = h ∗ v + b ⊙ v, kept),  db = Σ_{batch, t} dz ⊙ v,
  dv = b ⊙ dz + irfft(rfft(dz) · conj(H))[:T]       (the causal convolution's adjoint: a correlation),
  dh = irfft(Σ_batch rfft(dz) · conj(V))[:T]          (V = rfft(v), kept from the forward),
so each FFT of the backward is taken once and no padded gradient is formed. The numbers are those of the
reference up to float32 rounding (its forward's operators are the same ones; the backward sums in another order).

Shapes: v (B, C, T) float32 or bf16, g like v (any strides), h (C, T), b (C,) -> out (B, C, T) float32 (g's
product with a float32 z, as PyTorch promotes it). Under ``torch.func.vmap`` (stacked training) the K models are
one call (``_fold``: K groups, each with its own filters and biases). ``runs_on(v)``: by default (or
``MIXZOO_HYENA_CONV=fused``), on any device; with ``MIXZOO_HYENA_CONV=torch`` the model keeps the composition.
Side by side on an H100 (2026-12-06, benchmarks/h100-2026-12-06/), Hyena's stacked+graphed training step (6
models, MAD's baseline shape) with the Function against the composition: 1.16x at length 512, 1.17x at 1024.
Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch


def fft_size(T: int) -> int:
    """The power of two >= 2T: a circular convolution of that size is the linear one on the first T outputs."""
    return 1 << (2 * T - 1).bit_length()


def fft_causal_conv(u: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """y[..., c, t] = Σ_{s<=t} h[c, t-s] u[..., c, s], u (..., C, T), h (C, T); float32 (float64 for float64)."""
    T = u.shape[-1]
    n = fft_size(T)
    dt = torch.float64 if u.dtype == torch.float64 else torch.float32
    y = torch.fft.irfft(torch.fft.rfft(u.to(dt), n=n) * torch.fft.rfft(h.to(dt), n=n), n=n)
    return y[..., :T]


def gated_fft_conv_torch(v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The reference: g ⊙ (fft_causal_conv(v, h) + b ⊙ v), v in float32 (float64 stays), differentiated by autograd."""
    v = v if v.dtype == torch.float64 else v.float()
    return g * torch.addcmul(fft_causal_conv(v, h), v, b[:, None])


def runs_on(v: torch.Tensor) -> bool:
    """Whether ``gated_fft_conv`` of v takes the Function (v may be a tensor vmap batches)."""
    return os.environ.get("MIXZOO_HYENA_CONV") != "torch" and not torch.compiler.is_compiling()


def _gate_grads(ctx, dout, g, z, vf, b):
    """The gate's and bias's part of either step's backward: dz = dout ⊙ g, dg = dout ⊙ z, db = Σ_{batch, t} dz ⊙ v."""
    dz = dout * g
    dg = (dout * z).to(g.dtype) if ctx.needs_input_grad[1] else None
    db = (dz * vf).sum((1, 3)).to(b.dtype) if ctx.needs_input_grad[3] else None
    return dz, dg, db


class _GatedFFTConv(torch.autograd.Function):
    """v (G, B, C, T), g like v, h (G, C, T), b (G, C) -> (G, B, C, T) float32 (float64 for float64 v)."""

    @staticmethod
    def forward(ctx, v, g, h, b):
        from . import RAN
        RAN.add("fftconv")
        T = v.shape[-1]
        n = fft_size(T)
        dt = torch.float64 if v.dtype == torch.float64 else torch.float32
        vf = v.to(dt)
        V = torch.fft.rfft(vf, n=n)                                     # (G, B, C, F)
        H = torch.fft.rfft(h.to(dt), n=n).unsqueeze(1)                  # (G, 1, C, F)
        z = torch.addcmul(torch.fft.irfft(V * H, n=n)[..., :T], vf, b.to(dt)[:, None, :, None])
        ctx.save_for_backward(vf, g, V, H, z, b)
        ctx.dtypes = v.dtype, h.dtype
        return g * z

    @staticmethod
    def backward(ctx, dout):
        vf, g, V, H, z, b = ctx.saved_tensors
        v_dtype, h_dtype = ctx.dtypes
        T = vf.shape[-1]
        n = fft_size(T)
        dz, dg, db = _gate_grads(ctx, dout, g, z, vf, b)
        DZ = torch.fft.rfft(dz, n=n)
        dv = dh = None
        if ctx.needs_input_grad[0]:
            dv = torch.addcmul(torch.fft.irfft(DZ * H.conj(), n=n)[..., :T], dz, b.to(dz.dtype)[:, None, :, None])
            dv = dv.to(v_dtype)
        if ctx.needs_input_grad[2]:
            dh = torch.fft.irfft(torch.linalg.vecdot(V, DZ, dim=1), n=n)[..., :T].to(h_dtype)   # Σ_batch conj(V) DZ
        return dv, dg, dh, db


def gated_fft_conv(v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v (B, C, T), g like v, h (C, T), b (C,) -> g ⊙ (h ∗ v + b ⊙ v), (B, C, T) float32: the Function where
    ``runs_on(v)``, else the reference."""
    if torch._C._are_functorch_transforms_active() or not runs_on(v):
        return gated_fft_conv_torch(v, g, h, b)
    return _GatedFFTConv.apply(v[None], g[None], h[None], b[None]).squeeze(0)   # squeeze: its backward is a view


def _folder(fn, conv, fused):
    """The vmap fold (``mixzoo.train.vmapfold``) of ``fn``: K models in one call of K groups, model k's sequences
    reading its filters h[k] and biases b[k]; ``conv`` the reference convolution, ``fused()`` whether the Function
    runs. ``conv(v, h)`` takes v (K, B, C, T) and h (K, C, T)."""
    def fold(K: int, in_dims: tuple, v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor):
        def front(t, d):
            return t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(K, *t.shape)
        v, g, h, b = (front(t, d) for t, d in zip((v, g, h, b), in_dims))
        if not fused(v):        # the reference, each model's filters and biases broadcast over its sequences
            vf = v if v.dtype == torch.float64 else v.float()
            return g * torch.addcmul(conv(vf, h), vf, b[:, None, :, None]), 0
        return fn.__mixzoo_function__.apply(v, g, h, b), 0
    return fold


gated_fft_conv.__mixzoo_function__ = _GatedFFTConv
gated_fft_conv.__mixzoo_fold__ = _folder(gated_fft_conv, lambda v, h: fft_causal_conv(v, h[:, None]), runs_on)


# ---------------------------------------------------------------------------------------------------------------
# The same step at the lengths where Hyena convolves by products with each channel's causal Toeplitz matrix
# (mixzoo.models.hyena.DIRECT_MAX_LEN): off by default until it is timed on a GPU (MIXZOO_HYENA_TOEPLITZ=fused).

def toeplitz(h: torch.Tensor) -> torch.Tensor:
    """h (..., C, T) -> M (..., C, T, T) with M[c, t, s] = h[c, t-s] for s <= t, else 0: windows of h padded by T-1
    zeros in front, flipped."""
    T = h.shape[-1]
    return torch.nn.functional.pad(h, (T - 1, 0)).unfold(-1, T, 1).flip(-1)


def toeplitz_causal_conv(u: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """fft_causal_conv's sums as products with the Toeplitz matrices: u (B, C, T) with h (C, T), or u (G, B, C, T)
    with h (G, C, T) (G groups of filters); float32 (float64 for float64), autocast off. One batched product per
    channel with the batch as its columns (einsum: no copy of a matrix per sequence)."""
    dt = torch.float64 if u.dtype == torch.float64 else torch.float32
    eq = "cts,bcs->bct" if h.dim() == 2 else "gcts,gbcs->gbct"
    with torch.autocast(u.device.type, enabled=False):
        return torch.einsum(eq, toeplitz(h.to(dt)), u.to(dt))


def diagonal_sums(m: torch.Tensor) -> torch.Tensor:
    """m (..., T, T) -> d (..., T) with d[k] = Σ_t m[t, t-k]: ``toeplitz``'s adjoint, as autograd forms it (the
    flip's copy, then ``unfold``'s backward, which sums the overlapping windows into h padded by T-1 in front)."""
    T = m.shape[-1]
    lead = m.shape[:-2]
    full = torch.ops.aten.unfold_backward(m.flip(-1), [*lead, 2 * T - 1], m.dim() - 2, T, 1)
    return full[..., T - 1:]


def runs_on_toeplitz(v: torch.Tensor) -> bool:
    """Whether ``gated_toeplitz_conv`` of v takes the Function: with ``MIXZOO_HYENA_TOEPLITZ=fused``."""
    return os.environ.get("MIXZOO_HYENA_TOEPLITZ") == "fused" and not torch.compiler.is_compiling()


def gated_toeplitz_conv_torch(v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The reference: g ⊙ (toeplitz_causal_conv(v, h) + b ⊙ v), v in float32 (float64 stays), by autograd."""
    v = v if v.dtype == torch.float64 else v.float()
    return g * torch.addcmul(toeplitz_causal_conv(v, h), v, b[:, None])


class _GatedToeplitzConv(torch.autograd.Function):
    """v (G, B, C, T), g like v, h (G, C, T), b (G, C) -> (G, B, C, T) float32 (float64 for float64 v). The
    backward: dz = dout ⊙ g, dg = dout ⊙ z, db = Σ dz ⊙ v, dv = b ⊙ dz + Mᵀ dz, dh = the diagonal sums of
    Σ_batch dz vᵀ (one batched product per channel; M kept from the forward)."""

    @staticmethod
    def forward(ctx, v, g, h, b):
        from . import RAN
        RAN.add("toeplitzconv")
        dt = torch.float64 if v.dtype == torch.float64 else torch.float32
        vf = v.to(dt)
        M = toeplitz(h.to(dt))                                                     # (G, C, T, T)
        with torch.autocast(v.device.type, enabled=False):                         # float32 products, as the FFTs
            y = torch.einsum("gcts,gbcs->gbct", M, vf)
        z = torch.addcmul(y, vf, b.to(dt)[:, None, :, None])
        ctx.save_for_backward(vf, g, M, z, b)
        ctx.dtypes = v.dtype, h.dtype
        return g * z

    @staticmethod
    def backward(ctx, dout):
        vf, g, M, z, b = ctx.saved_tensors
        v_dtype, h_dtype = ctx.dtypes
        dz, dg, db = _gate_grads(ctx, dout, g, z, vf, b)
        dv = dh = None
        with torch.autocast(dz.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                dv = torch.addcmul(torch.einsum("gcts,gbct->gbcs", M, dz), dz, b.to(dz.dtype)[:, None, :, None])
                dv = dv.to(v_dtype)
            if ctx.needs_input_grad[2]:       # Σ_batch dz[t] v[s] per channel, summed along its diagonals
                dh = diagonal_sums(torch.einsum("gbct,gbcs->gcts", dz, vf)).to(h_dtype)
        return dv, dg, dh, db


def gated_toeplitz_conv(v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v (B, C, T), g like v, h (C, T), b (C,) -> g ⊙ (h ∗ v + b ⊙ v) by the Toeplitz products, (B, C, T) float32:
    the Function where ``runs_on_toeplitz(v)``, else the reference."""
    if torch._C._are_functorch_transforms_active() or not runs_on_toeplitz(v):
        return gated_toeplitz_conv_torch(v, g, h, b)
    return _GatedToeplitzConv.apply(v[None], g[None], h[None], b[None]).squeeze(0)


gated_toeplitz_conv.__mixzoo_function__ = _GatedToeplitzConv
gated_toeplitz_conv.__mixzoo_fold__ = _folder(gated_toeplitz_conv, toeplitz_causal_conv, runs_on_toeplitz)
