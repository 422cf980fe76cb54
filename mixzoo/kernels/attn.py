"""Causal softmax attention for small heads (at most 16 dims) as Triton kernels, forward and backward
(``attn_triton``), beside its plain-PyTorch reference ``attention_torch``.

Why: at the mad recipe (16 heads of 8) PyTorch's SDPA kernels pad each head to 32 (flash) or 64 (cuDNN,
its choice on Hopper), so most of their products are with zeros; on the H200 cuDNN's backward is three times
its forward (benchmarks/attn_small_heads.py). These kernels load a head at its width and pad it to 16 in
registers, the least ``tl.dot`` takes, and read q, k, v through their strides.

``attention(q, k, v)`` takes (B, H, T, D) tensors (any strides with a unit last one; half precision) and
returns (B, H, T, D) stored as (B, T, H, D), so that merging the heads is a view. ``runs_on(q)`` says whether
the ``softmax`` mechanism takes it: a CUDA tensor (or Triton's interpreter, ``TRITON_INTERPRET=1``) in bf16
or fp16, heads of at most ``MAX_DIM``, the switch ``MIXZOO_ATTN`` at ``triton`` (its default; ``sdpa`` turns
it off, and so does pinning an SDPA kernel with ``MIXZOO_SDPA``), not under ``torch.compile``, and the
kernels having matched the reference on that device (``usable``). Under ``torch.func.vmap`` the models fold
into the batch (``mixzoo.train.vmapfold``). Imports nothing of mixzoo.
"""
from __future__ import annotations

import math
import os

import torch

from . import aligned_strides, chosen, enabled, padded_dim
from ._check import DeviceCheck, interpreting, matches

MAX_DIM = 16
_DTYPES = (torch.bfloat16, torch.float16)
# (rows, columns, warps, stages) of each kernel's tile: forward (query rows, keys), dk/dv (query rows, keys),
# dq (query rows, keys); the larger of the two divides by the smaller (the loops' causal split needs it).
# benchmarks/attn_tiles.py on an H200 (16 heads of 8, batch 768; 72 candidates a length, each kernel swept with the
# others at the tiles it replaced, OLD_TILES): at length 1024 the forward's best was its own tile (4.57 ms), the
# backward 12.15 -> 11.30 ms with dk/dv at 16 x 128 and 11.51 ms with dq at 64 x 32; at 256 the forward
# 0.531 -> 0.501 ms at 64 x 32, the backward 1.460 -> 1.347 (dk/dv 32 x 64) and 1.343 (dq 64 x 32). Lengths of
# at least 512 take TILES, shorter ones SHORT_TILES (512 and 128 were not swept).
TILES = {"fwd": (128, 64, 4, 2), "dkdv": (16, 128, 4, 1), "dq": (64, 32, 4, 1)}
SHORT_TILES = {"fwd": (64, 32, 4, 1), "dkdv": (32, 64, 4, 1), "dq": (64, 32, 4, 1)}
SHORT_BELOW = 512
# the single set used before (MIXZOO_ATTN_TILES=old, for timing one against the other)
OLD_TILES = {"fwd": (128, 64, 4, 2), "dkdv": (32, 128, 4, 2), "dq": (128, 32, 4, 2)}


def attention_torch(q, k, v, scale: float | None = None):
    """The reference: causal softmax(scale q kᵀ) v on (..., T, D), in float32 (float64 for float64 inputs),
    the result in q's dtype."""
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    T = q.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.to(cdt) @ k.to(cdt).transpose(-1, -2)) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (s.softmax(-1) @ v.to(cdt)).to(q.dtype)


def _unit_last(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(strides) -> tuple[int, list[int]]:
    """(VEC, the strides in units of VEC) by default (``MIXZOO_ATTN_STRIDES=aligned``, ``kernels.aligned_strides``: the
    kernels then know a head's rows are VEC-aligned and load them in vectors), else (1, as they are)."""
    mode = chosen("MIXZOO_ATTN_STRIDES")
    return aligned_strides(strides) if mode == "aligned" else (1, list(strides))


def _launch_fwd(q, k, v, scale, tiles):
    from . import attn_triton as A
    B, H, T, D = q.shape
    o = torch.empty(B, T, H, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B * H, T, dtype=torch.float32, device=q.device)
    BM, BN, w, st = tiles["fwd"]
    vec, strides = _strides((q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                             v.stride(0), v.stride(1), v.stride(2)))
    A._fwd_kernel[(_cdiv(T, BM), B * H)](q, k, v, o, lse, T, H, scale * math.log2(math.e), *strides,
                                         D=D, DP=padded_dim(D), BM=BM, BN=BN, VEC=vec, num_warps=w, num_stages=st)
    return o, lse


def _launch_bwd(q, k, v, o, lse, do, scale, tiles):
    from . import attn_triton as A
    B, H, T, D = q.shape
    delta = torch.empty(B * H, T, dtype=torch.float32, device=q.device)
    BT = 128
    dvec, dstrides = _strides((do.stride(0), do.stride(2), do.stride(1)))
    A._delta_kernel[(B * H, _cdiv(T, BT))](o, do, delta, T, H, *dstrides, D=D, DP=padded_dim(D), BT=BT, VEC=dvec)
    dq, dk, dv = (torch.empty(B, T, H, D, dtype=t.dtype, device=q.device) for t in (q, k, v))
    vec, strides = _strides((q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                             v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2)))
    sc2 = scale * math.log2(math.e)
    BM, BN, w, st = tiles["dkdv"]
    A._dkdv_kernel[(_cdiv(T, BN), B * H)](q, k, v, do, lse, delta, dk, dv, T, H, sc2, scale, *strides,
                                                D=D, DP=padded_dim(D), BM=BM, BN=BN, VEC=vec, num_warps=w, num_stages=st)
    BM, BN, w, st = tiles["dq"]
    A._dq_kernel[(_cdiv(T, BM), B * H)](q, k, v, do, lse, delta, dq, T, H, sc2, scale, *strides,
                                              D=D, DP=padded_dim(D), BM=BM, BN=BN, VEC=vec, num_warps=w, num_stages=st)
    return tuple(t.transpose(1, 2) for t in (dq, dk, dv))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_tiles(T: int) -> dict:
    """The tiles a length-T call takes (``TILES`` or ``SHORT_TILES``; ``OLD_TILES`` with MIXZOO_ATTN_TILES=old)."""
    if os.environ.get("MIXZOO_ATTN_TILES") == "old":
        return OLD_TILES
    return SHORT_TILES if T < SHORT_BELOW else TILES


