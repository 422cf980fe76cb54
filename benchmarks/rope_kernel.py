"""The rotary embedding's kernel (``mixzoo.kernels.rope_triton``) against the one it replaced (a program per
(sequence, head) and block of positions, each row's two half-heads loaded apart, the angles' cosine and sine
computed in the kernel), side by side: the forward from a projection's strided view of q, and the backward
(the inverse rotation) from a contiguous gradient, at the mad recipe's heads (16 of 8) and batch 768 (six
stacked models of 128). Times are triton's do_bench medians; outputs must agree (the table is torch's cos and
sin, the old kernel's libdevice's: float32 rounding).

    python benchmarks/rope_kernel.py --T 128,256,512,1024 --out logs/rope-kernel.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import triton
import triton.language as tl


@triton.jit
def _old_kernel(x, y, inv_freq, H, T, sb, sh, st, HALF, sign, BT: tl.constexpr, BH: tl.constexpr):
    bh, tb = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    t = tb * BT + tl.arange(0, BT)
    i = tl.arange(0, BH)
    m = (t < T)[:, None] & (i < HALF)[None, :]
    src = x + b.to(tl.int64) * sb + h.to(tl.int64) * sh + t.to(tl.int64)[:, None] * st + i[None, :]
    x1 = tl.load(src, mask=m, other=0.).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m, other=0.).to(tl.float32)
    inv = tl.load(inv_freq + i, mask=i < HALF, other=0.)
    ang = t.to(tl.float32)[:, None] * inv[None, :]
    c, s = tl.cos(ang), tl.sin(ang) * sign
    dst = y + (bh.to(tl.int64) * T + t.to(tl.int64))[:, None] * (2 * HALF) + i[None, :]
    tl.store(dst, (x1 * c - x2 * s).to(y.dtype.element_ty), mask=m)
    tl.store(dst + HALF, (x1 * s + x2 * c).to(y.dtype.element_ty), mask=m)


def old_rotate(x, base, inverse=False):
    from mixzoo.kernels.rope_triton import inv_freq
    B, H, T, D = x.shape
    half = D // 2
    y = torch.empty(B, H, T, D, dtype=x.dtype, device=x.device)
    BH = triton.next_power_of_2(half)
    BT = max(1, min(triton.next_power_of_2(T), 2048 // BH))
    _old_kernel[(B * H, triton.cdiv(T, BT))](x, y, inv_freq(half, base, x.device), H, T, x.stride(0), x.stride(1),
                                            x.stride(2), half, -1.0 if inverse else 1.0, BT=BT, BH=BH)
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
        for name, fn in (("new", rotate), ("old", old_rotate)):
            row[f"{name}_fwd_ms"] = ms(lambda f=fn, x=q: f(x, 10000.0))
            row[f"{name}_bwd_ms"] = ms(lambda f=fn, x=dy: f(x, 10000.0, inverse=True))
        n_bytes = 2 * q.numel() * q.element_size()                    # read once, written once
        row["new_fwd_TBps"] = n_bytes / row["new_fwd_ms"] / 1e9
        row["old_fwd_TBps"] = n_bytes / row["old_fwd_ms"] / 1e9
        row["max_abs_diff"] = max(float((rotate(q, 1e4) - old_rotate(q, 1e4)).float().abs().max()),
                                  float((rotate(dy, 1e4, True) - old_rotate(dy, 1e4, True)).float().abs().max()))
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        d = os.path.dirname(os.path.abspath(a.out))
        with tempfile.NamedTemporaryFile("w", dir=d, delete=False, suffix=".tmp") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
        os.replace(f.name, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
