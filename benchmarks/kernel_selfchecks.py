"""Each of mixzoo's kernel self-checks on this device, with what went wrong where one fails: the
exception, or each output's norm-relative error against the float64 reference (the checks themselves
only answer yes or no). Prints one line per kernel.

    python benchmarks/kernel_selfchecks.py
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ssd_detail(dev) -> str:
    import torch

    from mixzoo.kernels import ssd_intra as S
    from mixzoo.kernels import ssd_intra_triton as Kt
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for C, K, V in ((16, 16, 24), (64, 64, 16)):
        B, H, N = 2, 3, 2
        q, k = (torch.randn(B, N, C, K, generator=gen) * K ** -0.5 for _ in range(2))
        v = torch.randn(B, H, N, C, V, generator=gen)
        gc = (-torch.rand(B, H, N, C, generator=gen) * 0.2).cumsum(-1)
        ks = torch.rand(B, H, N, C, generator=gen) + 0.1
        do = torch.randn(B, H, N, C, V, generator=gen)
        ins = [t.double().requires_grad_() for t in (q, k, v, gc, ks)]
        want = S.intra_torch(*ins)
        wants = torch.autograd.grad(want, ins, do.double())
        args = [t.to(dev) for t in (q, k, v, gc, ks)]
        got = Kt.forward(*args)
        gots = Kt.backward(*args, do.to(dev))
        errs = [float((a.double().cpu() - b).norm() / b.norm()) for a, b in [(got, want.detach()), *zip(gots, wants)]]
        out.append(f"C={C} K={K} V={V}: " + " ".join(f"{e:.1e}" for e in errs))
    return "; ".join(out)


def main() -> int:
    import torch
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    idx = 0 if dev.type == "cuda" else -1
    from mixzoo.kernels import causal_conv, rmsnorm, rope, ssd_intra, swiglu
    for name, mod in (("swiglu", swiglu), ("rmsnorm", rmsnorm), ("rope", rope), ("causal_conv", causal_conv),
                      ("ssd_intra", ssd_intra)):
        try:
            ok = mod._matches_here(idx)
            print(f"{name}: {'matches' if ok else 'does not match'}", flush=True)
        except Exception:
            print(f"{name}: raised\n{traceback.format_exc()}", flush=True)
    try:
        print("ssd_intra errors (o, dq, dk, dv, dg, dks):", ssd_detail(dev), flush=True)
    except Exception:
        print(f"ssd_intra detail raised\n{traceback.format_exc()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
