"""The short causal depthwise convolution of gdn, Mamba, MesaNet, Hyena and the based recipe,
y_t = b + sum_j w_j x_{t-W+1+j} per channel (optionally SiLU of it), as Triton kernels (causal_conv_triton), each
way two paths: the forward one row of positions at a time, each row of x loaded once and the window carried
(``MIXZOO_CONV_FWD=seq``, the default) or in (positions, channels) tiles (``tiles``); the backward in one pass a
row at a time backwards in time, dx written directly (``MIXZOO_CONV_BWD=seq``, the default) or in two (SiLU's
derivative dz with the weight's and bias's gradients, then the input's from dz: ``two-pass``). Widths over 4 take
the tiles and the two passes. The paths are timed on the H200 in benchmarks/conv_tiles.py.

PyTorch runs it as a transposed copy, a padded ``conv1d`` whose output is sliced and transposed back,
and SiLU, and backward as their gradients, the weight's through a slow depthwise kernel: under
stacking (K models' weights as K·C groups) the depthwise weight-gradient kernel alone took about 2 ms
of a stacked gdn step on an H200 (benchmarks/h200-2026-12-01/profile_step-7928ea8.md). The kernels
read (B, T, C) as the projection writes it and write the output once; everything in float32 from
the bf16 input and the float32 weight, one rounding to the output dtype (autocast's where it is on).

``causal_conv`` runs them for a CUDA tensor (or under Triton's interpreter, ``TRITON_INTERPRET=1``)
once they have matched ``causal_conv_torch`` on that device (``usable``); ``runs_on(x)`` says whether
they will, so the model keeps its PyTorch form otherwise (on the CPU its numbers are unchanged).
``MIXZOO_CONV=torch`` turns them off, and so does ``torch.compile``. Under ``torch.func.vmap`` the K
models are one call with their sequences folded into the batch, each model's sequences reading its own weight
and bias (``_fold``, this op's rule for ``mixzoo.train.vmapfold``): the stacked activations keep their (K, B,
T, C) layout in and out, where folding the models into the channels, (B, T, K·C), transposed them on the way in
and handed a (B, T, K, C) layout to every later op and gradient (``MIXZOO_CONV_FOLD=channels``, to time one
against the other; ``batch`` is the default). Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import enabled
from ._check import DeviceCheck, interpreting, matches

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def causal_conv_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """The reference in float32 (float64 for float64 x): x (B, T, C), weight (C, W), bias (C,)."""
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    W, T = weight.shape[1], x.shape[1]
    y = F.conv1d(x.to(cdt).transpose(1, 2), weight.to(cdt).unsqueeze(1), None if bias is None else bias.to(cdt),
                 padding=W - 1, groups=x.shape[2])[..., :T].transpose(1, 2)
    return F.silu(y) if silu else y


def runs_on(x: torch.Tensor) -> bool:
    """Whether ``causal_conv`` of x (B, T, C) takes the kernels (x may be a tensor vmap batches)."""
    return (os.environ.get("MIXZOO_CONV") != "torch" and enabled() and (x.is_cuda or interpreting()) and x.dim() == 3
            and x.dtype in _DTYPES and not torch.compiler.is_compiling()
            and usable((x.device.index or 0) if x.is_cuda else -1))


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, silu, out_dtype):
        from . import RAN
        from . import causal_conv_triton as K
        RAN.add("causal_conv")
        x, weight = x.contiguous(), weight.contiguous()
        bias = bias.contiguous() if bias is not None else None
        ctx.save_for_backward(x, weight, bias)
        ctx.silu, ctx.has_bias = silu, bias is not None
        return K.forward(x, weight, bias, silu, out_dtype)

    @staticmethod
    def backward(ctx, dy):
        from . import causal_conv_triton as K
        x, weight, bias = ctx.saved_tensors
        dx, dw, db = K.backward(x, weight, bias if ctx.has_bias else None, ctx.silu, dy.contiguous())
        return dx, dw.to(weight.dtype), (db.to(bias.dtype) if ctx.has_bias else None), None, None


def _fold(K: int, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool):
    """vmap over K models (``mixzoo.train.vmapfold``): x (K, B, T, C) as K·B sequences, model k's B of them
    reading weight[k] (C, W) and bias[k]; -> (y (K, B, T, C), 0). Off the kernels (and with
    MIXZOO_CONV_FOLD=channels) the K models' channels side by side, (B, T, K·C): -> (y (B, T, K, C), 2)."""
    def front(t, d):
        return t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(K, *t.shape)
    x, w = front(x, in_dims[0]), front(weight, in_dims[1])
    b = None if bias is None else front(bias, in_dims[2])
    B, T, C = x.shape[1:]
    kernels = runs_on(x[0])
    if kernels and os.environ.get("MIXZOO_CONV_FOLD") != "channels":
        return _Conv.apply(x.reshape(K * B, T, C), w, b, bool(silu), _out_dtype(x)).view(K, B, T, C), 0
    # the models in the channels: the kernels as folded before (MIXZOO_CONV_FOLD=channels), or the PyTorch form
    xc, wc = x.permute(1, 2, 0, 3).reshape(B, T, K * C), w.reshape(K * C, -1)
    bc = None if b is None else b.reshape(K * C)
    y = _Conv.apply(xc, wc, bc, bool(silu), _out_dtype(x)) if kernels else causal_conv_torch(xc, wc, bc, silu)
    return y.to(_out_dtype(x)).view(B, T, K, C), 2


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """x (B, T, C), weight (C, W), bias (C,) or None -> (B, T, C) in autocast's dtype (else x's)."""
    if torch._C._are_functorch_transforms_active() or not runs_on(x):
        return causal_conv_torch(x, weight, bias, silu).to(_out_dtype(x))
    return _Conv.apply(x, weight, bias, bool(silu), _out_dtype(x))


