"""The rotary embedding's kernel (``mixzoo.kernels.rope_triton``: a program per (sequence, head) and block of
positions, the two half-heads loaded apart, cosine and sine computed in the kernel) against a variant tried on
2026-12-05 and not kept ("rows": a program per (sequence, block of positions) over all heads of a row, cosine and
sine from a table torch computes), side by side: the forward from a projection's strided view of q, and the
backward (the inverse rotation) from a contiguous gradient, at the mad recipe's heads (16 of 8) and batch 768 (six
stacked models of 128). Times are triton's do_bench medians; outputs must agree.

    python benchmarks/rope_kernel.py --T 128,256,512,1024 --out logs/rope-kernel.json

On the H200 (benchmarks/h200-2026-12-05) the variant was slower at every length (length 1024: forward 0.411
against 0.379 ms, backward 0.694 against 0.291), so it stayed here.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from mixzoo.kernels.rope_triton import inv_freq

_CS: dict[tuple, torch.Tensor] = {}


@triton.jit
def _rows_kernel(x, y, cs, H, T, sb, sh, st, sign, D: tl.constexpr, HALF: tl.constexpr, BT: tl.constexpr,
                 BJ: tl.constexpr):
    """x (B, H, T, D) at strides (sb, sh, st, 1) -> y (B, H, T, D) contiguous, pairs (i, i + HALF) rotated by
    the angle whose cosine and sine are cs[t, i] (sign -1: the inverse rotation, the backward). A program
    takes BT positions of one sequence and BJ of the H·D elements of a position (all heads at once: a row of
    a projection's output is read along its length)."""
    b, tb, jb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = tb * BT + tl.arange(0, BT)
    j = jb * BJ + tl.arange(0, BJ)
    h, d = j // D, j % D
    first = d < HALF
    i = tl.where(first, d, d - HALF)                   # the pair's index
    pd = tl.where(first, d + HALF, d - HALF)           # the other element of the pair
    m = (t < T)[:, None] & (j < H * D)[None, :]
    row = x + b.to(tl.int64) * sb + t.to(tl.int64)[:, None] * st + (h.to(tl.int64) * sh)[None, :]
    xv = tl.load(row + d[None, :], mask=m, other=0.).to(tl.float32)
    xp = tl.load(row + pd[None, :], mask=m, other=0.).to(tl.float32)
    at = cs + (t[:, None] * HALF + i[None, :]) * 2
    c = tl.load(at, mask=m, other=0.)
    s = tl.load(at + 1, mask=m, other=0.) * sign
    # first half: x_i c - x_{i+HALF} s; second half: x_{i+HALF} c + x_i s
    out = xv * c + tl.where(first, -xp, xp) * s
    dst = y + ((b * H + h).to(tl.int64)[None, :] * T + t.to(tl.int64)[:, None]) * D + d[None, :]
    tl.store(dst, out.to(y.dtype.element_ty), mask=m)



def cos_sin(T: int, half: int, base: float, device: torch.device) -> torch.Tensor:
    """(T, half, 2) float32: cos and sin of the angles t·inv_freq, by torch as ``rope_torch`` computes them (so
    the kernel's rotation is the PyTorch form's); made once per (T, half, base, device), outside a CUDA graph's
    capture (a table made inside one lives in the graph's memory and is not kept)."""
    key = (T, half, float(base), str(device))
    if key in _CS:
        return _CS[key]
    ang = torch.arange(T, device=device, dtype=torch.float32)[:, None] * inv_freq(half, base, device)[None, :]
    cs = torch.stack([ang.cos(), ang.sin()], dim=-1).contiguous()
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _CS[key] = cs
    return cs



def rows_rotate(x: torch.Tensor, base: float, inverse: bool = False) -> torch.Tensor:
    """x (B, H, T, D), D even and its last stride 1 -> the rotated x, contiguous."""
    B, H, T, D = x.shape
    y = torch.empty(B, H, T, D, dtype=x.dtype, device=x.device)
    if not (B * H and T):
        return y
    cs = cos_sin(T, D // 2, base, x.device)
    BJ = min(triton.next_power_of_2(H * D), 1024)
    BT = max(1, min(triton.next_power_of_2(T), 4096 // BJ))
    _rows_kernel[(B, triton.cdiv(T, BT), triton.cdiv(H * D, BJ))](
        x, y, cs, H, T, x.stride(0), x.stride(1), x.stride(2), -1.0 if inverse else 1.0,
        D=D, HALF=D // 2, BT=BT, BJ=BJ)
    return y


def main(argv=None) -> int:
    from mixzoo.kernels.rope_triton import rotate
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="128,256,512,1024")
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    H, D = a.heads, a.dim
    ms = lambda f: triton.testing.do_bench(f, warmup=10, rep=100, return_mode="median")     # noqa: E731
    rows = []
    for T in (int(t) for t in a.T.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        qkv = torch.randn(a.B, T, 3 * H * D, device="cuda", generator=g).bfloat16()
        q = qkv[..., :H * D].unflatten(-1, (H, D)).transpose(1, 2)                 # (B, H, T, D), strided
        dy = torch.randn(a.B, H, T, D, device="cuda", generator=g).bfloat16()
        row = dict(T=T, B=a.B, H=H, D=D)
        for name, fn in (("mixzoo", rotate), ("rows", rows_rotate)):
            row[f"{name}_fwd_ms"] = ms(lambda f=fn, x=q: f(x, 10000.0))
            row[f"{name}_bwd_ms"] = ms(lambda f=fn, x=dy: f(x, 10000.0, inverse=True))
        n_bytes = 2 * q.numel() * q.element_size()                    # read once, written once
        row["mixzoo_fwd_TBps"] = n_bytes / row["mixzoo_fwd_ms"] / 1e9
        row["rows_fwd_TBps"] = n_bytes / row["rows_fwd_ms"] / 1e9
        row["max_abs_diff"] = max(float((rotate(q, 1e4) - rows_rotate(q, 1e4)).float().abs().max()),
                                  float((rotate(dy, 1e4, True) - rows_rotate(dy, 1e4, True)).float().abs().max()))
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        from mixzoo.leaderboard.export import write_atomic
        write_atomic(a.out, json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
