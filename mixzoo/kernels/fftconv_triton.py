"""The Triton kernel behind ``mixzoo.kernels.fftconv``'s channels-first layout (imported only when it is to run): the
last two dimensions of a tensor swapped into a contiguous one, in tiles, with a cast.

PyTorch's ``copy_`` of a transposed view walks the output in order and reads the input with the stride of its
last dimension (a gate of Hyena's (B, T, 3C) input, read along time, jumps 3C elements a step): at Hyena's stacked
shape at length 1024 such strided products and copies were about a third of the step (benchmarks/h100-2026-12-06b/
profile-hyena-mad1024-15c5268.md, ``elementwise_kernel<128, ...>``). Here a program loads a (rows, columns) tile
along the input's contiguous dimension and stores it along the output's; Triton's layout conversion goes through
shared memory between the two, so both sides are coalesced.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

#: (tile rows, tile columns, warps): a launch parameter (the numbers do not depend on it)
TILE = (64, 64, 4)


@triton.jit
def _transpose_kernel(x, o, A, Bn, n_a, s_r, s_a, s_b, BA: tl.constexpr, BB: tl.constexpr):
    """o[r, b, a] = x[r, a, b] for x (R, A, Bn) at strides (s_r, s_a, s_b), o contiguous (R, Bn, A), cast to o's
    dtype. Program (r · n_a + tile of a, tile of b)."""
    p = tl.program_id(0)
    r = (p // n_a).to(tl.int64)
    a = (p % n_a) * BA + tl.arange(0, BA)
    b = tl.program_id(1) * BB + tl.arange(0, BB)
    m = (a[:, None] < A) & (b[None, :] < Bn)
    t = tl.load(x + r * s_r + a[:, None].to(tl.int64) * s_a + b[None, :].to(tl.int64) * s_b, mask=m)
    tl.store(o + r * A * Bn + b[None, :].to(tl.int64) * A + a[:, None], t.to(o.dtype.element_ty), mask=m)


def transpose(x: torch.Tensor, dtype: torch.dtype, tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x (..., A, B), any strides -> (..., B, A) contiguous in ``dtype``."""
    ba, bb, warps = tile or TILE
    *lead, A, Bn = x.shape
    o = torch.empty(*lead, Bn, A, dtype=dtype, device=x.device)
    if o.numel() == 0:
        return o
    x3 = x.reshape(-1, A, Bn)          # a view where the leading dimensions collapse (the operator's inputs)
    R = x3.shape[0]
    n_a = triton.cdiv(A, ba)
    _transpose_kernel[(R * n_a, triton.cdiv(Bn, bb))](x3, o, A, Bn, n_a, *x3.stride(), BA=ba, BB=bb,
                                                       num_warps=warps)
    return o
