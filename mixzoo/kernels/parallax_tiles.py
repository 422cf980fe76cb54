"""fla's Parallax kernels (``fla.ops.parallax.parallel``) launched at other tiles: the same Triton kernels and
operations, tiles of query rows and keys chosen per kernel.

Why: on Hopper fla launches all of them at one square tile of 128 x 128 with 8 warps (one tile size shared so that
its variable-length chunk indices fit every grid). At the mad recipe's heads (8, padded to 16) ``ptxas -v`` for
sm_90a reports 624 bytes of register spills a thread in the key/value-gradient kernel there and 36 in the
query/probe-gradient kernel; mixzoo's attention kernels, the same kind of loop, were fastest at narrower tiles with
4 warps (benchmarks/h200-2026-12-03d). For fixed-length inputs with no window the kernels take any tiles whose
larger side divides by the smaller (their loops split the causal prefix by block indices); ``TILES`` holds mixzoo's,
timed by ``benchmarks/parallax_tiles.py``.

``parallax(q, r, k, v, scale)`` takes fla's layout ((B, T, H, D), contiguous, bf16/fp16, equal query and key heads)
and returns o as fla's ``parallel_parallax`` does, with fla's forward state and backward. Heads narrower than 16 are
taken as they are: the kernels load a head of width D into a block of ``block_k(D)`` >= 16 columns with masked loads
and stores (zeros in registers, where fla's own launcher, whose block is D wide, needs them padded in memory: its
``tl.dot`` refuses an inner dimension below 16), so the numbers are those of the zero-padded call, bit for bit.
``runs_on`` says whether the ``parallax`` mechanism takes it: the switch ``MIXZOO_PARALLAX_TILES`` at ``mixzoo``, the
default (``fla`` keeps fla's launcher), fla present, a CUDA device (or Triton's interpreter), not under
``torch.compile``. Imports nothing of mixzoo.
"""
from __future__ import annotations

import torch

from . import chosen
from ._check import interpreting

# (query rows, keys, warps, stages) per kernel; dkv's program holds keys and walks query rows. The fastest of
# benchmarks/parallax_tiles.py's candidates on the H200 at lengths 256 and 1024 (benchmarks/h200-2026-12-03e: 3
# stages faster for fwd and dqr at both, mixed for dkv); no register spills for sm_90a at heads of 16 (ptxas -v: 139,
# 160 and 255 registers; fla's 128 x 128 x 8 spills 36 bytes a thread in dqr and 624 in dkv).
TILES = {"fwd": (64, 64, 4, 3), "dqr": (64, 32, 4, 3), "dkv": (64, 64, 4, 2)}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_k(K: int) -> int:
    """The kernels' block of head columns for heads of K: the next power of two, at least 16 (``tl.dot``'s least)."""
    import triton
    return max(16, triton.next_power_of_2(K))


def _check_tiles(t: dict) -> dict:
    for name, (a, b, _, _) in t.items():
        if max(a, b) % min(a, b):
            raise ValueError(f"parallax tiles {name}: {a} x {b}; the larger must be a multiple of the smaller")
    return t


def forward(q, r, k, v, scale: float, tiles: dict | None = None):
    """fla's ``parallel_parallax_fwd`` for fixed-length inputs, no window, at ``tiles``: (o, barv, d1, bart, m)."""
    from fla.ops.parallax import parallel as P
    t = _check_tiles(dict(TILES, **(tiles or {})))
    B, T, H, K = q.shape
    o, barv = torch.empty_like(q), torch.empty_like(q)
    d1, bart, m = (torch.empty(B, T, H, device=q.device, dtype=torch.float32) for _ in range(3))
    BT, BS, w, st = t["fwd"]
    P.parallel_parallax_fwd_kernel[(_cdiv(T, BT), B * H)](
        q, r, k, v, o, barv, d1, bart, m, scale, None, None, T, HQ=H, H=H, G=1, K=K,
        BK=block_k(K), WINDOW_SIZE_LEFT=-1, BT=BT, BS=BS, num_warps=w, num_stages=st)
    return o, barv, d1, bart, m


def backward(q, r, k, v, o, barv, d1, bart, m, do, scale: float, tiles: dict | None = None):
    """fla's ``parallel_parallax_bwd`` for fixed-length inputs, no window, at ``tiles``: (dq, dr, dk, dv)."""
    from fla.ops.parallax import parallel as P
    t = _check_tiles(dict(TILES, **(tiles or {})))
    B, T, H, K = q.shape
    BK = block_k(K)
    dq, dr, dk, dv = (torch.empty_like(x) for x in (q, r, k, v))
    delta_t, delta_b = (torch.empty(B, T, H, device=q.device, dtype=torch.float32) for _ in range(2))
    P.parallel_parallax_bwd_kernel_preprocess[(_cdiv(T, 128), B * H)](
        do, o, barv, delta_t, delta_b, None, None, T, HQ=H, K=K, BK=BK, BT=128, num_warps=4, num_stages=2)
    common = dict(HQ=H, H=H, G=1, K=K, BK=BK, WINDOW_SIZE_LEFT=-1)
    BT, BS, w, st = t["dqr"]
    P.parallel_parallax_bwd_kernel_dqr[(_cdiv(T, BT), B * H)](
        q, r, k, v, d1, bart, m, delta_t, delta_b, do, dq, dr, scale, None, None, T, **common, BT=BT, BS=BS,
        num_warps=w, num_stages=st)
    BT, BS, w, st = t["dkv"]
    P.parallel_parallax_bwd_kernel_dkv[(_cdiv(T, BS), B * H)](
        q, r, k, v, d1, bart, m, delta_t, delta_b, do, dk, dv, scale, None, None, T, **common, BT=BT, BS=BS,
        num_warps=w, num_stages=st)
    return dq, dr, dk, dv


class _Parallax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, r, k, v, scale, tiles):
        q, r, k, v = (x.contiguous() for x in (q, r, k, v))
        o, barv, d1, bart, m = forward(q, r, k, v, scale, tiles)
        ctx.save_for_backward(q, r, k, v, o, barv, d1, bart, m)
        ctx.scale, ctx.tiles = scale, tiles
        return o

    @staticmethod
    def backward(ctx, do):
        grads = backward(*ctx.saved_tensors, do.contiguous(), ctx.scale, ctx.tiles)
        return (*grads, None, None)


def parallax(q: torch.Tensor, r: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
             tiles: dict | None = None) -> torch.Tensor:
    """Causal Parallax as fla's ``parallel_parallax`` computes it ((B, T, H, D) inputs, r not scaled, ``scale`` on
    q.k, default 1/sqrt(D)), by fla's kernels at ``TILES`` (entries overridden by ``tiles``); any head width D (narrower
    than 16: in blocks of 16, masked, as the zero-padded call)."""
    if not (q.shape == r.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(f"parallax: q, r, k, v of shapes {tuple(q.shape)}, {tuple(r.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}; equal (B, T, H, D) shapes are supported")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"parallax: bf16 or fp16 inputs, got {q.dtype}")
    return _Parallax.apply(q, r, k, v, float(q.shape[-1] ** -0.5 if scale is None else scale), tiles)


def switch() -> str:
    return chosen("MIXZOO_PARALLAX_TILES")


def runs_on(q: torch.Tensor) -> bool:
    """Whether the ``parallax`` mechanism takes these launches for q (module docstring)."""
    if switch() != "mixzoo" or not (q.is_cuda or interpreting()) or torch.compiler.is_compiling():
        return False
    try:
        import fla.ops.parallax.parallel  # noqa: F401
    except Exception:
        return False
    return True
