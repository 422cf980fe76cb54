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

Up to ``mixzoo.models.hyena.DIRECT_MAX_LEN`` the convolution is a product with each channel's causal Toeplitz matrix M
(``toeplitz``): forward y = M v, backward dv = Mᵀ dz and dh the diagonal sums of dH = Σ_batch dz vᵀ. In float32 these
are float32 einsums, on a GPU CUDA-core FFMA GEMMs (1.2 ms of the 9.2 ms a stacked K = 6 step at length 128 kept an
H100 busy, 2026-12-07; four times that a sequence at 256). ``MIXZOO_HYENA_TOEPLITZ_MM=bf16x3`` computes the three on
tensor cores instead, near float32's accuracy:
each float32 operand x split as hi = bf16(x), lo = bf16(x − hi) (hi + lo is x within 2^-16 relative: bf16 keeps 8
significant bits), and A·B ≈ hi_A·hi_B + hi_A·lo_B + lo_A·hi_B (lo·lo, of order 2^-16, dropped), the products of bf16
numbers exact in float32 and summed in float32. So each product is off by about 2^-16 relative (plus float32's
summation rounding), against 2^-24 for the float32 einsums and 2^-8 for plain bf16 products. Hyena's operator in
float32 against float64 on the CPU (tests/test_fftconv.py; output and gradients, norm-relative): 4e-6 to 1.5e-5 with
bf16x3, 1e-7 to 4e-7 with the float32 einsums, 2e-3 to 4e-3 with plain bf16 products (the lo parts dropped). The three
terms are one GEMM a product: the operands' parts concatenated along its contraction (``_split``,
``_toeplitz_parts``), written by the split itself in the layout the batched GEMM takes (batch: the (group, channel)
pairs). ``fp32``, the default, keeps the float32 einsums: on an H100 bf16x3 was slower (the operator's
forward+backward at MAD's stacked shape 0.81x at 128 and 0.76x at 256, the training step 0.85x at 128; 6e-6 of float64
there), 2026-12-07c. float64 always takes the float64 einsums (the reference).
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


def _float(t: torch.Tensor) -> torch.dtype:
    """The dtype the step computes in for an input of t's: float32, float64 for float64."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _pads_buffers(direct: bool) -> bool:
    """Whether the operator writes its FFTs' operands into zero-padded buffers (``_padded``): at the FFT lengths,
    unless ``MIXZOO_HYENA_FFT_PAD=rfft`` (rfft pads them, as the steps do)."""
    return not direct and os.environ.get("MIXZOO_HYENA_FFT_PAD") != "rfft"


def _padded(like: torch.Tensor, shape: tuple, T: int, dtype: torch.dtype):
    """A zero-padded buffer (*shape, fft_size(T)) for an operand of the FFTs, and its first T columns (a view) for its
    producer to write into: rfft then pads nothing (``rfft(x, n=n)`` fills a new buffer of size n with zeros and
    copies x into it, a third of the operator's copies at length 1024). Side by side on an H200 (2026-12-06,
    benchmarks/h200-2026-12-06/), Hyena's stacked+graphed training step (K = 6) with the buffers against rfft's
    padding: 183.1 against 171.4 model-steps/s at length 512, 93.5 against 87.7 at 1024 (1.07x each)."""
    buf = like.new_empty(*shape, fft_size(T), dtype=dtype)
    buf[..., T:].zero_()
    return buf, buf[..., :T]


def _channels_first() -> bool:
    """Whether the operator works in the channels-first layout (``MIXZOO_HYENA_LAYOUT=channels``, the default): its
    input transposed once into a contiguous (B, (N+1)C, T) copy, every product then along contiguous rows, the output
    and the input's gradient transposed back at the end (``transposed``); ``strided``: the products read the gates
    and write the output and the gradients through transposed views of the (B, T, (N+1)C) layout, as before."""
    return os.environ.get("MIXZOO_HYENA_LAYOUT") != "strided"


def transposed(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (..., A, B) -> (..., B, A), contiguous, in ``dtype``: in tiles by ``fftconv_triton.transpose`` on a GPU (and in
    Triton's interpreter), else ``copy_`` of the transposed view (the same values: a copy and a cast)."""
    from ._check import interpreting
    if x.is_cuda or interpreting():
        from . import fftconv_triton
        return fftconv_triton.transpose(x, dtype)
    return torch.empty(*x.shape[:-2], x.shape[-1], x.shape[-2], dtype=dtype, device=x.device).copy_(x.transpose(-1, -2))


