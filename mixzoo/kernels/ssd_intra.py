"""Mamba-2's chunked scan (SSD) with B and C shared by the heads as Triton kernels
(``ssd_intra_triton``): the within-chunk part (``intra``)

    o[h, t] = sum_{s <= t in the chunk} exp(g_h[t] - g_h[s]) ks_h[s] (q_t . k_s) v_h[s]

and the whole scan (``chunk``), which adds exp(g_h[t]) q_t . S_h[n], S_h[n] the K x V state entering
chunk n (the chunks before it, each decayed to its end, carried along). q = C, k = B (one per chunk
position, every head's), g the chunk-local cumulative log-decay and ks = dt the key scale per head.

``mixzoo.models._scan.simple_gla_chunk`` computes the same in PyTorch: the within-chunk part as
(B, H, N, C, C) float32 tensors (the differences, their mask, exponent and key scaling, the scores'
product), about five written forward and eight backward per layer, and the states between chunks as
permuted copies, products, an einsum over the chunks and a concatenation, each a full float32 pass
over the values; at the mad recipe's 16 heads of 16 (chunk 64) they were most of Mamba-2's step. The
kernels: per (sequence, chunk) a program forms q kᵀ once for all heads and keeps the chunk's C x C
matrices in registers, and backward sums the gradients of q and k over the heads in registers; per
(sequence, head) a program carries the state over the chunks (forward) and its gradient back over them
(backward), writing K x V float32 per chunk. float32 throughout, products as three TF32 tensor-core
products (float32-level accuracy; ``ssd_intra_triton``).

``intra`` and ``chunk`` run them for float32 CUDA tensors (or under Triton's interpreter,
``TRITON_INTERPRET=1``) at chunks of 16 to 64 positions (a program holds several C x C float32
matrices: 128 would spill registers) once they have matched ``intra_torch`` and ``chunk_torch`` on that
device (``usable``); ``runs_on`` says whether they will. ``MIXZOO_SSD=torch`` turns them off, and so does
``torch.compile``; ``MIXZOO_SSD=intra`` keeps them within the chunks only (``whole``). Under vmap the
models fold into the batch (``mixzoo.train.vmapfold``). Imports nothing of mixzoo.
"""
from __future__ import annotations

import itertools
import os

import torch

from . import enabled
from ._check import DeviceCheck, interpreting


def intra_torch(q, k, v, gc, ks):
    """The reference: q, k (B, N, C, K); v (B, H, N, C, V); gc, ks (B, H, N, C) -> (B, H, N, C, V)."""
    C = q.shape[-2]
    tri = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    M = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~tri, float("-inf")).exp() * ks.unsqueeze(-2)
    return ((q @ k.transpose(-1, -2)).unsqueeze(1) * M) @ v


def chunk_torch(q, k, v, gc, ks, skip=None):
    """The reference of the whole chunked scan (``chunk``), with ``intra_torch``'s arguments (v in q's
    dtype): the within-chunk part plus exp(g_t) q_t . S_n, S_n the state entering chunk n, carried chunk
    by chunk (S_0 = 0, S_{n+1} = exp(g_last[n]) S_n + k[n]ᵀ (u[n] v[n]), u_s = exp(g_last - g_s) ks_s),
    plus skip[b, h] v where ``skip`` (B, H) is given."""
    v = v.to(q.dtype)
    o = intra_torch(q, k, v, gc, ks)
    B, H, N, C, V = v.shape
    S = v.new_zeros(B, H, q.shape[-1], V)
    inter = []
    for n in range(N):
        g = gc[:, :, n]                                                   # (B, H, C)
        inter.append(g.exp().unsqueeze(-1) * (q[:, None, n] @ S))
        gl = g[..., -1:]
        u = (gl - g).exp() * ks[:, :, n]
        S = gl.exp().unsqueeze(-1) * S + k[:, None, n].transpose(-1, -2) @ (u.unsqueeze(-1) * v[:, :, n])
    o = o + torch.stack(inter, 2)
    return o if skip is None else o + skip[:, :, None, None, None].to(q.dtype) * v


