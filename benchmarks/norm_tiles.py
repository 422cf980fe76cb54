"""Launch shapes of the memory-bound kernels every mad step runs (mixzoo.kernels.rmsnorm_triton, swiglu_triton):
elements and warps a program. At the mad recipe's shapes (width 128, SwiGLU inner width 352; six stacked models
of batch 128 as six groups) they are pure traffic, so each launch's time is set against the bytes it must move
(GB/s); the profile of 2026-12-05 (benchmarks/h200-2026-12-05c/profile-1024.md) put them at about half the H200's
bandwidth, some 7 ms of every mechanism's step at length 1024.

Cases, each as the step calls it (dtypes under bf16 autocast; the residual stream in float32):
  add16   s = x + r and its norm in bf16 (a block's second norm, before the MLP): x f32, r bf16, y bf16;
          backward with s's other gradient ds (f32), dy bf16, dr bf16
  add32   the same with the norm in float32 (the first norm, before a mixer; the final norm)
  gate    the gated norm of x silu(z) (Mamba-2's), x and z bf16, y f32
  swiglu  silu(a) b of h = [a b] (bf16, 704 wide) -> 352 wide, and its backward

For each tiling: median ms forward and backward (``triton.testing.do_bench``), GB/s of the bytes each must move,
and its outputs against the default tiling's: every output but the weight gradient must be equal bit for bit
(a row is one program's whatever the tiling); the weight gradient's partial sums differ in order.

    python benchmarks/norm_tiles.py --out logs/norm_tiles.json --md logs/norm_tiles.md
    TRITON_INTERPRET=1 python benchmarks/norm_tiles.py --device cpu --rows 40 --T 8 (a smoke run)
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

NORM_TILES = [(f, w) for f in (2048, 4096, 8192, 16384) for w in (2, 4, 8, 16)]
SWIGLU_TILES = [(b, w) for b in (1024, 2048, 4096) for w in (4, 8, 16)]


def bench(fn) -> float:
    """Median ms (``triton.testing.do_bench``); on the CPU (the interpreter's smoke run) one call's."""
    if not torch.cuda.is_available():
        import time
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def norm_case(case: str, G: int, R: int, D: int, dev, gen):
    """fwd(tile) -> outputs, bwd(outputs, tile) -> gradients, and the bytes each moves."""
    from mixzoo.kernels import rmsnorm_triton as K
    f32, bf = torch.float32, torch.bfloat16

    def rnd(dt, scale=1.0):
        return (torch.randn(G, R, D, device=dev, generator=gen) * scale).to(dt)
    w = 1 + 0.3 * torch.randn(G, D, device=dev, generator=gen)
    if case in ("add16", "add32"):
        out = bf if case == "add16" else f32
        x, r, dy, ds = rnd(f32, 3), rnd(bf, 2), rnd(out), rnd(f32)

        def fwd(tile):
            return K.forward(x, w, 1e-6, out, r=r, tile=tile)

        def bwd(o, tile):
            y, rstd, s = o
            return K.backward(s, w, rstd, dy, ds=ds, r_dtype=bf, tile=tile)
        y, rstd, s = fwd(None)
        dx, dw, _, dr = bwd((y, rstd, s), None)
        return fwd, bwd, nbytes(x, r, s, y, rstd), nbytes(s, dy, ds, rstd, dx, dr)
    x, z, dy = rnd(bf, 3), rnd(bf, 2), rnd(f32)

    def fwd(tile):
        return K.forward(x, w, 1e-6, f32, z, tile=tile)

    def bwd(o, tile):
        return K.backward(x, w, o[1], dy, z, tile=tile)
    y, rstd = fwd(None)
    dx, dw, dz = bwd((y, rstd), None)
    return fwd, bwd, nbytes(x, z, y, rstd), nbytes(x, z, dy, rstd, dx, dz)


def swiglu_case(N: int, F: int, dev, gen):
    from mixzoo.kernels import swiglu_triton as K
    h = torch.randn(N, 2 * F, device=dev, generator=gen).to(torch.bfloat16)
    do = torch.randn(N, F, device=dev, generator=gen).to(torch.bfloat16)

    def fwd(tile):
        return (K.forward(h, tile),)

    def bwd(o, tile):
        return (K.backward(h, do, tile),)
    return fwd, bwd, nbytes(h, do), nbytes(h, do, h)


def sweep(name: str, L: int, fwd, bwd, fbytes: int, bbytes: int, tiles, default) -> list[dict]:
    ref_o = fwd(None)
    ref_g = bwd(ref_o, None)
    rows = []
    for tile in tiles:
        o = fwd(tile)
        g = bwd(o, tile)
        exact = all(torch.equal(a, b) for a, b in zip(o, ref_o))
        dw_diff = 0.0
        for i, (a, b) in enumerate(zip(g, ref_g)):
            if a is None:
                continue
            if name.startswith(("add", "gate")) and i == 1:      # the weight gradient: partial sums reordered
                dw_diff = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
            else:
                exact = exact and torch.equal(a, b)
        t_f = bench(lambda: fwd(tile))  # noqa: B023
        t_b = bench(lambda: bwd(o, tile))  # noqa: B023
        row = dict(case=name, L=L, tile=list(tile), default=tuple(tile) == tuple(default), fwd_ms=t_f, bwd_ms=t_b,
                   total_ms=t_f + t_b, fwd_GBps=fbytes / t_f / 1e6, bwd_GBps=bbytes / t_b / 1e6, exact=exact,
                   dw_rel_diff=dw_diff)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict], device: str) -> str:
    """Per (case, length): the default tiling and the fastest exact one."""
    out = [f"Device: {device}. Median ms (triton.testing.do_bench); GB/s of the bytes each launch must move.", "",
           "| case | L | default tile | fwd ms | bwd ms | fwd GB/s | bwd GB/s | best tile | fwd ms | bwd ms | "
           "fwd GB/s | bwd GB/s | time / default |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["case"], r["L"]) for r in rows):
        rs = [r for r in rows if (r["case"], r["L"]) == key]
        d = next((r for r in rs if r["default"]), None)
        b = min((r for r in rs if r["exact"]), key=lambda r: r["total_ms"], default=None)
        if d is None or b is None:
            continue
        out.append(f"| {key[0]} | {key[1]} | {tuple(d['tile'])} | {d['fwd_ms']:.3f} | {d['bwd_ms']:.3f} | "
                   f"{d['fwd_GBps']:.0f} | {d['bwd_GBps']:.0f} | {tuple(b['tile'])} | {b['fwd_ms']:.3f} | "
                   f"{b['bwd_ms']:.3f} | {b['fwd_GBps']:.0f} | {b['bwd_GBps']:.0f} | "
                   f"{b['total_ms'] / d['total_ms']:.3f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    from mixzoo.kernels import rmsnorm_triton, swiglu_triton
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--G", type=int, default=6, help="stacked models (groups)")
    ap.add_argument("--rows", type=int, default=128, help="sequences a model (batch)")
    ap.add_argument("--T", default="1024,128", help="lengths")
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--F", type=int, default=352, help="SwiGLU inner width")
    ap.add_argument("--cases", default="add16,add32,gate,swiglu")
    ap.add_argument("--out")
    ap.add_argument("--md")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (timings meaningless)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    cpu = dev.type == "cpu"
    rows = []
    for T in (int(t) for t in a.T.split(",")):
        R = a.rows * T
        for case in a.cases.split(","):
            if case == "swiglu":
                f, b, fb, bb = swiglu_case(a.G * R, a.F, dev, gen)
                tiles = [swiglu_triton.TILE, *SWIGLU_TILES[:2]] if cpu else SWIGLU_TILES
                rows += sweep(case, T, f, b, fb, bb, tiles, swiglu_triton.TILE)
            else:
                f, b, fb, bb = norm_case(case, a.G, R, a.D, dev, gen)
                tiles = [rmsnorm_triton.TILE, *NORM_TILES[:2]] if cpu else NORM_TILES
                rows += sweep(case, T, f, b, fb, bb, tiles, rmsnorm_triton.TILE)
            if not cpu:
                torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if torch.cuda.is_available() and not cpu else "cpu (interpreter)"
    md = table(rows, name)
    print(md)
    from mixzoo.leaderboard.export import write_atomic
    if a.out:
        write_atomic(a.out, json.dumps(dict(device=name, rows=rows), indent=1))
    if a.md:
        write_atomic(a.md, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
