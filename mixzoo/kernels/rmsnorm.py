"""RMS norm with its weight, y = x / sqrt(mean(x²) + eps) · w, as one Triton kernel forward and one
backward (``rmsnorm_triton``), computed in float32 from x as it is (no float32 copy of a bf16 x).

PyTorch's CUDA kernel for ``F.rms_norm`` is fused too, but the model's norms take their weight after it
where they stack (``mixzoo.train.vmapfold``: K models' weights are K rows, which F.rms_norm cannot
take), and a weight applied after the norm is a product forward and two backward, each writing a whole
float32 activation. These kernels take one weight row per group of rows, so K stacked models' norms are
one call with their K weights (``rms_norm.__mixzoo_fold__``), and an unstacked norm is the one group.
With a ``gate`` z the norm is of x silu(z) (Mamba-2's gated norm, ``norm_before_gate=False``): the
product is formed in the kernels' registers, where PyTorch writes z in float32, silu(z) and the product
forward and three float32 activations backward.

``rms_norm`` runs the kernels for a CUDA tensor (or under Triton's interpreter, ``TRITON_INTERPRET=1``,
as the CPU tests run them) once they have matched ``rms_norm_torch`` on that device (``usable``);
``runs_on(x)`` says whether they will, so that a caller can keep its own PyTorch form otherwise (the
model's norms do: on the CPU their numbers are unchanged).

``rms_norm_gate(x, w, eps, z)`` is the gate after the norm, the norm of x times w times silu(z) in z's dtype (the output
norm of gdn, GLA and MesaNet, ``models._parts.GatedNorm``): one kernel each way, where PyTorch writes the float32
norm, silu(z), their float32 product and its cast forward, and backward the product's two gradients, silu's and the
casts, each a pass over the activations. z is read through its strides (a split view of the layer's projection:
no copy). The numbers are those of ``(F.rms_norm(x.float(), ..., w) * F.silu(z)).to(z.dtype)``: silu(z) and
silu's incoming gradient rounded to z's dtype where PyTorch's autograd rounds them. It runs by default
(``GATED_NORM[0]``, ``fused``: 1.02-1.05x the training step of gdn, GLA and MesaNet, stacked+graphed on an H100);
``MIXZOO_GATED_NORM=torch`` keeps the PyTorch form.

``add_rms_norm(x, r, w, eps)`` is a residual add followed by the norm, s = x + r and the norm of s, as one kernel
each way (the pre-norm blocks' add of a mixer's or MLP's output and the next norm): the add's own pass forward
and the sum of s's two gradients backward (the norm's and the residual stream's) are no separate passes over
the activations, and the norm may be written directly in the dtype its consumer casts it to (``out_dtype``).
The numbers are those of ``x + r`` then ``rms_norm``: s rounded to x's dtype as the add rounds it, the two
gradients summed in float32 as autograd sums them. ``MIXZOO_RMSNORM=torch`` turns the kernels
off, and so does ``torch.compile`` (it fuses the PyTorch form itself). Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import chosen, enabled
from ._check import DeviceCheck, interpreting, matches

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gated(x: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """What the norm takes, in float32: x, or x silu(gate) with a gate (the PyTorch form)."""
    return x.float() if gate is None else x.float() * F.silu(gate.float())


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: F.rms_norm of x (times silu(gate) with a gate) in float32 with the weight (the
    result in float32)."""
    x = gated(x, gate)
    return F.rms_norm(x, (x.shape[-1],), weight.float(), eps)


def runs_on(x: torch.Tensor) -> bool:
    """Whether ``rms_norm`` of x takes the kernels (x may be a tensor vmap batches)."""
    return (os.environ.get("MIXZOO_RMSNORM") != "torch" and enabled() and (x.is_cuda or interpreting())
            and x.dtype in _DTYPES and not torch.compiler.is_compiling()
            and usable((x.device.index or 0) if x.is_cuda else -1))


class _Grouped(torch.autograd.Function):
    """x (G, R, D), w (G, D), optional gate z like x -> y (G, R, D) float32."""

    @staticmethod
    def forward(ctx, x, w, eps, z):
        from . import RAN, rmsnorm_triton
        RAN.add("rmsnorm")
        x, w = x.contiguous(), w.contiguous()
        z = None if z is None else z.contiguous()
        y, rstd = rmsnorm_triton.forward(x, w, eps, torch.float32, z)
        ctx.save_for_backward(x, w, rstd, z)
        return y

    @staticmethod
    def backward(ctx, dy):
        from . import rmsnorm_triton
        x, w, rstd, z = ctx.saved_tensors
        dx, dw, dz = rmsnorm_triton.backward(x, w, rstd, dy.contiguous(), z)
        return dx, dw.to(w.dtype), None, dz