def runs_on(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``intra`` takes the kernels for q (B, N, C, K) and v (B, H, N, C, V) (tensors vmap may batch)."""
    C, K, V = q.shape[-2], q.shape[-1], v.shape[-1]
    return (os.environ.get("MIXZOO_SSD") != "torch" and enabled() and (q.is_cuda or interpreting())
            and q.dtype == torch.float32 and v.dtype in (torch.float32, torch.bfloat16)
            and C in (16, 32, 64) and K <= 128 and V <= 128
            and not torch.compiler.is_compiling() and usable((q.device.index or 0) if q.is_cuda else -1))


class _Chunk(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gc, ks, skip, inter):
        from . import RAN
        from . import ssd_intra_triton as K
        RAN.add("ssd_intra")
        q, k, gc, ks = (t.contiguous() for t in (q, k, gc, ks))
        skip = None if skip is None else skip.float().contiguous()
        o, es = K.forward(q, k, v, gc, ks, inter=inter, skip=skip)
        ctx.save_for_backward(q, k, v, gc, ks, es, skip)
        return o

    @staticmethod
    def backward(ctx, do):
        from . import ssd_intra_triton as K
        q, k, v, gc, ks, es, skip = ctx.saved_tensors
        *grads, dskip = K.backward(q, k, v, gc, ks, do, es, skip)
        return (*grads, dskip, None)


def intra(q, k, v, gc, ks):
    """``intra_torch``'s result: by the kernels where ``runs_on``, not under an unfolded vmap."""
    if torch._C._are_functorch_transforms_active() or not runs_on(q, v):
        return intra_torch(q, k, v.to(q.dtype), gc, ks)
    return _Chunk.apply(q, k, v, gc, ks, None, False)


def chunk(q, k, v, gc, ks, skip=None):
    """``chunk_torch``'s result, the whole chunked scan (within the chunks and across them, plus
    skip[b, h] v where ``skip`` (B, H) is given), in float32: by the kernels where ``runs_on`` (the
    states between chunks are carried by one program per sequence and head, kept as K x V float32 per
    chunk for the backward; v is read in its own layout and dtype, bfloat16 or float32, and the output
    written in that layout), else ``chunk_torch``."""
    if torch._C._are_functorch_transforms_active() or not runs_on(q, v):
        return chunk_torch(q, k, v, gc, ks, skip)
    return _Chunk.apply(q, k, v, gc, ks, skip, True)


def whole() -> bool:
    """Whether ``simple_gla_chunk`` takes ``chunk`` (the whole scan) where the kernels run, not ``intra`` with
    the states between chunks in PyTorch (``MIXZOO_SSD=intra``, the form before ``chunk``, to time one
    against the other)."""
    return os.environ.get("MIXZOO_SSD") != "intra"


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``intra_torch``'s and ``chunk_torch``'s outputs and gradients on this
    device (-1: the interpreter), checked once (``_check.DeviceCheck``): 3 heads, 3 chunks of 16 and of
    64, state widths 16 and 64 and a value width of 16 and one (24) that is not a power of two."""
    return _USABLE(device_index)


def errors_here(device_index: int) -> list[tuple[tuple[int, int, int, bool], list[float]]]:
    """The check's cases, ((C, K, V, whole scan), norm-relative errors of o, dq, dk, dv, dg, dks (and
    the skip's) against float64) on this device (-1: the interpreter): 3 heads, 3 chunks of 16 and of
    64, state widths 16 and 64 and value widths 24 (not a power of two) and 16; the within-chunk part
    (``intra``, contiguous values) and the whole scan with the skip (``chunk``, values read in place
    from a part of (B, T, H, V) memory, as Mamba-2 holds them)."""
    from . import ssd_intra_triton as Kt
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for (C, K, V), whole_scan in itertools.product(((16, 16, 24), (64, 64, 16)), (False, True)):
        B, H, N = 2, 3, 3
        q, k = (torch.randn(B, N, C, K, generator=gen) * K ** -0.5 for _ in range(2))
        v = torch.randn(B, N, C, H, V + 2, generator=gen)[..., :V]            # a part of the memory, as a split's
        v = v.permute(0, 3, 1, 2, 4) if whole_scan else v.permute(0, 3, 1, 2, 4).contiguous()
        gc = (-torch.rand(B, H, N, C, generator=gen) * 0.2).cumsum(-1)
        ks = torch.rand(B, H, N, C, generator=gen) + 0.1
        skip = torch.randn(B, H, generator=gen) if whole_scan else None
        do = torch.randn(B, H, N, C, V, generator=gen)
        ins = [t.double().requires_grad_() for t in (q, k, v, gc, ks) + ((skip,) if whole_scan else ())]
        want = chunk_torch(*ins) if whole_scan else intra_torch(*ins)
        wants = torch.autograd.grad(want, ins, do.double())
        args = [t.to(dev) for t in (q, k, v, gc, ks)]
        sk = None if skip is None else skip.to(dev)
        o, es = Kt.forward(*args, inter=whole_scan, skip=sk)
        got = [o, *Kt.backward(*args, do.to(dev), es, sk)][:len(wants) + 1]
        out.append(((C, K, V, whole_scan), [float((a.detach().double().cpu() - b).norm() / b.norm().clamp_min(1e-30))
                                            if a.shape == b.shape else float("inf")
                                            for a, b in zip(got, [want.detach(), *wants])]))
    return out


def _matches_here(device_index: int) -> bool:
    return all(max(errs) <= 1e-4 for _, errs in errors_here(device_index))


_USABLE = DeviceCheck(_matches_here)
