"""Hyena (Poli et al., 2023): an order-N operator of gated long convolutions.

u = ShortConv(W_in x) is split into N gates x_1..x_N and a value v; then for n = 1..N, v <- x_n ⊙ (h_n * v + b_n ⊙
v), where h_n is an implicit long filter: a small MLP with sine activations of fixed positional features of the lag,
times an exponential decay window. The convolution is linear (never circular) and causal at every length: up to
``DIRECT_MAX_LEN`` a product with each channel's causal Toeplitz matrix, beyond it an FFT convolution zero-padded to
at least 2T; the filter's value at lag t does not depend on the sequence length. Paths, in PyTorch, by length:
``torch-toeplitz`` up to ``DIRECT_MAX_LEN``, ``torch-fft`` beyond. The whole operator (both steps, the split into
gates and value, the layouts) is one autograd Function with each convolution's adjoint in its backward
(``mixzoo.kernels.fftconv.hyena_operator``; the run's kernels then name ``hyenaop``). ``MIXZOO_HYENA_OP=steps``
chains one Function per step instead: each FFT step (the convolution, the bias and the gate; kernels ``fftconv``),
with ``MIXZOO_HYENA_CONV=torch`` autograd's composition (the reference); the Toeplitz step as the composition, or
with ``MIXZOO_HYENA_TOEPLITZ=fused`` its Function (``toeplitzconv``: 0.98-0.99x the composition's training step on
an H100, so off). Either Function's Toeplitz products (float32) with ``MIXZOO_HYENA_TOEPLITZ_MM=bf16x3``: bf16
tensor-core GEMMs of the operands split into hi + lo, float32 accumulation, about 2^-16 relative a product
(``mixzoo.kernels.fftconv``; the default ``fp32``: float32 einsums).
"""
from __future__ import annotations

import math
import os

import torch
from torch import nn

from ..kernels import fftconv as _fftconv
from ..kernels.fftconv import fft_causal_conv, toeplitz_causal_conv
from ..registry import register_mixer
from . import _fla
from .common import ShortConv


class Sin(nn.Module):
    def __init__(self, dim: int, freq: float = 1.0):
        super().__init__()
        self.freq = nn.Parameter(torch.full((dim,), freq))

    def forward(self, x):
        return torch.sin(self.freq * x)


class ImplicitFilter(nn.Module):
    """h[c, t] = MLP(z(t))[c] · exp(-r_c t / L), lag features z(t) of fixed scale L."""

    def __init__(self, channels: int, *, emb_bands: int = 8, width: int = 64, scale_len: int = 1024,
                 fast_decay: float = 0.3, slow_decay: float = 1.5, freq: float = 10.0):
        super().__init__()
        self.bands, self.L = emb_bands, float(scale_len)
        d_emb = 1 + 2 * emb_bands
        self.mlp = nn.Sequential(nn.Linear(d_emb, width), Sin(width, freq), nn.Linear(width, width),
                                 Sin(width, freq), nn.Linear(width, channels, bias=False))
        # decay rates spread log-uniformly over the channels (fast to slow)
        rates = torch.exp(torch.linspace(math.log(1 / slow_decay), math.log(1 / fast_decay), channels))
        self.register_buffer("rates", rates * 10.0, persistent=False)

    def forward(self, T: int, device) -> torch.Tensor:
        # float32 lag features (float64 in a float64 model: a reference)
        dt = torch.float64 if self.mlp[0].weight.dtype == torch.float64 else torch.float32
        t = torch.arange(T, device=device, dtype=dt)[:, None] / self.L                    # (T, 1)
        f = torch.arange(1, self.bands + 1, device=device, dtype=dt)[None, :]
        z = torch.cat([t, torch.cos(2 * math.pi * f * t), torch.sin(2 * math.pi * f * t)], dim=-1)
        h = self.mlp(z)                                                                 # (T, C)
        window = torch.exp(-t * self.rates[None, :].to(device))
        return (h * window).transpose(0, 1)                                            # (C, T)