class _GroupedPost(torch.autograd.Function):
    """x (G, R, D), w (G, D), z (G, tokens, heads, D) with tokens x heads = R (any strides, the last 1) -> y (G, R, D)
    = the norm of x times w times silu(z), in z's dtype."""

    @staticmethod
    def forward(ctx, x, w, eps, z):
        from . import RAN, rmsnorm_triton
        RAN.add("rmsnorm-gate")                     # a run's kernels say which form its gated norms took
        x, w = x.contiguous(), w.contiguous()
        if z.stride(-1) != 1:
            z = z.contiguous()
        y, rstd = rmsnorm_triton.forward(x, w, eps, z.dtype, post=z)
        ctx.save_for_backward(x, w, rstd, z)
        return y

    @staticmethod
    def backward(ctx, dy):
        from . import rmsnorm_triton
        x, w, rstd, z = ctx.saved_tensors
        dx, dw, dz = rmsnorm_triton.backward(x, w, rstd, dy.contiguous(), post=z)
        return dx, dw.to(w.dtype), None, dz


class _AddGrouped(torch.autograd.Function):
    """x (G, R, D), r like x, w (G, D) -> s = x + r (x's dtype), y = the norm of s (out_dtype), both (G, R, D)."""

    @staticmethod
    def forward(ctx, x, r, w, eps, out_dtype):
        from . import RAN, rmsnorm_triton
        RAN.add("rmsnorm")
        x, r, w = x.contiguous(), r.contiguous(), w.contiguous()
        y, rstd, s = rmsnorm_triton.forward(x, w, eps, out_dtype, r=r)
        ctx.save_for_backward(s, w, rstd)
        ctx.r_dtype = r.dtype
        return s, y

    @staticmethod
    def backward(ctx, ds, dy):
        from . import rmsnorm_triton
        s, w, rstd = ctx.saved_tensors
        if dy is None:                        # y unused: s's gradient is x's and r's
            return ds, (None if ds is None else ds.to(ctx.r_dtype)), None, None, None
        dx, dw, _, dr = rmsnorm_triton.backward(s, w, rstd, dy.contiguous(), ds=None if ds is None else ds.contiguous(),
                                                r_dtype=ctx.r_dtype)
        return dx, dr, dw.to(w.dtype), None, None