def _tiles(tiles: dict | None, T: int) -> dict:
    t = dict(default_tiles(T), **(tiles or {}))
    for name, (rows, keys, _, _) in t.items():          # the loops' causal split: the larger side a multiple
        big, small = (keys, rows) if name == "dkdv" else (rows, keys)
        if big % small:
            raise ValueError(f"attention tiles {name}: {rows} x {keys}; the "
                             f"{'keys' if name == 'dkdv' else 'rows'} must be a multiple of the "
                             f"{'rows' if name == 'dkdv' else 'keys'}")
    return t


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, tiles):
        q, k, v = (_unit_last(t) for t in (q, k, v))
        o, lse = _launch_fwd(q, k, v, scale, tiles)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.scale, ctx.tiles = scale, tiles
        return o.transpose(1, 2)

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        do = _unit_last(do)                         # (B, H, T, D) logical; strides read as they are
        dq, dk, dv = _launch_bwd(q, k, v, o, lse, do, ctx.scale, ctx.tiles)
        return dq, dk, dv, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
              tiles: dict | None = None) -> torch.Tensor:
    """Causal softmax attention of (B, H, T, D) q, k, v (D <= ``MAX_DIM``, bf16 or fp16), scale 1/sqrt(D) by
    default: (B, H, T, D), stored (B, T, H, D). ``tiles`` overrides entries of ``default_tiles(T)`` (for timing)."""
    B, H, T, D = q.shape
    if D > MAX_DIM or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"attention: q, k, v of shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; "
                         f"equal shapes with heads of at most {MAX_DIM} are supported")
    return _Attention.apply(q, k, v, float(D ** -0.5 if scale is None else scale), _tiles(tiles, T))


def switch() -> str:
    return chosen("MIXZOO_ATTN")


def runs_on(q: torch.Tensor, dropout: float = 0.0) -> bool:
    """Whether the ``softmax`` mechanism's attention of q (B, H, T, D) takes these kernels (module docstring)."""
    return (switch() == "triton" and not os.environ.get("MIXZOO_SDPA") and dropout == 0.0 and enabled()
            and (q.is_cuda or interpreting()) and q.dim() == 4 and 1 <= q.shape[-1] <= MAX_DIM
            and q.dtype in _DTYPES and not torch.compiler.is_compiling()
            and usable((q.device.index or 0) if q.is_cuda else -1))


def usable(device_index: int = 0) -> bool:
    """Whether the kernels give ``attention_torch``'s output and gradients on this device (-1: the
    interpreter), checked once (``_check.DeviceCheck``): bf16, heads of 8 and 5 from a projection's strided
    views, a partial tile of positions, at the short lengths' tiles and at the long ones'."""
    return _USABLE(device_index)


def _matches_here(device_index: int) -> bool:
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for D, T in ((8, 150), (5, 37)):
        H = 3
        qkv = torch.randn(2, T, 3 * H * D, generator=gen).to(torch.bfloat16).to(dev)
        q, k, v = (t.unflatten(-1, (H, D)).transpose(1, 2) for t in qkv.chunk(3, -1))
        do = torch.randn(2, H, T, D, generator=gen).to(torch.bfloat16).to(dev)
        ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
        want = attention_torch(*ref)
        want_g = torch.autograd.grad(want, ref, do.double())
        for tiles in (None, TILES):          # the length's own tiles, and the long ones at this short length
            got_in = [t.detach().requires_grad_() for t in (q, k, v)]
            got = attention(*got_in, tiles=tiles)
            got_g = torch.autograd.grad(got, got_in, do)
            if not (got.dtype == torch.bfloat16 and matches(got, want.detach(), 1e-2)
                    and all(matches(a, b, 2e-2) for a, b in zip(got_g, want_g))):
                return False
    return True


_USABLE = DeviceCheck(_matches_here)
