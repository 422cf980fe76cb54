"""A mechanism's fast path and its PyTorch path, both under bf16 autocast, each against the PyTorch path in
float64: output and every parameter gradient, norm-relative errors. Tells which bf16 path carries an error
that ``check-mixer``'s fast-vs-ref (bf16 against bf16) reports.

    python benchmarks/fast_vs_f64.py [NAME:HEADS[:D_MODEL][:ATTR=INT] ...]
        default gdn:16 gdn:2 mamba:16 gla:16 parallax:16; D_MODEL 128; ATTR=INT sets a class attribute of the
        mechanism for the fast path only, e.g. gdn:16:128:fla_fp32_below=0 (gdn's bf16 fla path at width 8)
"""
from __future__ import annotations

import sys

import torch

from mixzoo.registry import build_mixer, get_mixer


def errors(name: str, heads: int, d_model: int = 128, batch: int = 2, seq_len: int = 100, seed: int = 0,
           attrs: dict | None = None) -> dict:
    spec = get_mixer(name)
    g = torch.Generator().manual_seed(seed + 3)
    x = torch.randn(batch, seq_len, d_model, generator=g)
    w = torch.randn(batch, seq_len, d_model, generator=g)
    runs = {}
    for tag, backend, f64 in (("f64", "torch", True), ("torch-bf16", "torch", False), ("fast-bf16", "auto", False)):
        torch.manual_seed(seed)
        m = build_mixer(spec, d_model, num_heads=heads, layer_idx=0, l_max=seq_len, backend=backend).cuda()
        if tag == "fast-bf16":
            for key, val in (attrs or {}).items():
                setattr(m, key, val)
        if f64:
            m = m.double()
        xi = x.cuda().double() if f64 else x.cuda()
        ctx = torch.autocast("cuda", enabled=False) if f64 else torch.autocast("cuda", dtype=torch.bfloat16)
        with ctx:
            y = m(xi)
        (y.double() * w.cuda().double()).sum().backward()
        runs[tag] = (getattr(m, "backend", backend), y.detach().double(),
                     {n: p.grad.detach().double() for n, p in m.named_parameters() if p.grad is not None})
    _, y64, g64 = runs["f64"]
    out = {}
    for tag in ("torch-bf16", "fast-bf16"):
        be, y, gr = runs[tag]
        e = {"output": float((y - y64).norm() / y64.norm())}
        e.update({n: float((gr[n] - g64[n]).norm() / g64[n].norm().clamp_min(1e-30)) for n in g64 if n in gr})
        out[f"{tag} ({be})"] = e
    return out


def main(argv=None) -> int:
    todo = (argv if argv is not None else sys.argv[1:]) or ["gdn:16", "gdn:2", "mamba:16", "gla:16", "parallax:16"]
    for item in todo:
        name, heads, *rest = item.split(":")
        attrs = {k: int(v) for k, v in (r.split("=") for r in rest if "=" in r)}
        dm = [r for r in rest if "=" not in r]
        try:
            res = errors(name, int(heads), d_model=int(dm[0]) if dm else 128, attrs=attrs)
        except Exception as e:
            print(f"{name} {heads} heads: {type(e).__name__}: {e}", flush=True)
            continue
        for tag, e in res.items():
            worst = max((k for k in e if k != "output"), key=e.get, default="output")
            width = (int(dm[0]) if dm else 128) // int(heads)
            extra = " ".join(f"{k}={v}" for k, v in attrs.items())
            print(f"{name:<9} {heads:>2} heads of {width:>3} {extra} {tag:<32} vs f64: output {e['output']:.2e}, "
                  f"worst grad {worst} "
                  f"{e[worst]:.2e}; " + ", ".join(f"{k} {v:.1e}" for k, v in e.items() if k != "output"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