def add_rms_norm_torch(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float,
                       out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: s = x + r, and ``rms_norm_torch`` of s (in out_dtype, default float32)."""
    s = x + r
    return s, rms_norm_torch(s, weight, eps).to(out_dtype or torch.float32)


def add_rms_norm(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D), r like x, weight (D,) -> (s = x + r, the norm of s times weight in out_dtype, default float32):
    the kernels where ``runs_on(x)`` (one pass each way), else ``add_rms_norm_torch``."""
    if torch._C._are_functorch_transforms_active() or not runs_on(x) or not runs_on(r):
        return add_rms_norm_torch(x, r, weight, eps, out_dtype)
    D = x.shape[-1]
    s, y = _AddGrouped.apply(x.reshape(1, -1, D), r.expand_as(x).reshape(1, -1, D), weight.reshape(1, D), eps,
                             out_dtype or torch.float32)
    return s.view(x.shape), y.view(x.shape)


def _front(K: int, t: torch.Tensor, d: int | None) -> torch.Tensor:
    """A fold's argument with its model dimension ``d`` moved first; one that vmap does not batch (``d`` None)
    expanded to the K models."""
    return t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(K, *t.shape)


def _add_fold(K: int, in_dims: tuple, x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float,
              out_dtype: torch.dtype | None = None):
    """vmap over K models (``mixzoo.train.vmapfold``): their rows as K groups, their weights as K rows."""
    x, r, w = _front(K, x, in_dims[0]), _front(K, r, in_dims[1]), _front(K, weight, in_dims[2])
    if not runs_on(x) or not runs_on(r):
        s = x + r
        return (s, _torch_grouped(s, w, eps).to(out_dtype or torch.float32)), (0, 0)
    D = x.shape[-1]
    s, y = _AddGrouped.apply(x.reshape(K, -1, D), r.expand_as(x).reshape(K, -1, D), w.reshape(K, D), eps,
                             out_dtype or torch.float32)
    return (s.view(x.shape), y.view(x.shape)), (0, 0)


add_rms_norm.__mixzoo_fold__ = _add_fold


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., D), weight (D,), optional gate like x -> float32 (..., D): the kernels where ``runs_on(x)``,
    else ``rms_norm_torch`` (so also under vmap when the call is not folded)."""
    if torch._C._are_functorch_transforms_active() or not runs_on(x) or (gate is not None and not runs_on(gate)):
        return rms_norm_torch(x, weight, eps, gate)
    D = x.shape[-1]
    z = None if gate is None else gate.reshape(1, -1, D)
    return _Grouped.apply(x.reshape(1, -1, D), weight.reshape(1, D), eps, z).view(x.shape)


def _fold(K: int, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor | None = None):
    """vmap over K models (``mixzoo.train.vmapfold``): their rows as K groups, their weights as K rows."""
    dx, dw = in_dims[0], in_dims[1]
    dg = in_dims[3] if len(in_dims) > 3 else None
    x, w = _front(K, x, dx), _front(K, weight, dw)
    if gate is not None:
        gate = _front(K, gate, dg)
    if not runs_on(x) or (gate is not None and not runs_on(gate)):
        return _torch_grouped(x, w, eps, gate), 0
    D = x.shape[-1]
    z = None if gate is None else gate.reshape(K, -1, D)
    return _Grouped.apply(x.reshape(K, -1, D), w.reshape(K, D), eps, z).view(x.shape), 0


def _torch_grouped(x: torch.Tensor, w: torch.Tensor, eps: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """rms_norm_torch of K groups: x (K, ..., D), w (K, D), gate like x."""
    x = gated(x, gate)
    y = F.rms_norm(x, (x.shape[-1],), None, eps)
    return y * w.float().reshape(w.shape[0], *[1] * (x.dim() - 2), w.shape[-1])


rms_norm.__mixzoo_fold__ = _fold


def rms_norm_gate_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor) -> torch.Tensor:
    """The reference: F.rms_norm of x in float32 with the weight, times F.silu(gate), in gate's dtype (x (..., D), gate
    like x)."""
    xf = x if x.dtype == torch.float64 else x.float()
    return (F.rms_norm(xf, (x.shape[-1],), weight.to(xf.dtype), eps) * F.silu(gate)).to(gate.dtype)


def gate_runs_on(x: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether ``rms_norm_gate`` of x and gate takes the kernel: ``MIXZOO_GATED_NORM`` (unset: ``GATED_NORM[0]``) is
    ``fused``, and ``runs_on`` both."""
    return chosen("MIXZOO_GATED_NORM") == "fused" and runs_on(x) and runs_on(gate)


def rms_norm_gate(x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor) -> torch.Tensor:
    """x (..., H, D), weight (D,), gate (..., H, D) (any strides, its last 1) -> the norm of x times weight times
    silu(gate), (..., H, D) in gate's dtype: the kernel where ``gate_runs_on``, else ``rms_norm_gate_torch``."""
    if torch._C._are_functorch_transforms_active() or not gate_runs_on(x, gate):
        return rms_norm_gate_torch(x, weight, eps, gate)
    return _post_groups(x, weight, eps, gate, 1)


def _post_groups(x: torch.Tensor, w: torch.Tensor, eps: float, gate: torch.Tensor, G: int) -> torch.Tensor:
    """``_GroupedPost`` on x (..., H, D) as G groups of rows, w as G rows, the gate (like x, any strides but the last)
    as G groups of its (tokens, H, D) rows; the result in x's shape."""
    H, D = x.shape[-2], x.shape[-1]
    return _GroupedPost.apply(x.reshape(G, -1, D), w.reshape(G, D), eps, gate.reshape(G, -1, H, D)).view(x.shape)


def _gate_fold(K: int, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor):
    """vmap over K models: their rows as K groups, their weights as K rows, their gates as K groups of the gate's
    strided rows."""
    x, w, gate = _front(K, x, in_dims[0]), _front(K, weight, in_dims[1]), _front(K, gate, in_dims[3])
    if not gate_runs_on(x, gate):
        y = _torch_grouped(x, w, eps)
        return (y * F.silu(gate)).to(gate.dtype), 0
    return _post_groups(x, w, eps, gate, K), 0


