"""RMS norm with its weight, y = x / sqrt(mean(x²) + eps) · w, as one Triton kernel forward and one
backward (``rmsnorm_triton``), computed in float32 from x as it is (no float32 copy of a bf16 x).

PyTorch's CUDA kernel for ``F.rms_norm`` is fused too, but the model's norms take their weight after it
where they stack (``mixzoo.train.vmapfold``: K models' weights are K rows, which F.rms_norm cannot
take), and a weight applied after the norm is a product forward and two backward, each writing a whole
float32 activation. These kernels take one weight row per group of rows, so K stacked models' norms are
one call with their K weights (``rms_norm.__mixzoo_fold__``), and an unstacked norm is the one group.

``rms_norm`` runs the kernels for a CUDA tensor (or under Triton's interpreter, ``TRITON_INTERPRET=1``,
as the CPU tests run them) once they have matched ``rms_norm_torch`` on that device (``usable``);
``runs_on(x)`` says whether they will, so that a caller can keep its own PyTorch form otherwise (the
model's norms do: on the CPU their numbers are unchanged). ``MIXZOO_RMSNORM=torch`` turns the kernels
off, and so does ``torch.compile`` (it fuses the PyTorch form itself). Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import enabled
from ._check import DeviceCheck, interpreting, matches

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference: F.rms_norm of x in float32 with the weight (the result in float32)."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps)


def runs_on(x: torch.Tensor) -> bool:
    """Whether ``rms_norm`` of x takes the kernels (x may be a tensor vmap batches)."""
    return (os.environ.get("MIXZOO_RMSNORM") != "torch" and enabled() and (x.is_cuda or interpreting())
            and x.dtype in _DTYPES and not torch.compiler.is_compiling()
            and usable((x.device.index or 0) if x.is_cuda else -1))


class _Grouped(torch.autograd.Function):
    """x (G, R, D), w (G, D) -> y (G, R, D) float32."""

    @staticmethod
    def forward(ctx, x, w, eps):
        from . import RAN, rmsnorm_triton
        RAN.add("rmsnorm")
        x, w = x.contiguous(), w.contiguous()
        y, rstd = rmsnorm_triton.forward(x, w, eps, torch.float32)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        from . import rmsnorm_triton
        x, w, rstd = ctx.saved_tensors
        dx, dw = rmsnorm_triton.backward(x, w, rstd, dy.contiguous())
        return dx, dw.to(w.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., D), weight (D,) -> float32 (..., D): the kernels where ``runs_on(x)``, else
    ``rms_norm_torch`` (so also under vmap when the call is not folded)."""
    if torch._C._are_functorch_transforms_active() or not runs_on(x):
        return rms_norm_torch(x, weight, eps)
    D = x.shape[-1]
    return _Grouped.apply(x.reshape(1, -1, D), weight.reshape(1, D), eps).view(x.shape)


def _fold(K: int, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, eps: float):
    """vmap over K models (``mixzoo.train.vmapfold``): their rows as K groups, their weights as K rows."""
    dx, dw = in_dims[0], in_dims[1]
    x = x.movedim(dx, 0) if dx is not None else x.unsqueeze(0).expand(K, *x.shape)
    w = weight.movedim(dw, 0) if dw is not None else weight.unsqueeze(0).expand(K, *weight.shape)
    if not runs_on(x):
        return _torch_grouped(x, w, eps), 0
    D = x.shape[-1]
    return _Grouped.apply(x.reshape(K, -1, D), w.reshape(K, D), eps).view(x.shape), 0


def _torch_grouped(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm_torch of K groups: x (K, ..., D), w (K, D)."""
    y = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return y * w.float().reshape(w.shape[0], *[1] * (x.dim() - 2), w.shape[-1])


rms_norm.__mixzoo_fold__ = _fold

def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``rms_norm_torch``'s output and gradients on this device (-1: the
    interpreter), checked once (``_check.DeviceCheck``): float32 and bf16 inputs, two groups, partial
    row blocks, widths 8, 128 and 173."""
    return _USABLE(device_index)


def _matches_here(device_index: int) -> bool:
    from . import rmsnorm_triton
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        for D in (8, 128, 173):
            x = (torch.randn(2, 37, D, generator=gen) * 3).to(dt).to(dev)
            w = (1 + 0.3 * torch.randn(2, D, generator=gen)).to(dev)
            dy = torch.randn(2, 37, D, generator=gen).to(dev)
            xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
            want = torch.stack([rms_norm_torch(xr[g], wr[g], 1e-6) for g in range(2)])
            want_dx, want_dw = torch.autograd.grad(want, (xr, wr), dy.double())
            y, rstd = rmsnorm_triton.forward(x.contiguous(), w, 1e-6, torch.float32)
            dx, dw = rmsnorm_triton.backward(x.contiguous(), w, rstd, dy)
            tol = 1e-5 if dt == torch.float32 else 1e-2
            if not all(matches(a, b, tol) for a, b in ((y, want.detach()), (dx, want_dx), (dw, want_dw))):
                return False
    return True


_USABLE = DeviceCheck(_matches_here)
