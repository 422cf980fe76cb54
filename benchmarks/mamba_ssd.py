"""Mamba-2's scan three ways, forward and backward, at the mad recipe's heads (16 heads of 16, d_state 64, B and C
shared by the heads): mixzoo's ``torch-chunk`` (``_scan.simple_gla_chunk``, the SSD form in float32 with
mixzoo's within-chunk kernel, what Mamba-2 runs on a GPU today), mamba-ssm's Triton SSD
(``mamba_chunk_scan_combined``, the official Mamba-2 kernels; bf16 values, float32 states) at chunk sizes 64,
128 and 256, and fla's ``chunk_simple_gla`` with the heads zero-padded to 64 (Mamba-2's ``backend="fla"``).
Each is timed (triton's do_bench median, forward + backward of y = scan(x, dt, A, B, C) against a fixed dy) on
the same inputs and checked against a float64 ``simple_gla_chunk`` at batch 16 (relative Frobenius error of y
and of the gradients of x, dt, B and C).

    python benchmarks/mamba_ssd.py --T 128,256,512,1024 --B 768 --out logs/mamba-ssd.json

Batch 768 is six stacked models of batch 128 (stacked steps fold the models into the batch).
mamba-ssm's paths need its package on the GPU machine; its pure-Python wheel (the Triton kernels, no CUDA
extension) is built here with ``MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE .venv/bin/python -m pip wheel
--no-deps --no-build-isolation mamba-ssm==2.3.2.post1 -w .whl`` (wheel and setuptools in .venv) and carried in
``.whl/``, which scripts/gpu-zoo.sh installs.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

H, P, N = 16, 16, 64


def _inputs(B: int, T: int, seed: int = 0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)             # noqa: E731
    x = r(B, T, H, P).to(dtype)
    dt = F.softplus(r(B, T, H) - 1.0)                                       # float32, as Mamba-2 forms it
    A = -torch.empty(H, device="cuda").uniform_(1, 16, generator=g)
    Bm, Cm = (r(B, T, 1, N).div(N ** 0.5).to(dtype) for _ in range(2))
    dy = r(B, T, H, P).to(dtype)
    return x, dt, A, Bm, Cm, dy


def _torch_chunk(x, dt, A, Bm, Cm):
    from mixzoo.models._scan import simple_gla_chunk
    hf = lambda t: t.transpose(1, 2)                                        # noqa: E731
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return hf(simple_gla_chunk(hf(Cm.to(cdt)), hf(Bm.to(cdt)), hf(x.to(cdt)), hf(A * dt), chunk=64, k_scale=hf(dt)))


def _mamba_ssm(cs: int):
    from mixzoo.models.mamba import ssd_combined
    fn = ssd_combined()
    if fn is None:
        return None
    return lambda x, dt, A, Bm, Cm: fn(x, dt, A, Bm, Cm, chunk_size=cs)


def _fla_padded():
    from mixzoo.models import _fla
    fn, _ = _fla.gated_chunk_op("fla.ops.simple_gla", "chunk_simple_gla", N, 64)
    if fn is None:
        return None

    def run(x, dt, A, Bm, Cm):
        B, T = x.shape[:2]
        k = Bm.float() * dt.unsqueeze(-1)
        q = Cm.float().expand(B, T, H, N)
        vp = _fla.pad_heads(x, width=64)
        return fn(q.to(x.dtype).contiguous(), k.to(x.dtype), vp, g=(A * dt).contiguous(), scale=1.0)[0][..., :P]
    return run


def _grads(fn, x, dt, A, Bm, Cm, dy):
    xs = [t.detach().clone().requires_grad_(True) for t in (x, dt, Bm, Cm)]
    y = fn(xs[0], xs[1], A, xs[2], xs[3])
    return [y.detach()] + list(torch.autograd.grad(y, xs, dy.to(y.dtype)))


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="128,256,512,1024")
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mamba_ssd: needs a GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench
    paths = {"torch-chunk": _torch_chunk}
    for cs in (64, 128, 256):
        f = _mamba_ssm(cs)
        if f is not None:
            paths[f"mamba-ssm-c{cs}"] = f
    fp = _fla_padded()
    if fp is not None:
        paths["fla-padded64"] = fp
    print("paths:", ", ".join(paths), flush=True)
    rows = []
    for T in (int(t) for t in a.T.split(",")):
        ref_in = _inputs(16, T, seed=1)
        ref = _grads(_torch_chunk, *(t.double() if t.is_floating_point() else t for t in ref_in[:5]), ref_in[5])
        x, dt, A, Bm, Cm, dy = _inputs(a.B, T)
        for name, fn in paths.items():
            row = {"T": T, "B": a.B, "path": name}
            try:
                got = _grads(fn, *ref_in)
                row["rel_err"] = dict(zip(("y", "dx", "ddt", "dB", "dC"), (_rel(g, r) for g, r in zip(got, ref))))
                xs = [t.detach().clone().requires_grad_(True) for t in (x, dt, Bm, Cm)]

                def fwd_bwd():
                    y = fn(xs[0], xs[1], A, xs[2], xs[3])
                    torch.autograd.grad(y, xs, dy.to(y.dtype))

                def fwd():
                    with torch.no_grad():
                        fn(x, dt, A, Bm, Cm)
                fwd_bwd()
                row["fwd_ms"] = do_bench(fwd, warmup=5, rep=50)
                row["fwd_bwd_ms"] = do_bench(fwd_bwd, warmup=5, rep=50)
            except Exception as e:                    # a path that fails is reported, the others still run
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            rows.append(row)
            print(json.dumps(row), flush=True)
        base = {r["T"]: r.get("fwd_bwd_ms") for r in rows if r["path"] == "torch-chunk"}
        for r in rows:
            if r["T"] == T and r.get("fwd_bwd_ms") and base.get(T):
                r["x_torch_chunk"] = base[T] / r["fwd_bwd_ms"]
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
        import os
        os.replace(a.out + ".tmp", a.out)
    print(f"{'T':>5} {'path':>16} {'fwd ms':>8} {'fwd+bwd ms':>10} {'x':>6}  rel err y / dx / ddt / dB / dC")
    for r in rows:
        e = r.get("rel_err", {})
        print(f"{r['T']:>5} {r['path']:>16} {r.get('fwd_ms', float('nan')):8.3f} {r.get('fwd_bwd_ms', float('nan')):10.3f} "
              f"{r.get('x_torch_chunk', float('nan')):6.2f}  " + " / ".join(f"{v:.1e}" for v in e.values())
              + (f"  {r['error']}" if "error" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
