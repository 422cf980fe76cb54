"""Causal softmax attention with small heads (the MAD recipe: 16 heads of 8), forward + backward, side by side.

Each implementation gets the same inputs as the ``softmax`` mechanism's layer hands SDPA: q, k, v as
(B, T, H, D) slices of one projection's output, heads of D = 8. Times are ``triton.testing.do_bench``
medians of forward + backward (output and input gradients), all implementations in one process, one after
another at each shape; errors are relative L2 against float64 attention on the same bf16 inputs.

    python benchmarks/attn_small_heads.py --shapes 768x128,768x256,768x512,768x1024 --out logs/attn.json

Implementations: ``sdpa`` (PyTorch's choice; cuDNN on Hopper), ``sdpa-flash``, ``sdpa-efficient``,
``sdpa-cudnn`` (pinned), ``fla`` (fla's ``parallel_attn`` on (B, T, H, D) inputs), ``mixzoo``
(``mixzoo.kernels.attn``), and ``mixzoo@fwd=RxKxWxS+dkdv=...+dq=...`` for other tiles of it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F


def _sdpa(backend=None):
    def run(q, k, v):                      # (B, T, H, D) views -> SDPA on (B, H, T, D) views, as the layer
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        if backend is None:
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        else:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        return o.transpose(1, 2)
    return run


def _fla(q, k, v):
    from fla.ops.attn import parallel_attn
    return parallel_attn(q, k, v, scale=q.shape[-1] ** -0.5)


def _mixzoo(tiles=None):
    def run(q, k, v):
        from mixzoo.kernels.attn import attention
        return attention(*(t.transpose(1, 2) for t in (q, k, v)), tiles=tiles).transpose(1, 2)
    return run


def _impl(name):
    """An implementation by name; ``mixzoo@fwd=128x64x4x2,dq=...`` sets the kernels' tiles (rows, keys, warps,
    stages; ``mixzoo.kernels.attn.TILES``)."""
    if name.startswith("mixzoo@"):
        tiles = {}
        for part in name[len("mixzoo@"):].split("+"):
            k, v = part.split("=")
            tiles[k] = tuple(int(x) for x in v.split("x"))
        return _mixzoo(tiles)
    return IMPLS[name]


IMPLS = {"sdpa": _sdpa(), "sdpa-flash": _sdpa("FLASH_ATTENTION"), "sdpa-efficient": _sdpa("EFFICIENT_ATTENTION"),
         "sdpa-cudnn": _sdpa("CUDNN_ATTENTION"), "fla": _fla, "mixzoo": _mixzoo()}


def reference(q, k, v):
    qt, kt, vt = (t.double().transpose(1, 2) for t in (q, k, v))
    T = q.shape[1]
    s = qt @ kt.transpose(-1, -2) * q.shape[-1] ** -0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (s.softmax(-1) @ vt).transpose(1, 2)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _views(T, H, D):
    return lambda x: [t.view(x.shape[0], T, H, D) for t in x.chunk(3, dim=-1)]


def _measure(fn, views, qkv, do, xs, xr, ref, n) -> dict:
    """Errors against float64 on the first n sequences, then forward and forward+backward medians (ms)."""
    import triton.testing
    xs.grad = None
    o = fn(*views(xs))
    o.backward(do[:n])
    row = dict(err_o=rel(o, ref), err_grad=rel(xs.grad, xr.grad))

    def step():
        qkv.grad = None
        fn(*views(qkv)).backward(do)
    row.update(fwd_ms=triton.testing.do_bench(lambda: fn(*views(qkv.detach())), warmup=50, rep=300),
               fwd_bwd_ms=triton.testing.do_bench(step, warmup=50, rep=300))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="768x128,768x256,768x512,768x1024", help="BxT, comma separated")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma separated (module docstring)")
    ap.add_argument("--check-batch", type=int, default=8, help="batch of the float64 accuracy check")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = "cuda"
    H, D = a.heads, a.dim
    rows = []
    for shape in a.shapes.split(","):
        B, T = (int(x) for x in shape.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        qkv = torch.randn(B, T, 3 * H * D, device=dev, generator=g).to(torch.bfloat16).requires_grad_()
        do = torch.randn(B, T, H, D, device=dev, generator=g).to(torch.bfloat16)

        views = _views(T, H, D)
        # accuracy on a slice of the batch, against float64, with the gradients
        xs = qkv.detach()[: a.check_batch].clone().requires_grad_()
        xr = xs.detach().double().requires_grad_()
        ref = reference(*views(xr))
        ref.backward(do[: a.check_batch].double())
        for name in a.impls.split(","):
            row = dict(impl=name, B=B, T=T, H=H, D=D)
            try:
                row.update(_measure(_impl(name), views, qkv, do, xs, xr, ref, a.check_batch))
            except Exception as e:               # one implementation that cannot run a shape: say so, go on
                row.update(error=f"{type(e).__name__}: {str(e)[:200]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)
        d = os.path.dirname(os.path.abspath(a.out))
        with tempfile.NamedTemporaryFile("w", dir=d, delete=False, suffix=".tmp") as f:
            json.dump(out, f, indent=1)
        os.replace(f.name, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
