"""fla's Parallax kernels at other tiles (``mixzoo.kernels.parallax_tiles``): per kernel and candidate tile, its
time (triton's do_bench median) at the mad recipe's heads (16 heads of 8, padded to 16 as the mechanism pads them)
and batch 768 (six stacked models of 128), beside fla's own launcher; outputs checked against fla's.

    python benchmarks/parallax_tiles.py --T 256,1024 --out logs/parallax-tiles.json

Candidates are (query rows, keys, warps[, stages]), 2 stages unless named; each kernel is swept with the others at
mixzoo's ``TILES``. A backward candidate's time is the whole backward (preprocess, dqr and dkv).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

CANDS = {"fwd": [(128, 128, 8), (64, 64, 4), (64, 32, 4), (32, 64, 4), (32, 32, 4), (64, 64, 8), (64, 64, 4, 3)],
         "dqr": [(128, 128, 8), (64, 32, 4), (32, 32, 4), (64, 16, 4), (32, 64, 4), (64, 64, 4), (64, 32, 4, 3)],
         "dkv": [(128, 128, 8), (64, 64, 4), (64, 32, 4), (32, 64, 4), (64, 64, 8), (64, 64, 4, 3)]}


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _at(T, B, H, D, d, ms, P, X) -> list[dict]:
    """fla's launcher, then each candidate tile of each kernel, at length T."""
    g = torch.Generator(device="cuda").manual_seed(0)
    pad = lambda x: torch.nn.functional.pad(x, (0, D - d)).bfloat16().contiguous()      # noqa: E731
    q, r, k, v, do = (pad(torch.randn(B, T, H, d, device="cuda", generator=g)) for _ in range(5))
    r = (r * 0.3).contiguous()
    s = d ** -0.5
    fo = P.parallel_parallax_fwd(q, r, k, v, s)
    fg = P.parallel_parallax_bwd(q, r, k, v, *fo, do, s)
    rows = [dict(T=T, impl="fla", fwd=ms(lambda: P.parallel_parallax_fwd(q, r, k, v, s)),
                 bwd=ms(lambda: P.parallel_parallax_bwd(q, r, k, v, *fo, do, s)))]
    print(json.dumps(rows[0]), flush=True)
    for kind, cands in CANDS.items():
        for c in cands:
            tiles = {kind: (*c, 2)[:4]}
            try:
                xo = X.forward(q, r, k, v, s, tiles)
                xg = X.backward(q, r, k, v, *xo, do, s, tiles)
                err = max([_rel(xo[0], fo[0])] + [_rel(x, y) for x, y in zip(xg, fg)])
                run = ((lambda t=tiles: X.forward(q, r, k, v, s, t)) if kind == "fwd"
                       else (lambda t=tiles, o=xo: X.backward(q, r, k, v, *o, do, s, t)))
                row = dict(T=T, impl="mixzoo", kind=kind, tiles=c, ms=ms(run), max_rel_vs_fla=err)
            except Exception as e:           # a tile this GPU cannot run: named, the others still timed
                row = dict(T=T, impl="mixzoo", kind=kind, tiles=c, error=f"{type(e).__name__}: {e}"[:200])
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    import triton.testing
    from fla.ops.parallax import parallel as P

    from mixzoo.kernels import parallax_tiles as X
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="256,1024")
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    H, D, d = 16, 16, 8
    ms = lambda f: triton.testing.do_bench(f, warmup=10, rep=60, return_mode="median")     # noqa: E731
    rows = []
    for T in (int(x) for x in a.T.split(",")):
        rows += _at(T, a.B, H, D, d, ms, P, X)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows, tiles=X.TILES), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
