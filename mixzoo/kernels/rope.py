"""Rotary position embedding, pairs (i, i + D/2) of each head rotated by t·base^(-i/(D/2)), as one
Triton kernel forward and the same kernel with the inverse rotation backward (``rope_triton``).

The PyTorch form (``mixzoo.models.common.rope``) computes it in the input's dtype as six products and
sums of half-width slices and a concatenation forward, about as many operators backward: a dozen
activations written per rotated tensor and step, for q and k of every softmax, LLA and Parallax layer.
The kernel reads the projection's strided view as it is, computes the angles and the rotation in
float32, and writes the rotated tensor once (contiguous, as attention takes it); backward the same
with the inverse rotation, so nothing is saved for it.

``rope`` runs the kernel for a CUDA tensor (or under Triton's interpreter, ``TRITON_INTERPRET=1``) with
an even head width and a unit last stride, once it has matched ``rope_torch`` on that device
(``usable``); ``runs_on(x)`` says whether it will, so the model keeps its PyTorch form otherwise (on the
CPU its numbers are unchanged). ``MIXZOO_ROPE=torch`` turns it off, and so does ``torch.compile``. Under
``torch.func.vmap`` the models fold into the batch (``mixzoo.train.vmapfold``). Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch

from . import enabled
from ._check import DeviceCheck, interpreting, matches

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rope_torch(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The reference, in float32 (float64 for float64 x), the result in x's dtype."""
    D, T = x.shape[-1], x.shape[-2]
    half = D // 2
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv = base ** (-torch.arange(half, device=x.device, dtype=cdt) / half)
    ang = torch.arange(T, device=x.device, dtype=cdt)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    xf = x.to(cdt)
    x1, x2 = xf[..., :half], xf[..., half:2 * half]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def runs_on(x: torch.Tensor) -> bool:
    """Whether ``rope`` of x (B, H, T, D) takes the kernel (x may be a tensor vmap batches)."""
    return (os.environ.get("MIXZOO_ROPE") != "torch" and enabled() and (x.is_cuda or interpreting()) and x.dim() == 4
            and x.shape[-1] % 2 == 0 and x.shape[-1] >= 2 and x.dtype in _DTYPES
            and not torch.compiler.is_compiling() and usable((x.device.index or 0) if x.is_cuda else -1))


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, base):
        from . import RAN, rope_triton
        RAN.add("rope")
        ctx.base = base
        return rope_triton.rotate(x if x.stride(-1) == 1 else x.contiguous(), base)

    @staticmethod
    def backward(ctx, dy):
        from . import rope_triton
        return rope_triton.rotate(dy if dy.stride(-1) == 1 else dy.contiguous(), ctx.base, inverse=True), None


def rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x (B, H, T, D) rotated: the kernel where ``runs_on(x)`` and not under an unfolded vmap, else
    ``rope_torch``."""
    if torch._C._are_functorch_transforms_active() or not runs_on(x):
        return rope_torch(x, base)
    return _Rope.apply(x, float(base))


def usable(device_index: int = 0) -> bool:
    """Whether the kernel gives ``rope_torch``'s output and gradient on this device (-1: the
    interpreter), checked once (``_check.DeviceCheck``): float32 and bf16, a strided input, head widths
    8 and 64, a partial block of positions."""
    return _USABLE(device_index)


def _matches_here(device_index: int) -> bool:
    from . import rope_triton
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        for D in (8, 64):
            qkv = torch.randn(2, 37, 3 * 3 * D, generator=gen).to(dt).to(dev)
            x = qkv[..., :3 * D].unflatten(-1, (3, D)).transpose(1, 2)           # (2, 3, 37, D), strided
            dy = torch.randn(2, 3, 37, D, generator=gen).to(dt).to(dev)
            xr = x.double().requires_grad_()
            want = rope_torch(xr)
            (want_dx,) = torch.autograd.grad(want, xr, dy.double())
            y, dx = rope_triton.rotate(x, 10000.0), rope_triton.rotate(dy, 10000.0, inverse=True)
            if not all(a.dtype == dt and matches(a, b, tol) for a, b in ((y, want.detach()), (dx, want_dx))):
                return False
    return True


_USABLE = DeviceCheck(_matches_here)
