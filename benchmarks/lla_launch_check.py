"""Rerun one captured LLA kernel launch (a ``*.full.pt`` written by benchmarks/divergence.py) and say
whether its result depends on what the kernel's work buffers held before it ran.

    python benchmarks/lla_launch_check.py FULL.pt [--fill normal,nan,zero,big] [--repeat N]

For each fill, every buffer the kernel launcher allocates with ``torch.empty`` (outputs, y, ν, row
constants, iteration counts) is first filled with that value (``normal``: left as allocated), then the
forward and backward run on the captured inputs. A result that changes with the fill means the kernel
reads memory it did not write. Under ``compute-sanitizer --tool memcheck|initcheck`` the same run
names the access. Prints the largest |dq|, |dk|, |dv| and the (sequence, head) holding it per fill.
"""
from __future__ import annotations

import argparse
import sys

import torch


def run_once(d, fill: str):
    from mixzoo.kernels.lla import triton_lla
    real_empty, real_empty_like = torch.empty, torch.empty_like
    value = {"nan": float("nan"), "zero": 0.0, "big": 3.0e38}.get(fill)

    def poisoned(t):
        if value is not None and t.is_floating_point():
            t.fill_(value if t.dtype == torch.float32 else min(value, 3.0e38))
        elif value is not None:
            t.fill_(-7)
        return t

    class _Torch:                      # the launcher's module-level `torch`, with empty/empty_like poisoned
        def __getattr__(self, name):
            if name == "empty":
                return lambda *a, **k: poisoned(real_empty(*a, **k))
            if name == "empty_like":
                return lambda *a, **k: poisoned(real_empty_like(*a, **k))
            return getattr(torch, name)

    saved = triton_lla.torch
    triton_lla.torch = _Torch()
    try:
        q, k, v, go = (d[n].cuda().clone().requires_grad_(n != "go") for n in ("q", "k", "v", "go"))
        ridge = d["ridge"].cuda() if torch.is_tensor(d["ridge"]) else d["ridge"]
        o = triton_lla.lla(q, k, v, ridge=ridge, prec=d["prec"], **d.get("kw", {}))
        o.backward(go)
        torch.cuda.synchronize()
    finally:
        triton_lla.torch = saved
    out = {"o": o.detach()}
    out.update(dq=q.grad, dk=k.grad, dv=v.grad)
    return out


def summary(r):
    parts = []
    for n, t in r.items():
        m = t.float().abs().nan_to_num(float("inf")).amax((-1, -2))
        val, idx = m.flatten().max(0)
        parts.append(f"{n} {float(val):.3g} at {divmod(int(idx), m.shape[1])}")
    return ", ".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("path")
    p.add_argument("--fill", default="normal,nan,zero,big")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args(argv)
    d = torch.load(a.path, weights_only=False)
    print(f"inputs {tuple(d['q'].shape)} {d['q'].dtype}, prec {d['prec']}, kw {d.get('kw')}", flush=True)
    base = None
    for fill in a.fill.split(","):
        for rep in range(a.repeat):
            r = run_once(d, fill)
            diff = ""
            if base is None:
                base = r
            else:
                diff = "; max |difference| to the first run: " + ", ".join(
                    f"{n} {float((r[n].float() - base[n].float()).abs().nan_to_num(float('inf')).max()):.3g}"
                    for n in r)
            print(f"fill {fill} run {rep}: {summary(r)}{diff}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