def _fft_norm() -> str:
    """Where the convolution's 1/n goes: into the filters' spectrum H, a (G, C, F) tensor (``"forward"``: rfft of h
    scaled, irfft of the products not; ``MIXZOO_HYENA_FFT_SCALE=filter``, the default), or onto irfft's output, a
    (G, B, C, n) tensor, by its own kernel (``"backward"``, torch's default; ``MIXZOO_HYENA_FFT_SCALE=output``). n is a
    power of two, so the scaling is exact either way and the numbers are the same, bit for bit: it only moves from an
    extra pass over each irfft's whole output (a ``mul`` of 8 per stacked step at length 1024, about 0.5 ms each on an
    H100, benchmarks/calls-2026-12-06c/profile-hyena-mad1024-c1825a2.md) to the filters. Read once a forward (``ctx.norm``)
    and passed to ``_conv_forward`` and ``_conv_backward``, so the two always agree."""
    return "backward" if os.environ.get("MIXZOO_HYENA_FFT_SCALE") == "output" else "forward"


def _toeplitz_mm(dtype: torch.dtype) -> str:
    """How the Toeplitz products of operands in ``dtype`` multiply: ``MIXZOO_HYENA_TOEPLITZ_MM`` for float32, "fp32"
    (the default: float32 einsums) or "bf16x3" (``_bf16x3_forward``); "fp32" for float64, whatever the switch (its
    float64 einsums are the reference). Read once a forward (``ctx.mm``) and passed to ``_conv_forward`` and
    ``_conv_backward``, so the backward takes the forward's (and finds what it kept)."""
    from . import HYENA_TOEPLITZ_MM, chosen, switch_error
    mm = chosen("MIXZOO_HYENA_TOEPLITZ_MM")
    if mm not in HYENA_TOEPLITZ_MM:
        raise ValueError(switch_error())
    return "fp32" if dtype == torch.float64 else mm


# bf16x3's parts: each operand split into three bf16 parts (``_split``), hi at two of them and lo at the third; each
# pair of operands of a product meets hi·hi, hi·lo and lo·hi once over the parts, and never lo·lo: M (lo, hi, hi), v
# (hi, lo, hi), dz (hi, hi, lo). A product is then one GEMM over the parts concatenated along its contraction: the
# forward's along s (v's and M's), dv's along t (dz's and M's), dH's along the batch (dz's and v's). v's and dz's
# (G, C, B, 3, T) layout serves both of their products (parts after the batch, before the time), M's cannot (its two
# products contract its two indices): the forward builds M's parts as [t, p, s], the backward as [p, t, s].
_LO_M, _LO_V, _LO_DZ = 0, 1, 2
_HI = {0: slice(1, 3), 1: slice(0, 3, 2), 2: slice(0, 2)}        # the two hi parts where lo is at 0, 1, 2


def _split(x: torch.Tensor, lo: int) -> torch.Tensor:
    """x float32 (..., T), any strides -> (..., 3, T) bf16, contiguous: hi = bf16(x) at two parts, lo = bf16(x − hi)
    at part ``lo`` (x − hi is exact in float32; hi + lo is x within 2^-16 relative). Two passes: hi written twice from
    one read of x (and x's layout changed in that copy), then lo from x and hi."""
    out = torch.empty(*x.shape[:-1], 3, x.shape[-1], dtype=torch.bfloat16, device=x.device)
    his = out[..., _HI[lo], :]
    his.copy_(x.unsqueeze(-2).expand(his.shape))
    torch.sub(x, his[..., 0, :], out=out[..., lo, :])             # float32 difference, rounded once to bf16
    return out


