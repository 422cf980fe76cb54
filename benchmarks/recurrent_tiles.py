"""Tilings of the recurrent scans (mixzoo.kernels.recurrent_triton): heads per program, warps, and whether a program
loads the next position's inputs while it computes this one's (prefetch). The scans walk 1024 positions one after
another, so a step's latency, not the memory traffic, sets their time (on the H200, 2026-12-05, GLA's forward took
1.9 ms at 128 sequences and 2.3 ms at 768).

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


def candidates(op: str, H: int, DK: int, DV: int):
    """Distinct (floats, warps, prefetch) tilings, by the (heads, warps) they give."""
    from mixzoo.kernels.recurrent_triton import _tiling
    seen, out = set(), []
    for floats in (64, 128, 256, 512, 1024):
        for warps in (1, 2, 4):
            for pf in (False, True):
                _, _, BH, w, p = _tiling(op, H, DK, DV, (floats, warps, pf))
                if (BH, w, p) not in seen:
                    seen.add((BH, w, p))
                    out.append(((floats, warps, pf), (BH, w, p)))
    return out


def ops(K, op: str, B: int, T: int, H: int, DK: int, DV: int, gen):
    """fwd(tiles) -> (o, states) and bwd(states, tiles) -> gradients of ``op`` on random bf16 inputs."""
    dev, bf = gen.device, torch.bfloat16
    q, k = (torch.randn(B, T, H, DK, device=dev, generator=gen).to(bf) for _ in range(2))
    v = torch.randn(B, T, H, DV, device=dev, generator=gen).to(bf)
    do = torch.randn(B, T, H, DV, device=dev, generator=gen).to(bf)
    if op == "delta":
        g = -torch.rand(B, T, H, device=dev, generator=gen) * 0.5
        beta = torch.rand(B, T, H, device=dev, generator=gen)
        return (lambda tiles: K.delta_forward(q, k, v, g, beta, 0.35, 1e-6, True, True, tiles),
                lambda st, tiles: K.delta_backward(q, k, v, g, beta, st, do, 0.35, 1e-6, True, tiles))
    g = -torch.rand(B, T, H, DK, device=dev, generator=gen) * 0.5
    return (lambda tiles: K.gla_forward(q, k, v, g, 0.35, True, tiles),
            lambda st, tiles: K.gla_backward(q, k, v, g, st, do, 0.35, tiles))


def bench(fn) -> float:
    """Median ms (``triton.testing.do_bench``); on the CPU (the interpreter's smoke run) one call's."""
    if not torch.cuda.is_available():
        import time
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def sweep(K, op: str, B: int, T: int, H: int, DK: int, DV: int, gen) -> list[dict]:
    fwd, bwd = ops(K, op, B, T, H, DK, DV, gen)
    o0, st0 = fwd(None)
    ref = [o0, *bwd(st0, None)]
    rows = []
    for tiles, (BH, w, pf) in candidates(op, H, DK, DV):
        o, st = fwd(tiles)
        got = [o, *bwd(st, tiles)]
        diff = max(float((x.double() - y.double()).norm() / y.double().norm()) for x, y in zip(got, ref))
        del st
        t_f = bench(lambda: fwd(tiles))  # noqa: B023
        t_b = bench(lambda: bwd(st0, tiles))  # noqa: B023
        row = dict(op=op, T=T, B=B, H=H, DK=DK, DV=DV, tiles=list(tiles), heads=BH, warps=w, prefetch=pf,
                   fwd_ms=t_f, bwd_ms=t_b, total_ms=t_f + t_b, rel_diff_vs_default=diff,
                   default=(BH, w, pf) == K._tiling(op, H, DK, DV, K.TILES[op])[2:],
                   old=(BH, w, pf) == K._tiling(op, H, DK, DV, K.OLD_TILES)[2:])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    from mixzoo.kernels import recurrent_triton as K
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--T", default="1024,256")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (timings meaningless)")
    a = ap.parse_args(argv)
    gen = torch.Generator(device=a.device).manual_seed(0)
    rows = []
    for op, DK, DV in (("delta", 8, 8), ("gla", 4, 8)):
        for T in (int(t) for t in a.T.split(",")):
            rows += sweep(K, op, a.B, T, 16, DK, DV, gen)
            torch.cuda.empty_cache()
    best = {}
    for r in rows:
        key = f"{r['op']} T{r['T']}"
        if r["rel_diff_vs_default"] <= 1e-3 and (key not in best or r["total_ms"] < best[key]["total_ms"]):
            best[key] = r
    default = {f"{r['op']} T{r['T']}": r for r in rows if r["default"]}
    for key, r in best.items():
        d = default.get(key)
        print(f"{key}: best {r['tiles']} (heads {r['heads']}, warps {r['warps']}, prefetch {r['prefetch']}) "
              f"fwd {r['fwd_ms']:.3f} bwd {r['bwd_ms']:.3f} ms" +
              (f"; default {d['fwd_ms']:.3f} / {d['bwd_ms']:.3f} ms" if d else ""))
    # one tiling an op (TILES is by op, not by length): the least mean over the lengths of its time / the old one's
    ratios: dict = {}
    olds = {(r["op"], r["T"]): r["total_ms"] for r in rows if r["old"]}
    for r in rows:
        if r["rel_diff_vs_default"] <= 1e-3 and (r["op"], r["T"]) in olds:
            ratios.setdefault(r["op"], {}).setdefault(tuple(r["tiles"]), []).append(
                r["total_ms"] / olds[(r["op"], r["T"])])
    choice = {}
    for op, by in ratios.items():
        n = max(len(v) for v in by.values())
        tiles, rs = min(((t, v) for t, v in by.items() if len(v) == n), key=lambda tv: sum(tv[1]))
        choice[op] = dict(tiles=list(tiles), time_vs_old=rs)
        print(f"{op}: choose {list(tiles)}, time against the old tiling {' / '.join(f'{x:.3f}' for x in rs)}")
    if a.out:
        from mixzoo.leaderboard.export import write_atomic
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)"
        write_atomic(a.out, json.dumps(dict(device=name, rows=rows, choice=choice), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