# Up to this length the convolution runs as a product with each channel's causal Toeplitz matrix
# (direct_causal_conv), beyond it as FFTs (fft_causal_conv): the same sums, rounded differently. Side by side on
# an H200 (README, Performance), Hyena's stacked+graphed training step (6 models, MAD's baseline shape at each
# length) with the direct form against the FFTs: 1.18x at length 128, 1.08x at 256 (262.4 against 243.9
# model-steps/s), 0.89x at 512 and 0.65x at 1024, whose T x T matrices grow as T².
DIRECT_MAX_LEN = 256


def direct_causal_conv(u: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """fft_causal_conv's result as y[:, c] = H_c u[:, c] with H_c[t, s] = h[c, t-s] (s <= t, else 0);
    float32 (float64 for float64 u), autocast off (the products stay float32, as the FFTs do). H is built from
    windows of h (``fftconv.toeplitz``). (One gather from h instead, its backward an index_put with accumulate,
    wrote fewer bytes but took 1.9x the stacked step's time at length 128 and 2.9x at 256 on an H100, 2026-12-06:
    benchmarks/h100-2026-12-06/.)"""
    return toeplitz_causal_conv(u, h)


def direct(T: int) -> bool:
    """Whether length T takes the Toeplitz products: up to DIRECT_MAX_LEN, unless ``MIXZOO_HYENA_PATH`` says ``fft``
    (FFTs at every length) or ``toeplitz`` (Toeplitz products at every length), to time the paths against each other."""
    path = os.environ.get("MIXZOO_HYENA_PATH")
    return path == "toeplitz" or (T <= DIRECT_MAX_LEN and path != "fft")


def causal_conv(u: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The long convolution of u (B, C, T) with filters h (C, T): direct products (``direct``), else FFTs."""
    return (direct_causal_conv if direct(u.shape[-1]) else fft_causal_conv)(u, h)


@register_mixer("hyena", search_space={
    "lr": ("log", 1e-4, 3e-2),
    "weight_decay": ("cat", [0.0, 0.1]),
    "filter_width": ("cat", [32, 64]),
})
class Hyena(nn.Module):
    """Order-N Hyena operator: short conv, implicit long filters, FFT convolutions, gating."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0, order: int = 2,
                 filter_width: int = 64, short_conv: int = 3, scale_len: int = 1024):
        super().__init__()
        if order < 1:
            raise ValueError(f"order={order}; must be >= 1")
        self.d, self.order = d_model, order
        self.in_proj = nn.Linear(d_model, (order + 1) * d_model)
        self.short = ShortConv((order + 1) * d_model, short_conv)
        self.filter = ImplicitFilter(order * d_model, width=filter_width, scale_len=scale_len)
        self.bias = nn.Parameter(torch.randn(order, d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        self.backend = "torch-fft"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        u = self.short(self.in_proj(x))                                     # (B, T, (N+1)D)
        h = self.filter(T, x.device).view(self.order, D, T)
        self.backend = "torch-toeplitz" if direct(T) else "torch-fft"
        if _fftconv.operator_runs(u):   # the whole operator as one Function (the default; folded when stacking)
            return self.out_proj(_fla._op("mixzoo.kernels.fftconv", "hyena_operator")(u, h, self.bias, direct(T)))
        *gates, v = u.transpose(1, 2).split(D, dim=1)                       # (B, D, T) each
        # the step as one autograd Function (mixzoo.kernels.fftconv; folded when stacking): by default at the FFT
        # lengths, with MIXZOO_HYENA_TOEPLITZ=fused also at the Toeplitz ones (not yet timed on a GPU)
        fn = (("gated_toeplitz_conv" if _fftconv.runs_on_toeplitz(v) else None) if direct(T)
              else ("gated_fft_conv" if _fftconv.runs_on(v) else None))
        if fn is None and v.dtype != torch.float64:     # float32 (float64 in a float64 model: a reference)
            v = v.float()
        for n in range(self.order):
            if fn is not None:
                v = _fla._op("mixzoo.kernels.fftconv", fn)(v, gates[n], h[n], self.bias[n])
                continue
            # x_n (h_n * v + b_n v): one multiply-add, then the product with the bfloat16 gate, promoted inside
            # the product (no float32 copy of the gate)
            v = gates[n] * torch.addcmul(causal_conv(v, h[n]), v, self.bias[n, :, None])
        return self.out_proj(v.transpose(1, 2).to(x.dtype))

    def state_size(self, seq_len: int) -> int:
        return self.order * self.d * seq_len