def _toeplitz_parts(hp: torch.Tensor, parts_first: bool) -> torch.Tensor:
    """hp (G, C, 3, T), h's split -> the three parts' Toeplitz matrices M_p[t, s] = hp[p, t-s] (s <= t, else 0), bf16,
    contiguous: (G, C, 3, T, T) [p, t, s] with ``parts_first`` (the parts stacked along t: dv's GEMM), else
    (G, C, T, 3, T) [t, p, s] (along s: the forward's). As ``toeplitz`` builds M: ``_windows`` of hp (a view), permuted
    to the layout, flipped in one copy whose offsets are computed (a gather would read an 8-byte index for each 2-byte
    element). Toeplitz of h's split is the split of ``toeplitz(h)``."""
    w = _windows(hp)                                               # (G, C, 3, T, T) [p, t, j]
    return (w if parts_first else w.permute(0, 1, 3, 2, 4)).flip(-1).contiguous()


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (Z, m, k) @ b (Z, k, n), both bf16 (any strides) -> float32, accumulated in float32: on CUDA one bf16
    tensor-core GEMM with float32 output (bmm's ``out_dtype`` overload); elsewhere (that overload has no CPU kernel)
    a float32 bmm of the bf16 values upcast (products of bf16 numbers are exact in float32: the same sums, up to
    their order)."""
    if a.is_cuda:
        return torch.ops.aten.bmm.dtype(a, b, torch.float32)
    return torch.bmm(a.float(), b.float())


def _bf16x3_forward(vf: torch.Tensor, hf: torch.Tensor):
    """y = M v by bf16x3 (module docstring): vf (G, B, C, T), hf (G, C, T) float32 -> y (G, B, C, T) float32, a view
    of the GEMM's (G, C, B, T) output (no pass to reorder it), and what the backward keeps: v's split (G, C, B, 3, T)
    (1.5x v's bytes; dH's operand) and h's (G, C, 3, T) (M's parts built again from it: M is not kept). One GEMM
    of G·C batches, (B, 3T) @ (3T, T)."""
    from . import RAN
    RAN.add("toeplitz-bf16x3")
    G, B, C, T = vf.shape
    sv = _split(vf.transpose(1, 2), _LO_V)                        # the split and the (g, c) batch layout: one copy
    hp = _split(hf, _LO_M)
    mf = _toeplitz_parts(hp, parts_first=False)                  # (G, C, T, 3, T)
    y = _mm(sv.view(G * C, B, 3 * T), mf.view(G * C, T, 3 * T).transpose(1, 2))
    return y.view(G, C, B, T).transpose(1, 2), (sv, hp)


def _bf16x3_backward(dz: torch.Tensor, kept: tuple, need_v: bool, need_h: bool):
    """The adjoint by bf16x3 at dz (G, B, C, T) float32: dv = Mᵀ dz (G, B, C, T), a view of a (G, C, B, T) output, one
    GEMM (B, 3T) @ (3T, T) a batch; dh the diagonal sums of dH = Σ_batch dz vᵀ (G, C, T, T), one GEMM (T, 3B) @ (3B, T)
    a batch; either None where not needed. dz split once for both (G, C, B, 3, T)."""
    sv, hp = kept
    G, B, C, T = dz.shape
    sdz = _split(dz.transpose(1, 2), _LO_DZ)
    dv = dh = None
    if need_v:
        md = _toeplitz_parts(hp, parts_first=True)              # (G, C, 3, T, T)
        dv = _mm(sdz.view(G * C, B, 3 * T), md.view(G * C, 3 * T, T)).view(G, C, B, T).transpose(1, 2)
    if need_h:
        dh = diagonal_sums(_mm(sdz.view(G * C, 3 * B, T).transpose(1, 2), sv.view(G * C, 3 * B, T)).view(G, C, T, T))
    return dv, dh


def _conv_forward(vf: torch.Tensor, hf: torch.Tensor, direct: bool, padded: torch.Tensor | None = None,
                  norm: str = "backward", mm: str = "fp32"):
    """The causal convolution of vf (G, B, C, T) with hf (G, C, T), both float32 (float64), and what its adjoint
    keeps: the spectra V (G, B, C, F) and H (G, 1, C, F) of FFTs of size ``fft_size(T)``, or with ``direct`` the
    Toeplitz matrices M (G, C, T, T) (float32 products, autocast off, as the FFTs). ``padded``: vf's buffer from
    ``_padded`` (vf its view), transformed as it is. ``norm``: torch's FFT norm of h's rfft and of the products' irfft
    (``_fft_norm``: "forward" puts the 1/n into H); ``_conv_backward`` takes the same. ``mm``: the Toeplitz products'
    form (``_toeplitz_mm``): "fp32" the einsum in vf's dtype, "bf16x3" ``_bf16x3_forward`` (y then a view of a
    (G, C, B, T) tensor; kept: v's and h's splits); ``_conv_backward`` takes the same."""
    T = vf.shape[-1]
    if direct:
        with torch.autocast(vf.device.type, enabled=False):
            if mm == "bf16x3":
                return _bf16x3_forward(vf, hf)
            M = toeplitz(hf)
            return torch.einsum("gcts,gbcs->gbct", M, vf), (M,)
    n = fft_size(T)
    V = torch.fft.rfft(vf, n=n) if padded is None else torch.fft.rfft(padded)
    H = torch.fft.rfft(hf, n=n, norm=norm).unsqueeze(1)        # "forward": H/n, and the irfft below unscaled
    return torch.fft.irfft(V * H, n=n, norm=norm)[..., :T], (V, H)


def _conv_backward(dz: torch.Tensor, vf: torch.Tensor, kept: tuple, direct: bool, need_v: bool, need_h: bool,
                   padded: torch.Tensor | None = None, norm: str = "backward", mm: str = "fp32"):
    """The convolution's adjoint at dz (G, B, C, T): (its value gradient, its filter gradient), either None where
    not needed; ``padded`` as for ``_conv_forward``. FFTs: dv = irfft(rfft(dz) · conj(H))[:T] (a correlation), dh =
    irfft(Σ_batch conj(V) rfft(dz))[:T]; each FFT of dz taken once. Toeplitz: dv = Mᵀ dz, dh the diagonal sums of
    Σ_batch dz vᵀ (one batched product per channel); with ``mm`` "bf16x3" (the forward's) ``_bf16x3_backward``."""
    if direct:
        with torch.autocast(dz.device.type, enabled=False):
            if mm == "bf16x3":
                return _bf16x3_backward(dz, kept, need_v, need_h)
            (M,) = kept
            dv = torch.einsum("gcts,gbct->gbcs", M, dz) if need_v else None
            dh = diagonal_sums(torch.einsum("gbct,gbcs->gcts", dz, vf)) if need_h else None
        return dv, dh
    V, H = kept
    T = dz.shape[-1]
    n = fft_size(T)
    DZ = torch.fft.rfft(dz, n=n) if padded is None else torch.fft.rfft(padded)
    # H carries the forward's 1/n with the forward's norm "forward" (``_fft_norm``; then it is H/n, kept as such)
    dv = torch.fft.irfft(DZ * H.conj(), n=n, norm=norm)[..., :T] if need_v else None
    dh = torch.fft.irfft(torch.linalg.vecdot(V, DZ, dim=1), n=n)[..., :T] if need_h else None   # Σ_batch conj(V) DZ
    return dv, dh


def _step_forward(ctx, v, g, h, b, direct: bool):
    """One gated step g ⊙ (h ∗ v + b ⊙ v) of either Function: v, g (G, B, C, T), h (G, C, T), b (G, C)."""
    dt = _float(v)
    vf = v.to(dt)
    ctx.norm, ctx.mm = _fft_norm(), _toeplitz_mm(dt)
    y, kept = _conv_forward(vf, h.to(dt), direct, norm=ctx.norm, mm=ctx.mm)
    z = torch.addcmul(y, vf, b.to(dt)[:, None, :, None])
    ctx.save_for_backward(vf, g, z, b, *kept)
    ctx.dtypes = v.dtype, h.dtype
    return g * z


def _step_backward(ctx, dout, direct: bool):
    """Its backward: dz = dout ⊙ g, dg = dout ⊙ z, db = Σ_{batch, t} dz ⊙ v, dv = b ⊙ dz + the adjoint's, dh."""
    vf, g, z, b, *kept = ctx.saved_tensors
    v_dtype, h_dtype = ctx.dtypes
    need_v, need_g, need_h, need_b = ctx.needs_input_grad[:4]
    dz = dout * g
    dg = (dout * z).to(g.dtype) if need_g else None
    db = (dz * vf).sum((1, 3)).to(b.dtype) if need_b else None
    dvc, dh = _conv_backward(dz, vf, kept, direct, need_v, need_h, norm=ctx.norm, mm=ctx.mm)
    dv = torch.addcmul(dvc, dz, b.to(dz.dtype)[:, None, :, None]).to(v_dtype) if need_v else None
    return dv, dg, None if dh is None else dh.to(h_dtype), db


def _step_function(kernel: str, direct: bool, doc: str) -> type:
    """The autograd Function of one gated step (``_step_forward`` / ``_step_backward``), named ``kernel`` in the
    kernels a run reports: the FFT step, or with ``direct`` the Toeplitz step."""
    class Step(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v, g, h, b):
            from . import RAN
            RAN.add(kernel)
            return _step_forward(ctx, v, g, h, b, direct)

        @staticmethod
        def backward(ctx, dout):
            return _step_backward(ctx, dout, direct)
    Step.__doc__ = doc
    return Step


_GatedFFTConv = _step_function("fftconv", False, """v (G, B, C, T), g like v, h (G, C, T), b (G, C) -> (G, B, C, T)
float32 (float64 for float64 v).""")


def gated_fft_conv(v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v (B, C, T), g like v, h (C, T), b (C,) -> g ⊙ (h ∗ v + b ⊙ v), (B, C, T) float32: the Function where
    ``runs_on(v)``, else the reference."""
    if torch._C._are_functorch_transforms_active() or not runs_on(v):
        return gated_fft_conv_torch(v, g, h, b)
    return _GatedFFTConv.apply(v[None], g[None], h[None], b[None]).squeeze(0)   # squeeze: its backward is a view


def _models_first(K: int, in_dims: tuple, *ts: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor with its vmapped dimension moved first (a tensor vmap does not batch: expanded to the K models)."""
    return [t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(K, *t.shape) for t, d in zip(ts, in_dims)]


def _folder(fn, conv, fused):
    """The vmap fold (``mixzoo.train.vmapfold``) of ``fn``: K models in one call of K groups, model k's sequences
    reading its filters h[k] and biases b[k]; ``conv`` the reference convolution, ``fused()`` whether the Function
    runs. ``conv(v, h)`` takes v (K, B, C, T) and h (K, C, T)."""
    def fold(K: int, in_dims: tuple, v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor):
        v, g, h, b = _models_first(K, in_dims, v, g, h, b)
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

def _windows(h: torch.Tensor) -> torch.Tensor:
    """h (..., T) -> w (..., T, T), a view: w[t, j] = h[t + j - T + 1], zero where that index is negative (the windows
    of h padded by T-1 zeros in front); flipped along j, the causal Toeplitz matrix of h."""
    T = h.shape[-1]
    return torch.nn.functional.pad(h, (T - 1, 0)).unfold(-1, T, 1)


def toeplitz(h: torch.Tensor) -> torch.Tensor:
    """h (..., C, T) -> M (..., C, T, T) with M[c, t, s] = h[c, t-s] for s <= t, else 0: ``_windows`` of h, flipped."""
    return _windows(h).flip(-1)


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


_GatedToeplitzConv = _step_function("toeplitzconv", True, """v (G, B, C, T), g like v, h (G, C, T), b (G, C) ->
(G, B, C, T) float32 (float64 for float64 v). The backward: dz = dout ⊙ g, dg = dout ⊙ z, db = Σ dz ⊙ v, dv = b ⊙ dz +
Mᵀ dz, dh = the diagonal sums of Σ_batch dz vᵀ (one batched product per channel; M kept from the forward).""")


def gated_toeplitz_conv(v: torch.Tensor, g: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v (B, C, T), g like v, h (C, T), b (C,) -> g ⊙ (h ∗ v + b ⊙ v) by the Toeplitz products, (B, C, T) float32:
    the Function where ``runs_on_toeplitz(v)``, else the reference."""
    if torch._C._are_functorch_transforms_active() or not runs_on_toeplitz(v):
        return gated_toeplitz_conv_torch(v, g, h, b)
    return _GatedToeplitzConv.apply(v[None], g[None], h[None], b[None]).squeeze(0)


gated_toeplitz_conv.__mixzoo_function__ = _GatedToeplitzConv
gated_toeplitz_conv.__mixzoo_fold__ = _folder(gated_toeplitz_conv, toeplitz_causal_conv, runs_on_toeplitz)


# ---------------------------------------------------------------------------------------------------------------
# Hyena's whole order-N operator as one Function (the default; MIXZOO_HYENA_OP=steps chains the step Functions above
# instead): the steps above, in the layout of the layer's input and output. Chaining the step Functions leaves the
# layout's glue to autograd: the split of the short convolution's output into gates and value (its backward a ``cat``
# of their gradients, 2 x 2.5 ms of a 86 ms stacked step at length 1024 on the H200,
# benchmarks/h200-2026-12-05c/profile-1024.md), the transposes to and from the channels-first layout the convolution
# takes, and the output's cast. Here the gradients of the gates and the value are written into one buffer in the
# input's layout and dtype, and the last gate's product into the output's. Side by side on an H100 (2026-12-06,
# benchmarks/h100-2026-12-06b/), Hyena's stacked+graphed training step (6 models, MAD's baseline shape) with it
# against the chained steps: 575.3 against 544.1 model-steps/s at length 128 (1.06x), 275.3 against 261.8 at 256
# (1.05x), 135.6 against 127.4 at 512 (1.06x), 69.0 against 64.6 at 1024 (1.07x).

def operator_runs(u: torch.Tensor) -> bool:
    """Whether Hyena's operator runs as one Function (``hyena_operator``): by default (or ``MIXZOO_HYENA_OP=fused``);
    ``MIXZOO_HYENA_OP=steps`` chains the step Functions."""
    return os.environ.get("MIXZOO_HYENA_OP") != "steps" and not torch.compiler.is_compiling()


def hyena_operator_torch(u: torch.Tensor, h: torch.Tensor, b: torch.Tensor, direct: bool) -> torch.Tensor:
    """The reference: u (B, T, (N+1)C) split into gates x_1..x_N and a value v, then v <- x_n ⊙ (h_n ∗ v + b_n ⊙ v)
    for n = 1..N (autograd's composition of each step), h (N, C, T), b (N, C) -> (B, T, C) in u's dtype."""
    N, C = h.shape[0], h.shape[1]
    *gates, v = u.transpose(-1, -2).split(C, dim=-2)
    step = gated_toeplitz_conv_torch if direct else gated_fft_conv_torch
    for n in range(N):
        v = step(v, gates[n], h[n], b[n])
    return v.transpose(-1, -2).to(u.dtype)


class _HyenaOperator(torch.autograd.Function):
    """u (G, B, T, (N+1)C), h (G, N, C, T), b (G, N, C), ``direct`` (Toeplitz products, else FFTs) -> (G, B, T, C) in
    u's dtype. The same operators as the chained steps, in the same order (the numbers of ``_GatedFFTConv`` /
    ``_GatedToeplitzConv`` applied N times, bit for bit); only where the results are written differs."""

    @staticmethod
    def forward(ctx, u, h, b, direct):
        from . import RAN
        RAN.add("hyenaop")
        G, B, T, W = u.shape
        N, C = h.shape[1], h.shape[2]
        dt = _float(u)
        cf, ctx.norm, ctx.mm = _channels_first(), _fft_norm(), _toeplitz_mm(dt)
        ut = transposed(u, u.dtype) if cf else u.transpose(-1, -2)     # (G, B, W, T): contiguous, or a view
        hf, bf = h.to(dt), b.to(dt)
        out = None if cf else u.new_empty(G, B, T, C)
        # FFTs: each operand written into its zero-padded buffer (``_padded``); Toeplitz products: as the steps
        pad, pads = None, _pads_buffers(direct)
        if not pads:
            v = ut[:, :, N * C:].to(dt)
        else:
            pad, v = _padded(u, (G, B, C), T, dt)
            v.copy_(ut[:, :, N * C:])
        kept = []
        for n in range(N):
            y, conv = _conv_forward(v, hf[:, n], direct, pad, ctx.norm, ctx.mm)
            z = torch.addcmul(y, v, bf[:, n, None, :, None])
            kept += [v, z, *conv]
            g = ut[:, :, n * C:(n + 1) * C]
            if n == N - 1:
                if cf:                                             # written channels-first, then transposed
                    out = transposed(torch.mul(g, z, out=u.new_empty(G, B, C, T)), u.dtype)
                else:
                    torch.mul(g, z, out=out.transpose(-1, -2))
            elif not pads:
                v = g * z
            else:
                pad, v = _padded(u, (G, B, C), T, dt)
                torch.mul(g, z, out=v)
        ctx.save_for_backward(ut if cf else u, b, *kept)
        ctx.direct, ctx.N, ctx.h_dtype, ctx.cf = direct, N, h.dtype, cf
        return out

    @staticmethod
    def backward(ctx, dout):
        u, b, *kept = ctx.saved_tensors                           # u: (G, B, W, T) channels-first with ctx.cf
        N, direct, cf = ctx.N, ctx.direct, ctx.cf
        need_u, need_h, need_b = ctx.needs_input_grad[:3]
        ut = u if cf else u.transpose(-1, -2)
        G, B, W, T = ut.shape
        C = W // (N + 1)
        dt = _float(u)
        if cf:                                                     # the gradients land channels-first, transposed last
            dut = torch.empty_like(ut)
        else:
            du = torch.empty_like(u, memory_format=torch.contiguous_format)
            dut = du.transpose(-1, -2)                             # the gates' and value's gradients land here
        dh = u.new_empty(G, N, C, T, dtype=dt) if need_h else None
        db = u.new_empty(G, N, C, dtype=dt) if need_b else None
        per = len(kept) // N
        d = transposed(dout, dt) if cf else dout.transpose(-1, -2).to(dt)
        for n in reversed(range(N)):
            v, z, *conv = kept[n * per:(n + 1) * per]
            g = ut[:, :, n * C:(n + 1) * C]
            pad = None
            if not _pads_buffers(direct):
                dz = d * g
            else:
                pad, dz = _padded(u, (G, B, C), T, dt)
                torch.mul(d, g, out=dz)
            torch.mul(d, z, out=dut[:, :, n * C:(n + 1) * C])     # the gate's gradient, in u's dtype
            if need_b:
                db[:, n] = (dz * v).sum((1, 3))
            dvc, dhn = _conv_backward(dz, v, conv, direct, True, need_h, pad, ctx.norm, ctx.mm)
            if need_h:
                dh[:, n] = dhn
            d = torch.addcmul(dvc, dz, b[:, n].to(dt)[:, None, :, None])
        dut[:, :, N * C:].copy_(d)
        if cf:
            du = transposed(dut, dut.dtype)
        return (du if need_u else None, None if dh is None else dh.to(ctx.h_dtype),
                None if db is None else db.to(b.dtype), None)


def hyena_operator(u: torch.Tensor, h: torch.Tensor, b: torch.Tensor, direct: bool) -> torch.Tensor:
    """Hyena's order-N operator on u (B, T, (N+1)C) with filters h (N, C, T) and biases b (N, C) -> (B, T, C) in u's
    dtype: the Function where ``operator_runs(u)``, else the reference (``hyena_operator_torch``)."""
    if torch._C._are_functorch_transforms_active() or not operator_runs(u):
        return hyena_operator_torch(u, h, b, direct)
    return _HyenaOperator.apply(u[None], h[None], b[None], direct).squeeze(0)


def _operator_fold(K: int, in_dims: tuple, u, h, b, direct):
    """The vmap fold of ``hyena_operator``: K models in one call of K groups, model k's sequences reading its
    filters h[k] and biases b[k]."""
    u, h, b = _models_first(K, in_dims, u, h, b)
    if not operator_runs(u):
        return torch.stack([hyena_operator_torch(u[k], h[k], b[k], direct) for k in range(K)]), 0
    return _HyenaOperator.apply(u, h, b, direct), 0


hyena_operator.__mixzoo_function__ = _HyenaOperator
hyena_operator.__mixzoo_fold__ = _operator_fold
