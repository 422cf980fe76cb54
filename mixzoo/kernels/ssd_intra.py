"""The within-chunk part of Mamba-2's chunked scan (SSD) with B and C shared by the heads, as one
Triton kernel forward and one backward (``ssd_intra_triton``):

    o[h, t] = sum_{s <= t in the chunk} exp(g_h[t] - g_h[s]) ks_h[s] (q_t . k_s) v_h[s]

for q = C, k = B (one per chunk position, every head's), the chunk-local cumulative log-decay g and
the key scale ks = dt per head. ``mixzoo.models._scan.simple_gla_chunk`` computes it in PyTorch as
(B, H, N, C, C) float32 tensors (the differences, their mask, exponent and key scaling, the scores'
product), about five written forward and eight backward per layer: at the mad recipe's 16 heads of 16
(chunk 64) they are most of Mamba-2's step. The kernels keep each chunk's C x C matrices in registers:
per (sequence, chunk) a program forms q kᵀ once for all heads, and backward sums its gradient over the
heads before dq, dk. float32 inputs and accumulation; the products' form is below. The values are
read in their own layout (Mamba-2 holds them as (B, T, H, V): a view of that, chunked, needs no copy), and
the output and the value gradient are written in it.

``intra`` runs them for float32 CUDA tensors (or under Triton's interpreter, ``TRITON_INTERPRET=1``)
at chunks of 16 to 64 positions (a program holds several C x C float32 matrices: 128 would spill
registers) once they have matched ``intra_torch`` on that device (``usable``);
``runs_on`` says whether they will. ``MIXZOO_SSD=torch`` turns them off, and so does ``torch.compile``.
``MIXZOO_SSD_DOT`` picks the form of their products (``SSD_FORMS``): ``bf16``, the default (operands rounded to
bfloat16 for the tensor cores, float32 accumulation: the precision of mamba-ssm's SSD kernels in bfloat16
training; checked against float64 to bfloat16's tolerance and recorded as ``ssd_intra-bf16``; 1.16x a stacked
Mamba-2 step at lengths 128 to 1024 on the H200), or ``ieee`` (full float32 products, recorded as ``ssd_intra``).
Under vmap the models fold into the batch (``mixzoo.train.vmapfold``). Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

import torch

from . import SSD_FORMS, chosen, enabled, switch_error
from ._check import DeviceCheck, interpreting

# the self-check's bound on every norm-relative error against float64, per product form: float32's products
# come within a few 1e-7, bfloat16 operands within a few 1e-3
TOLERANCE = {"ieee": 1e-4, "bf16": 2e-2}


def intra_torch(q, k, v, gc, ks):
    """The reference: q, k (B, N, C, K); v (B, H, N, C, V); gc, ks (B, H, N, C) -> (B, H, N, C, V)."""
    C = q.shape[-2]
    tri = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    M = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~tri, float("-inf")).exp() * ks.unsqueeze(-2)
    return ((q @ k.transpose(-1, -2)).unsqueeze(1) * M) @ v


def runs_on(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``intra`` takes the kernels for q (B, N, C, K) and v (B, H, N, C, V) (tensors vmap may batch)."""
    C, K, V = q.shape[-2], q.shape[-1], v.shape[-1]
    return (os.environ.get("MIXZOO_SSD") != "torch" and enabled() and (q.is_cuda or interpreting())
            and q.dtype == v.dtype == torch.float32 and C in (16, 32, 64) and K <= 128 and V <= 128
            and not torch.compiler.is_compiling() and usable((q.device.index or 0) if q.is_cuda else -1))


def form() -> str:
    """The kernels' product form: ``MIXZOO_SSD_DOT`` (validated at the command line), default ``SSD_FORMS[0]``."""
    f = chosen("MIXZOO_SSD_DOT")
    if f not in SSD_FORMS:
        raise ValueError(switch_error())
    return f


def ran_name(f: str) -> str:
    """The name a run records for the kernels in form ``f`` (the forms' numbers differ): ``ssd_intra`` for full
    float32 products (what rows recorded before bf16 became the default), ``ssd_intra-<form>`` for another."""
    return "ssd_intra" if f == "ieee" else f"ssd_intra-{f}"


