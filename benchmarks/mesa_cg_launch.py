"""MesaNet's conjugate-gradient kernels at other launch settings: fla launches both (the forward's solve and the
backward's dq solve, each its own ``chunk_fwd_mesa_cg_dim64_kernel``) at 4 warps and 1 stage, whatever the head
width. Here fla's ``chunk_mesa_net`` runs forward and backward at the mesa recipe's stacked shape (16 heads of 8
padded to 16, batch 768 = six stacked models of 128) with both kernels relaunched at each (warps, stages)
candidate, timed (triton's do_bench median) beside fla's own settings, outputs and gradients checked against them.

    python benchmarks/mesa_cg_launch.py --T 256,1024 --out logs/mesa-cg.json

Candidates are ``mixzoo.kernels.MESA_CG`` (fla's 4 warps, 1 stage first), set through ``MIXZOO_MESA_CG`` and
``mixzoo.kernels.mesa_cg`` as the mechanism runs them. ptxas -v for sm_90a at heads of 16: 168 / 123 / 254 registers
at 4 / 8 / 2 warps, the forward's kernel spilling 16 bytes a thread at 2 (1 warp spills over 1 KB: left out).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch


@contextlib.contextmanager
def relaunched(setting: str):
    """Both CG kernels at ``setting`` ("W,S", one of mixzoo.kernels.MESA_CG) through mixzoo.kernels.mesa_cg."""
    from mixzoo.kernels import mesa_cg
    assert mesa_cg.install()
    kept = os.environ.get(mesa_cg.SWITCH)
    os.environ[mesa_cg.SWITCH] = setting
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop(mesa_cg.SWITCH)
        else:
            os.environ[mesa_cg.SWITCH] = kept


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _at(T: int, B: int, ms) -> list[dict]:
    from fla.ops.mesa_net import chunk_mesa_net
    H, K, d = 16, 16, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    pad = lambda x: torch.nn.functional.pad(x, (0, K - d)).bfloat16()          # noqa: E731  heads of 8 -> 16
    q, k, v, do = (pad(torch.randn(B, T, H, d, device="cuda", generator=g)) for _ in range(4))
    gate = torch.nn.functional.logsigmoid(3 + torch.randn(B, T, H, device="cuda", generator=g))
    beta = torch.rand(B, T, H, device="cuda", generator=g).sigmoid()
    lamb = torch.nn.functional.pad(0.25 + torch.rand(H, d, device="cuda", generator=g), (0, K - d), value=1.0)

    def run(backward: bool):
        xs = [x.clone().requires_grad_(backward) for x in (q, k, v)]
        o = chunk_mesa_net(*xs, g=gate, beta=beta, lamb=lamb, max_CG_iteration=30, use_qk_l2norm_in_kernel=True)[0]
        return [o] + (list(torch.autograd.grad(o, xs, do)) if backward else [])

    with relaunched("4,1"):
        ref = run(True)
    from mixzoo.kernels import MESA_CG
    rows = []
    for setting in MESA_CG:
        w, s = map(int, setting.split(","))
        with relaunched(setting):
            try:
                out = run(True)
                row = dict(T=T, warps=w, stages=s, fwd_ms=ms(lambda: run(False)), fwd_bwd_ms=ms(lambda: run(True)),
                           max_rel_vs_fla=max(_rel(a, b) for a, b in zip(out, ref)))
            except Exception as e:                  # a setting this GPU cannot run: named, the others still timed
                row = dict(T=T, warps=w, stages=s, error=f"{type(e).__name__}: {e}"[:200])
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    import triton.testing
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="256,1024")
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    ms = lambda f: triton.testing.do_bench(f, warmup=5, rep=40, return_mode="median")     # noqa: E731
    rows = []
    for T in (int(x) for x in a.T.split(",")):
        rows += _at(T, a.B, ms)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
