"""Measure the LLA kernel variants on one GPU: tile configs, CG tolerance, Jacobi preconditioning.

``python -m mixzoo.kernels.lla.tune [--quick]``. Prints per variant: forward and backward time (ms, median
of do_bench), CG iterations per query tile (mean / max), and relative errors against the float64 reference.
The log of what was run and chosen lives in benchmarks/lla_notes.md.
"""
from __future__ import annotations

import sys
import time

import torch
import triton

from . import triton_lla as K
from .reference import lla_reference

LAM = 10.0


def _inputs(BH, T, D, seed=0, qscale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, go = (torch.randn(BH, T, D, device="cuda", generator=g) for _ in range(4))
    return (q * qscale).bfloat16(), k.bfloat16(), v.bfloat16(), go.bfloat16()


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def time_variant(BH, T, D, lam, tol, max_iter, jacobi, cfg):
    q, k, v, go = _inputs(BH, T, D)
    lamt = torch.full((BH, T), lam, device="cuda")
    s = D ** -0.5

    def fwd():
        return K.lla_forward(q, k, v, lamt, s, tol, max_iter, jacobi, cfg)
    o, y, lse, itf = fwd()

    def bwd():
        return K.lla_backward(q, k, v, go, lamt, y, lse, s, tol, max_iter, jacobi, cfg)
    itb = bwd()[-1]
    tf = triton.testing.do_bench(fwd, warmup=10, rep=50, return_mode="median")
    tb = triton.testing.do_bench(bwd, warmup=10, rep=50, return_mode="median")
    return tf, tb, itf.float().mean().item(), int(itf.max()), itb.float().mean().item(), int(itb.max())


def accuracy(BH, T, D, lam, settings, qscale=1.0):
    q, k, v, go = _inputs(BH, T, D, seed=5, qscale=qscale)
    xd = [t.double().requires_grad_() for t in (q, k, v)]
    ref = lla_reference(*xd, ridge=lam)
    rg = torch.autograd.grad(ref, xd, go.double())
    out = {}
    for name, (tol, jac) in settings.items():
        xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = K.lla(*(x[None] for x in xs), ridge=lam, tol=tol, jacobi=jac)[0]
        gs = torch.autograd.grad(o, xs, go)
        out[name] = [_rel(o, ref)] + [_rel(a, b) for a, b in zip(gs, rg)]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    BH, T = (4, 1024) if quick else (16, 4096)
    t0 = time.time()
    print(f"device {torch.cuda.get_device_name()}; BH={BH} T={T} lam={LAM}", flush=True)
    # 1) tolerance and Jacobi at the default tiles
    print("== tol / jacobi (default tiles): fwd ms, bwd ms, fwd it mean/max, bwd it mean/max ==")
    for D in (128, 64):
        for tol in (1e-2, 1e-3):
            for jac in (False, True):
                if jac and tol not in (1e-3,):
                    continue
                r = time_variant(BH, T, D, LAM, tol, 32, jac, None)
                print(f"D={D} tol={tol:g} jacobi={jac}: {r[0]:.3f} {r[1]:.3f} | {r[2]:.1f}/{r[3]} {r[4]:.1f}/{r[5]}", flush=True)
    # fixed iteration counts, as FlashLLA runs them (tol 0 -> never converges early)
    for it in ():
        r = time_variant(BH, T, 128, LAM, 0.0, it, False, None)
        print(f"D=128 fixed {it} it.: {r[0]:.3f} {r[1]:.3f} | {r[2]:.1f}/{r[3]} {r[4]:.1f}/{r[5]}", flush=True)
    # 2) tile configs at D=128
    print("== tiles at D=128, tol 1e-3 ==")
    cands = {"fwd": [(64, 64, 4, 2), (64, 64, 8, 3), (64, 128, 8, 2), (128, 64, 8, 2)],
             "bwd_q": [(64, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2)],
             "bwd_kv": [(64, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 64, 4, 2)]}
    for kind, lst in cands.items():
        for c in lst:
            if time.time() - t0 > 300:
                print("time budget reached; skipping the rest")
                break
            try:
                r = time_variant(BH, T, 128, LAM, 1e-3, 32, False, {kind: c})
                print(f"{kind} {c}: fwd {r[0]:.3f} bwd {r[1]:.3f}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{kind} {c}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
    # 3) accuracy of the tolerance choices
    print("== accuracy vs float64 (o, dq, dk, dv) ==")
    settings = {"tol1e-2": (1e-2, False), "tol3e-3": (3e-3, False), "tol1e-3": (1e-3, False),
                "tol1e-4": (1e-4, False), "tol1e-3+jacobi": (1e-3, True)}
    for lam, qs in ((10.0, 1.0), (1.0, 1.0), (0.1, 1.0), (0.1, 4.0), (1.0, 4.0)):
        res = accuracy(4, 1024, 128, lam, settings, qs)
        for n, e in res.items():
            print(f"lam={lam} qscale={qs} {n}: " + " ".join(f"{x:.1e}" for x in e), flush=True)
    print(f"tune done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
