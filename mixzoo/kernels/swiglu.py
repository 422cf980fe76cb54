"""SwiGLU's gate, silu(a) * b with (a, b) the two halves of one projection's last dimension, as one
Triton kernel forward and one backward (the MLP of the mad recipe, in every block of every mechanism).

PyTorch runs it as chunk, silu and a product forward (two activations written) and the product's,
silu's and chunk's backwards (four more, the last one the whole projection's width). At MAD's shape a
stacked training step is bound by the bytes its kernels move, not by its launches (README,
Performance); the kernels (``swiglu_triton``) write the output forward and the projection's gradient
backward, nothing else. Arithmetic in float32 with one rounding to the input dtype (PyTorch rounds
after silu and after the product): the two agree to the input dtype's rounding
(tests/test_swiglu_kernel.py).

``swiglu`` takes the kernels for a CUDA tensor (or under Triton's interpreter, ``TRITON_INTERPRET=1``,
as the CPU tests run them) once they have matched ``swiglu_torch`` on that device (``usable``), else
``swiglu_torch``; ``runs_on(h)`` says whether they will, so the model keeps its PyTorch form
otherwise. ``MIXZOO_SWIGLU=torch`` asks for ``swiglu_torch``, and so does ``torch.compile`` (which
fuses that form itself). Under ``torch.func.vmap`` it is ``swiglu_torch`` unless the call is
folded: stacked training looks ``swiglu`` up through ``mixzoo.models._fla._op``, which
``mixzoo.train.vmapfold.folding`` folds, so the K models' rows are one call. Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import enabled
from ._check import DeviceCheck, interpreting, matches


def swiglu_torch(h: torch.Tensor) -> torch.Tensor:
    """The reference: silu(a) * b for (a, b) = h.chunk(2, -1)."""
    a, b = h.chunk(2, dim=-1)
    return F.silu(a) * b


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        from . import RAN, swiglu_triton
        RAN.add("swiglu")
        h = h.contiguous()
        ctx.save_for_backward(h)
        return swiglu_triton.forward(h)

    @staticmethod
    def backward(ctx, do):
        from . import swiglu_triton
        (h,) = ctx.saved_tensors
        return swiglu_triton.backward(h, do.contiguous())


def runs_on(h: torch.Tensor) -> bool:
    """Whether ``swiglu`` of h takes the kernels (h may be a tensor vmap batches)."""
    return (os.environ.get("MIXZOO_SWIGLU") != "torch" and enabled() and (h.is_cuda or interpreting())
            and h.shape[-1] % 2 == 0 and h.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and not torch.compiler.is_compiling()                # torch.compile fuses the PyTorch form itself
            and usable((h.device.index or 0) if h.is_cuda else -1))


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for (a, b) = h.chunk(2, -1): the Triton kernels where ``runs_on(h)`` and not under an
    unfolded vmap, else ``swiglu_torch``."""
    if torch._C._are_functorch_transforms_active() or not runs_on(h):
        return swiglu_torch(h)
    return _SwiGLU.apply(h)


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``swiglu_torch``'s output and gradient on this device (-1: the
    interpreter), checked once (``_check.DeviceCheck``): float32 and bf16, a partial last block."""
    return _USABLE(device_index)


def _matches_here(device_index: int) -> bool:
    from . import swiglu_triton
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        h = (torch.randn(3, 7, 2 * 173, generator=gen) * 3).to(dt).to(dev)
        do = torch.randn(3, 7, 173, generator=gen).to(dt).to(dev)
        hr = h.float().requires_grad_()
        want = swiglu_torch(hr)
        (want_dh,) = torch.autograd.grad(want, hr, do.float())
        want = want.detach()
        got, got_dh = swiglu_triton.forward(h), swiglu_triton.backward(h, do)
        if not all(a.dtype == dt and matches(a, b.double(), tol) for a, b in ((got, want), (got_dh, want_dh))):
            return False
    return True


_USABLE = DeviceCheck(_matches_here)
