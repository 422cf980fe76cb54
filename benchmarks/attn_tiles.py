"""mixzoo's small-head attention kernels (``mixzoo.kernels.attn``) at other tiles: per kernel and candidate tile,
its time (triton's do_bench median) at the mad recipe's heads (16 heads of 8) and batch 768 (six stacked models of
128), q, k, v read from one projection's output as the ``softmax`` layer hands them; outputs and gradients
checked against the default tiles'.

    python benchmarks/attn_tiles.py --T 256,1024 --out logs/attn-tiles.json

Candidates are (rows, keys, warps, stages); each kernel is swept with the others at the length's default
tiles (``attn.default_tiles``). A forward candidate's time is the forward kernel's; a dkdv or dq candidate's is
the whole backward (δ, dk/dv, dq), so the three columns compare within a kernel, not across. Tiles that break
the causal split (the larger side a multiple of the smaller) are left out.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch

SIDES = {"fwd": [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128), (256, 64)],
         "dkdv": [(16, 64), (16, 128), (32, 64), (32, 128), (64, 64), (64, 128)],
         "dq": [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128), (256, 64)]}
DEV = "cuda"
WARPS_STAGES = [(4, 1), (4, 2), (4, 3), (8, 2)]


def candidates(kind: str) -> list[tuple[int, int, int, int]]:
    return [(r, c, w, s) for (r, c), (w, s) in itertools.product(SIDES[kind], WARPS_STAGES)]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _at(T: int, B: int, H: int, D: int, ms, kinds: list[str]) -> list[dict]:
    from mixzoo.kernels import attn as A
    g = torch.Generator(device=DEV).manual_seed(0)
    qkv = torch.randn(B, T, 3 * H * D, device=DEV, generator=g).bfloat16()
    q, k, v = (t.unflatten(-1, (H, D)).transpose(1, 2) for t in qkv.chunk(3, -1))      # (B, H, T, D) views
    do = torch.randn(B, H, T, D, device=DEV, generator=g).bfloat16()
    scale = D ** -0.5
    base = A._tiles(None, T)
    o, lse = A._launch_fwd(q, k, v, scale, base)
    grads = A._launch_bwd(q, k, v, o, lse, do, scale, base)
    rows = [dict(T=T, kind="default", tiles=base, fwd=ms(lambda: A._launch_fwd(q, k, v, scale, base)),
                 bwd=ms(lambda: A._launch_bwd(q, k, v, o, lse, do, scale, base)))]
    print(json.dumps(rows[0]), flush=True)
    for kind in kinds:
        for c in candidates(kind):
            try:
                tiles = A._tiles({kind: c}, T)
            except ValueError:
                continue
            try:
                xo, xl = A._launch_fwd(q, k, v, scale, tiles)
                xg = A._launch_bwd(q, k, v, o, lse, do, scale, tiles)
                err = max([_rel(xo, o)] + [_rel(x, y) for x, y in zip(xg, grads)])
                run = ((lambda t=tiles: A._launch_fwd(q, k, v, scale, t)) if kind == "fwd"
                       else (lambda t=tiles: A._launch_bwd(q, k, v, o, lse, do, scale, t)))
                row = dict(T=T, kind=kind, tiles=c, ms=ms(run), max_rel_vs_default=err)
            except Exception as e:           # a tile this GPU cannot run (shared memory): named, the others timed
                row = dict(T=T, kind=kind, tiles=c, error=f"{type(e).__name__}: {e}"[:200])
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def best(rows: list[dict]) -> dict:
    """(T, kind) -> the fastest candidate row whose outputs agree with the default tiles' (bf16 reordering)."""
    out: dict = {}
    for r in rows:
        if "ms" not in r or r.get("max_rel_vs_default", 1.0) > 1e-2:
            continue
        key = f"{r['T']}:{r['kind']}"
        if key not in out or r["ms"] < out[key]["ms"]:
            out[key] = r
    return out


def main(argv=None) -> int:
    import triton.testing
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="256,1024")
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--kinds", default="fwd,dkdv,dq")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    ms = lambda f: triton.testing.do_bench(f, warmup=10, rep=60, return_mode="median")     # noqa: E731
    rows = []
    for T in (int(x) for x in a.T.split(",")):
        rows += _at(T, a.B, a.heads, a.dim, ms, a.kinds.split(","))
    b = best(rows)
    for key, r in b.items():
        print("best", key, r["tiles"], f"{r['ms']:.3f} ms", flush=True)
    if a.out:
        from mixzoo.leaderboard.export import write_atomic
        write_atomic(a.out, json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows, best=b), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
