"""Tilings of the recurrent scans (mixzoo.kernels.recurrent_triton): heads per program and warps. The scans walk 1024
positions one after another, so a step's latency, not the memory traffic, sets their time (on the H200,
2026-12-05, GLA's forward took 1.9 ms at 128 sequences and 2.3 ms at 768): fewer heads and warps a program make
more, smaller programs whose reductions stay inside a warp.

At the mad recipe's layers (16 heads; gdn's of 8, GLA's keys of 4 and values of 8), batch 768 (six stacked models
of 128), lengths 1024 and 256, bf16 inputs as the layers hand them: each tiling's forward (states kept) and
backward, timed apart (median ms, ``triton.testing.do_bench``), and its outputs and gradients against the default
tiling's (they must agree: each head's arithmetic is the same in every tiling).

    python benchmarks/recurrent_tiles.py --out logs/recurrent_tiles.json
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def candidates(H: int, DK: int, DV: int):
    """Distinct (floats, warps) tilings, by the (heads, warps) they give."""
    from mixzoo.kernels.recurrent_triton import _tiling
    seen, out = set(), []
    for floats in (64, 128, 256, 512, 1024):
        for warps in (1, 2, 4):
            _, _, BH, w = _tiling(H, DK, DV, (floats, warps))
            if (BH, w) not in seen:
                seen.add((BH, w))
                out.append(((floats, warps), (BH, w)))
    return out


def main(argv=None) -> int:
    import triton.testing

    from mixzoo.kernels import recurrent_triton as K
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--T", default="1024,256")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    dev, bf = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for op, DK, DV in (("delta", 8, 8), ("gla", 4, 8)):
        H = 16
        for T in (int(t) for t in a.T.split(",")):
            B = a.B
            q, k = (torch.randn(B, T, H, DK, device=dev, generator=gen).to(bf) for _ in range(2))
            v = torch.randn(B, T, H, DV, device=dev, generator=gen).to(bf)
            do = torch.randn(B, T, H, DV, device=dev, generator=gen).to(bf)
            if op == "delta":
                g = -torch.rand(B, T, H, device=dev, generator=gen) * 0.5
                beta = torch.rand(B, T, H, device=dev, generator=gen)
                fwd = lambda tiles: K.delta_forward(q, k, v, g, beta, 0.35, 1e-6, True, True, tiles)  # noqa: E731
                bwd = lambda st, tiles: K.delta_backward(q, k, v, g, beta, st, do, 0.35, 1e-6, True, tiles)  # noqa: E731
            else:
                g = -torch.rand(B, T, H, DK, device=dev, generator=gen) * 0.5
                fwd = lambda tiles: K.gla_forward(q, k, v, g, 0.35, True, tiles)  # noqa: E731
                bwd = lambda st, tiles: K.gla_backward(q, k, v, g, st, do, 0.35, tiles)  # noqa: E731
            o0, st0 = fwd(None)
            ref = [o0, *bwd(st0, None)]
            for tiles, (BH, w) in candidates(H, DK, DV):
                o, st = fwd(tiles)
                got = [o, *bwd(st, tiles)]
                diff = max(float((x.double() - y.double()).norm() / y.double().norm()) for x, y in zip(got, ref))
                del st
                t_f = triton.testing.do_bench(lambda tiles=tiles: fwd(tiles), warmup=10, rep=60, return_mode="median")
                t_b = triton.testing.do_bench(lambda tiles=tiles: bwd(st0, tiles), warmup=10, rep=60, return_mode="median")
                row = dict(op=op, T=T, B=B, H=H, DK=DK, DV=DV, tiles=list(tiles), heads=BH, warps=w,
                           fwd_ms=t_f, bwd_ms=t_b, total_ms=t_f + t_b, rel_diff_vs_default=diff,
                           default=(BH, w) == K._tiling(H, DK, DV)[2:])
                rows.append(row)
                print(json.dumps(row), flush=True)
            del st0
    best = {}
    for r in rows:
        key = f"{r['op']} T{r['T']}"
        if r["rel_diff_vs_default"] <= 1e-3 and (key not in best or r["total_ms"] < best[key]["total_ms"]):
            best[key] = r
    default = {f"{r['op']} T{r['T']}": r for r in rows if r["default"]}
    for key, r in best.items():
        d = default.get(key)
        print(f"{key}: best {r['tiles']} (heads {r['heads']}, warps {r['warps']}) "
              f"fwd {r['fwd_ms']:.3f} bwd {r['bwd_ms']:.3f} ms" +
              (f"; default {d['fwd_ms']:.3f} / {d['bwd_ms']:.3f} ms" if d else ""))
    if a.out:
        from mixzoo.leaderboard.export import write_atomic
        write_atomic(a.out, json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