causal_conv.__mixzoo_fold__ = _fold


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``causal_conv_torch``'s output and gradients on this device (-1: the
    interpreter), checked once (``_check.DeviceCheck``): both forwards and both backwards (whichever the switches
    pick), float32 and bf16, with and without bias and SiLU, lengths that are not multiples of the kernels' blocks
    (45, and 301: three spans of positions), widths 4 and 3, one model's weight and three models' (two sequences
    each)."""
    return _USABLE(device_index)


def _matches_here(device_index: int) -> bool:
    from . import causal_conv_triton as K
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        # lengths within one span of the kernels' programs and across three (the last partial)
        # M models' weights (M > 1: sequence b reads model b // 2's), as a stacked step folds them
        for W, silu, has_bias, T, M in ((4, True, True, 301, 1), (3, False, False, 45, 1), (4, True, True, 45, 3)):
            Bs = 2 * M
            x = torch.randn(Bs, T, 70, generator=gen).to(dt).to(dev)
            w = (torch.randn(M, 70, W, generator=gen) * 0.5).to(dev)
            b = (torch.randn(M, 70, generator=gen) * 0.1).to(dev) if has_bias else None
            if M == 1:
                w, b = w[0], (b[0] if has_bias else None)
            dy = torch.randn(Bs, T, 70, generator=gen).to(dev)
            ins = [t.double().requires_grad_() for t in (x, w) + ((b,) if has_bias else ())]
            xs, ws = ins[0].view(M, 2, T, 70), ins[1].view(M, 70, W)
            bs = ins[2].view(M, 70) if has_bias else None
            want = torch.cat([causal_conv_torch(xs[m], ws[m], bs[m] if has_bias else None, silu) for m in range(M)])
            wants = torch.autograd.grad(want, ins, dy.double())
            # every path either switch (MIXZOO_CONV_FWD, MIXZOO_CONV_BWD) may take, not only the default
            for fwd, bwd in ((K.forward_seq, K.backward_seq), (K.forward_tiles, K.backward_two_pass)):
                got = fwd(x.contiguous(), w, b, silu, torch.float32)
                gots = bwd(x.contiguous(), w, b, silu, dy)
                if not all(matches(a, ref, tol) for a, ref in [(got, want.detach()), *zip(gots, wants)]):
                    return False
    return True


_USABLE = DeviceCheck(_matches_here)
