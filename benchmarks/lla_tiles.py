"""LLA kernel tiles at the mad recipe's heads: which (BLOCK_M, BLOCK_N, warps, stages) is fastest per kernel.

``python benchmarks/lla_tiles.py [--T 128,512,1024] [--bh 2048] [--lam 1.0] [--solves cg,direct,direct1]
[--sweep direct] [--out FILE.json]`` on a GPU.
The mad recipe runs LLA at 16 heads of 8 (padded to 16 in the kernel), batch 128: BH = 2048 per model. The
tiles in ``mixzoo.kernels.lla.triton_lla.CONFIGS`` were measured at T = 4096, D = 128. For each kernel
(fwd, bwd_q, bwd_kv) and candidate tile, the other two kernels at their defaults: the forward's and the
backward's median times (triton's do_bench) and the CG iterations, with the outputs checked against the
default tiles' (the tile changes the summation order only). Inputs: Gaussian q, k, v of width 8 zero-padded
to 16 (as ``lla()`` pads them), the ridge ``--lam`` everywhere (mixzoo's default ridge 1.0 runs at
precision level 2). ``--solves``: the solves timed side by side at the default tiles (``cg``: conjugate
gradients; ``direct``: the explicit solve of heads of at most 8 dims, C summed again in the backward; ``directc``:
the same with the forward's C kept for the backward (``MIXZOO_LLA_H=summed``); ``direct1``: the output formed from
the moment pass, ``onepass``; ``directh``: the forward's C and Σ_VK, k̄, v̄ kept, the backward's query pass without its
pass before the solve, as the mechanism runs it by default); ``--sweep``: those whose tiles are then swept.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

from mixzoo.kernels.lla import triton_lla as K

CANDS = [(64, 64, 4, 2), (32, 64, 4, 2), (128, 64, 4, 2), (64, 128, 4, 2), (64, 32, 4, 2), (32, 32, 2, 2),
         (128, 128, 8, 2), (64, 64, 2, 2), (64, 64, 4, 3), (128, 32, 4, 2)]


def _inputs(BH, T, d, Dp, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, go = (torch.nn.functional.pad(torch.randn(BH, T, d, device="cuda", generator=g), (0, Dp - d))
                   for _ in range(4))
    return q.bfloat16().contiguous(), k.bfloat16().contiguous(), v.bfloat16().contiguous(), go.bfloat16().contiguous()


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# directc: the explicit solve with the forward's C kept for the backward (``cm``, ``MIXZOO_LLA_H=summed``); directh: also
# its Σ_VK, k̄, v̄ (``mom``; the output from the moment pass), as ``LLAFunction`` runs it by default
SOLVES = {"cg": dict(dr=None, onepass=False), "direct": dict(dr=8, onepass=False), "direct1": dict(dr=8, onepass=True),
          "directc": dict(dr=8, onepass=False, cm=True), "directh": dict(dr=8, onepass=True, cm=True, mom=True)}


def run(BH, T, lam, cfg, d=8, Dp=16, solve="cg"):
    q, k, v, go = _inputs(BH, T, d, Dp)
    lamt = torch.full((BH, T), lam, device="cuda")
    s = d ** -0.5
    tol, it, jac = K.DEFAULTS["tol"], K.DEFAULTS["max_iter"], K.DEFAULTS["jacobi"]
    sv = dict(SOLVES[solve])
    if sv.pop("cm", False):
        sv["cm"] = torch.empty(BH, T, sv["dr"] ** 2, device="cuda", dtype=torch.float32)
    if sv.pop("mom", False):
        sv["mom"] = torch.empty(BH, T, sv["dr"] ** 2 + 2 * sv["dr"], device="cuda", dtype=torch.float32)
    o, y, lse, itf = K.lla_forward(q, k, v, lamt, s, tol, it, jac, cfg, **sv)
    cm, mom = sv.get("cm"), sv.get("mom")
    dq, dk, dv, dl, itb = K.lla_backward(q, k, v, go, lamt, y, lse, s, tol, it, jac, cfg, dr=sv["dr"], cm=cm, mom=mom)
    tf = triton.testing.do_bench(lambda: K.lla_forward(q, k, v, lamt, s, tol, it, jac, cfg, **sv), warmup=5,
                                 rep=40, return_mode="median")
    tb = triton.testing.do_bench(lambda: K.lla_backward(q, k, v, go, lamt, y, lse, s, tol, it, jac, cfg,
                                                        dr=sv["dr"], cm=cm, mom=mom), warmup=5, rep=40,
                                 return_mode="median")
    return tf, tb, float(itf.float().mean()), float(itb.float().mean()), (o, dq, dk, dv)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="128,512,1024")
    ap.add_argument("--bh", type=int, default=2048)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--solves", default="cg,direct,direct1")
    ap.add_argument("--sweep", default="direct")
    ap.add_argument("--cands", default="", help="tiles to sweep, BMxBNxWARPSxSTAGES comma separated (default CANDS)")
    ap.add_argument("--kinds", default="fwd,bwd_q,bwd_kv", help="the kernels whose tiles are swept")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    solves, sweep = a.solves.split(","), [x for x in a.sweep.split(",") if x]
    cands = [tuple(int(v) for v in c.split("x")) for c in a.cands.split(",") if c] or CANDS
    t0, rows = time.time(), []
    print(f"device {torch.cuda.get_device_name()}; BH={a.bh} d=8 (padded 16) lam={a.lam}; defaults "
          f"{ {k: v[16] for k, v in K.CONFIGS.items()} }", flush=True)
    for T in (int(x) for x in a.T.split(",")):
        base = {}
        for sol in solves:                      # the solves side by side at the default tiles
            tf0, tb0, itf, itb, ref = run(a.bh, T, a.lam, None, solve=sol)
            base[sol] = (tf0, tb0, ref)
            err = max(_rel(x, r) for x, r in zip(ref, base[solves[0]][2]))
            print(f"T={T} {sol} default tiles: fwd {tf0:.3f} ms  bwd {tb0:.3f} ms  it {itf:.1f}/{itb:.1f}  "
                  f"vs {solves[0]} {err:.1e}", flush=True)
            rows.append(dict(T=T, solve=sol, kind="default", cfg=None, fwd_ms=tf0, bwd_ms=tb0, it_fwd=itf,
                             it_bwd=itb, max_rel_vs_first=err))
        for sol in sweep:
            tf0, tb0, ref = base[sol]
            for kind in a.kinds.split(","):
                for c in cands:
                    if c == K.CONFIGS[kind][16] or time.time() - t0 > a.budget_s:
                        continue
                    try:
                        tf, tb, itf, itb, outs = run(a.bh, T, a.lam, {kind: c}, solve=sol)
                        err = max(_rel(x, r) for x, r in zip(outs, ref))
                        rows.append(dict(T=T, solve=sol, kind=kind, cfg=c, fwd_ms=tf, bwd_ms=tb, it_fwd=itf,
                                         it_bwd=itb, max_rel=err))
                        print(f"T={T} {sol} {kind} {c}: fwd {tf:.3f} ({tf / tf0:.2f}x)  bwd {tb:.3f} "
                              f"({tb / tb0:.2f}x)  it {itf:.1f}/{itb:.1f}  vs default {err:.1e}", flush=True)
                    except Exception as e:  # noqa: BLE001  (a tile that does not fit shared memory or registers)
                        rows.append(dict(T=T, solve=sol, kind=kind, cfg=c, error=f"{type(e).__name__}: {str(e)[:160]}"))
                        print(f"T={T} {sol} {kind} {c}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), bh=a.bh, lam=a.lam, rows=rows), f, indent=1)
    print(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
