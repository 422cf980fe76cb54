"""fla's chunk_simple_gla (Mamba-2's GPU path) forward and backward at the head shapes the recipes
produce, against mixzoo's float64 chunk reference: relative errors of o, dq, dk, dv and dg per
(heads H, key width K = d_state, value width V = Mamba's head dim). Shapes run in a child process
each batch of configs, with CUDA_LAUNCH_BLOCKING=1: a kernel fault names its kernel and ends only
that child; the next child starts at the next shape.

    python benchmarks/simple_gla_shapes.py [--out FILE]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

# (heads, K, V, length): the mad recipe gives V = 16 (16 heads), the based recipe at width 128 V = 32
SHAPES = [(16, K, V, 128) for K in (64, 16) for V in (16, 32, 64, 128)] + [(16, 64, 16, 100), (2, 64, 128, 128)]


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def one(H, K, V, T, B=4):
    import torch

    from mixzoo.models import _fla
    from mixzoo.models._scan import simple_gla_chunk
    fn, suffix = _fla.gated_chunk_op("fla.ops.simple_gla", "chunk_simple_gla")
    torch.manual_seed(0)
    q = torch.randn(B, T, H, K, device="cuda")
    k = torch.randn(B, T, H, K, device="cuda") * 0.3
    v = torch.randn(B, T, H, V, device="cuda")
    g = -torch.rand(B, T, H, device="cuda") * 0.5
    do = torch.randn(B, T, H, V, device="cuda")
    out = {}
    for tag in ("fla", "ref"):
        ins = [t.clone().to(torch.bfloat16 if tag == "fla" else torch.float64).requires_grad_(True) for t in (q, k, v)]
        gg = g.clone().to(torch.float32 if tag == "fla" else torch.float64).requires_grad_(True)
        if tag == "fla":
            o = fn(*[t.contiguous() for t in ins], g=gg, scale=1.0)[0]
        else:
            tt = lambda t: t.transpose(1, 2)
            o = tt(simple_gla_chunk(*[tt(t) for t in ins], tt(gg), chunk=64))
        (o.double() * do.double()).sum().backward()
        out[tag] = [o.detach(), *[t.grad for t in ins], gg.grad]
    names = ("o", "dq", "dk", "dv", "dg")
    return {"H": H, "K": K, "V": V, "T": T, "backend": "fla-simple-gla" + suffix,
            **{n: rel(a, b) for n, a, b in zip(names, out["fla"], out["ref"])}}


def child(start: int) -> int:
    for i in range(start, len(SHAPES)):
        print("START", i, flush=True)
        print("ROW", json.dumps(one(*SHAPES[i])), flush=True)
    return 0


def main() -> int:
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    rows, i = [], 0
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    while i < len(SHAPES):
        p = subprocess.Popen([sys.executable, __file__, "--child", str(i)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        last = i
        for line in p.stdout:                   # as measured: a run cut short still shows its rows
            if line.startswith("START"):
                last = int(line.split()[1])
            elif line.startswith("ROW"):
                rows.append(json.loads(line[4:]))
                print(line.strip(), flush=True)
        stderr = p.stderr.read()
        if p.wait() == 0:
            break
        H, K, V, T = SHAPES[last]
        err = [ln for ln in stderr.splitlines() if ln.strip()][-12:]
        rows.append({"H": H, "K": K, "V": V, "T": T, "error": " | ".join(err)[-1500:]})
        print("FAULT", json.dumps(rows[-1]), flush=True)
        i = last + 1
    print(f"{'H':>3} {'K':>4} {'V':>4} {'T':>4}  {'o':>8} {'dq':>8} {'dk':>8} {'dv':>8} {'dg':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['H']:>3} {r['K']:>4} {r['V']:>4} {r['T']:>4}  FAULT {r['error']}")
        else:
            print(f"{r['H']:>3} {r['K']:>4} {r['V']:>4} {r['T']:>4}  " +
                  " ".join(f"{r[n]:>8.2e}" for n in ("o", "dq", "dk", "dv", "dg")) + f"  {r['backend']}")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(child(int(sys.argv[2])) if len(sys.argv) > 2 and sys.argv[1] == "--child" else main())