class _Intra(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gc, ks):
        from . import RAN
        from . import ssd_intra_triton as K
        f = form()
        RAN.add(ran_name(f))
        q, k, gc, ks = (t.contiguous() for t in (q, k, gc, ks))
        v = v if v.stride(-1) == 1 else v.contiguous()       # read in place: a view of (B, T, H, V) memory
        ctx.save_for_backward(q, k, v, gc, ks)
        ctx.form = f
        return K.forward(q, k, v, gc, ks, f)

    @staticmethod
    def backward(ctx, do):
        from . import ssd_intra_triton as K
        return K.backward(*ctx.saved_tensors, do if do.stride(-1) == 1 else do.contiguous(), ctx.form)


def intra(q, k, v, gc, ks):
    """``intra_torch``'s result: by the kernels where ``runs_on``, not under an unfolded vmap."""
    if torch._C._are_functorch_transforms_active() or not runs_on(q, v):
        return intra_torch(q, k, v, gc, ks)
    return _Intra.apply(q, k, v, gc, ks)


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``intra_torch``'s output and gradients on this device (-1: the
    interpreter), checked once (``_check.DeviceCheck``): 3 heads, 2 chunks of 16 and of 64, state
    widths 16 and 64 and a value width of 16 and one (24) that is not a power of two; the values
    contiguous, and (the mad recipe's case) a view of a part of (B, T, H, V) memory, as Mamba-2 holds
    them; in the product form ``form()`` picks, to its ``TOLERANCE``."""
    return _USABLE((device_index, form()))


def errors_here(device_index: int, f: str = SSD_FORMS[0]) -> list[tuple[tuple[int, int, int], list[float]]]:
    """The check's cases, ((C, K, V), norm-relative errors of o, dq, dk, dv, dg, dks against float64)
    on this device (-1: the interpreter), products in form ``f``: 3 heads, 2 chunks of 16 and of 64,
    state widths 16 and 64 and value widths 24 (not a power of two) and 16; at 16 the values and the
    output's gradient are views of a part of (B, T, H, V) memory (strided, the value dimension
    contiguous), at 24 contiguous."""
    from . import ssd_intra_triton as Kt
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for C, K, V in ((16, 16, 24), (64, 64, 16)):
        B, H, N = 2, 3, 2
        q, k = (torch.randn(B, N, C, K, generator=gen) * K ** -0.5 for _ in range(2))
        strided = V == 16   # v and do views of the first V of V + 2 columns of (B, N, C, H, V + 2) memory
        part = (lambda m, V=V: m[..., :V].permute(0, 3, 1, 2, 4)) if strided else (lambda m: m)
        shape = (B, N, C, H, V + 2) if strided else (B, H, N, C, V)
        vm, dom = (torch.randn(*shape, generator=gen) for _ in range(2))
        v, do = part(vm), part(dom)
        gc = (-torch.rand(B, H, N, C, generator=gen) * 0.2).cumsum(-1)
        ks = torch.rand(B, H, N, C, generator=gen) + 0.1
        ins = [t.double().requires_grad_() for t in (q, k, v, gc, ks)]
        want = intra_torch(*ins)
        wants = torch.autograd.grad(want, ins, do.double())
        args = [t.to(dev) for t in (q, k)] + [part(vm.to(dev))] + [t.to(dev) for t in (gc, ks)]
        got = [Kt.forward(*args, f), *Kt.backward(*args, part(dom.to(dev)), f)]
        out.append(((C, K, V), [float((a.detach().double().cpu() - b).norm() / b.norm().clamp_min(1e-30))
                                if a.shape == b.shape else float("inf") for a, b in zip(got, [want.detach(), *wants])]))
    return out


def _matches_here(key: tuple[int, str]) -> bool:
    return all(max(errs) <= TOLERANCE[key[1]] for _, errs in errors_here(*key))


_USABLE = DeviceCheck(_matches_here)