rms_norm_gate.__mixzoo_fold__ = _gate_fold


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``rms_norm_torch``'s output and gradients on this device (-1: the
    interpreter), checked once (``_check.DeviceCheck``): float32 and bf16 inputs, two groups, partial
    row blocks, widths 8, 128 and 173, without and with a gate; the gate after the norm (``rms_norm_gate``) read
    through a wider row's strides, 3 heads of 8 and 2 of 173; and ``add_rms_norm``'s (a float32 x and a
    float32 or bf16 r, with and without a gradient of s from elsewhere, the norm in float32 and bf16)."""
    return _USABLE(device_index)


def _matches_here(device_index: int) -> bool:
    from . import rmsnorm_triton
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        for D in (8, 128, 173):
            for gated in (False, True):
                x = (torch.randn(2, 37, D, generator=gen) * 3).to(dt).to(dev)
                z = (torch.randn(2, 37, D, generator=gen) * 2).to(dt).to(dev) if gated else None
                w = (1 + 0.3 * torch.randn(2, D, generator=gen)).to(dev)
                dy = torch.randn(2, 37, D, generator=gen).to(dev)
                ins = [t.double().requires_grad_() for t in (x, w) + ((z,) if gated else ())]
                want = torch.stack([rms_norm_torch(ins[0][g], ins[1][g], 1e-6, ins[2][g] if gated else None)
                                    for g in range(2)])
                wants = torch.autograd.grad(want, ins, dy.double())
                y, rstd = rmsnorm_triton.forward(x.contiguous(), w, 1e-6, torch.float32, z)
                dx, dw, dz = rmsnorm_triton.backward(x.contiguous(), w, rstd, dy, z)
                tol = 1e-5 if dt == torch.float32 else 1e-2
                got = [y, dx, dw] + ([dz] if gated else [])
                if not all(matches(a, b, tol) for a, b in zip(got, [want.detach(), *wants])):
                    return False
    for dt in (torch.float32, torch.bfloat16):        # the gate after the norm, read through a wider row's strides
        for H, D in ((3, 8), (2, 173)):
            x = (torch.randn(2, 37, H, D, generator=gen) * 3).to(dt).to(dev)
            wide = (torch.randn(2, 37, H * D + 5, generator=gen) * 2).to(dt).to(dev)
            z = wide[..., 2:2 + H * D].view(2, 37, H, D)
            w = (1 + 0.3 * torch.randn(2, D, generator=gen)).to(dev)
            dy = torch.randn(2, 37, H, D, generator=gen).to(dt).to(dev)
            ins = [t.double().requires_grad_() for t in (x, w, z)]
            want = torch.stack([rms_norm_gate_torch(ins[0][g], ins[1][g], 1e-6, ins[2][g]) for g in range(2)])
            wants = torch.autograd.grad(want, ins, dy.double())
            y, rstd = rmsnorm_triton.forward(x.reshape(2, -1, D).contiguous(), w, 1e-6, dt, post=z)
            dx, dw, dz = rmsnorm_triton.backward(x.reshape(2, -1, D).contiguous(), w, rstd, dy.reshape(2, -1, D), post=z)
            tol = 1e-5 if dt == torch.float32 else 1e-2
            if y.dtype != dt or not all(matches(a.reshape(b.shape), b, tol)
                                        for a, b in zip((y, dx, dw, dz), (want.detach(), *wants))):
                return False
    for rdt, out_dt, with_ds in ((torch.float32, torch.float32, True), (torch.bfloat16, torch.bfloat16, True),
                                 (torch.bfloat16, torch.float32, False)):
        D = 173
        x = (torch.randn(2, 37, D, generator=gen) * 3).to(dev)
        r = (torch.randn(2, 37, D, generator=gen) * 2).to(rdt).to(dev)
        w = (1 + 0.3 * torch.randn(2, D, generator=gen)).to(dev)
        dy = torch.randn(2, 37, D, generator=gen).to(out_dt).to(dev)
        ds = torch.randn(2, 37, D, generator=gen).to(dev) if with_ds else None
        ins = [t.double().requires_grad_() for t in (x, r, w)]
        s_ = ins[0] + ins[1]
        want = torch.stack([rms_norm_torch(s_[g], ins[2][g], 1e-6) for g in range(2)])
        outs, gouts = (s_, want), ((ds.double() if with_ds else torch.zeros_like(s_)), dy.double())
        wants = torch.autograd.grad(outs, ins, gouts)
        y, rstd, s = rmsnorm_triton.forward(x.contiguous(), w, 1e-6, out_dt, r=r.contiguous())
        dx, dw, _, dr = rmsnorm_triton.backward(s, w, rstd, dy, ds=ds, r_dtype=rdt)
        tol = 1e-5 if rdt == out_dt == torch.float32 else 1e-2
        got = [s, y, dx, dr, dw]
        if dr.dtype != rdt or y.dtype != out_dt or not all(
                matches(a, b, tol) for a, b in zip(got, [s_.detach(), want.detach(), wants[0], wants[1], wants[2]])):
            return False
    return True


_USABLE = DeviceCheck(_matches_here)
