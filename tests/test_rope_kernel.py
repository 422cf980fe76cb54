"""mixzoo.kernels.rope: rotary embedding as one Triton kernel each way, on the CPU in Triton's
interpreter with the H200's numerics (benchmarks/lla_small_ridge.py; a fresh process, the interpreter
being switched on before triton is imported): against float64, beside the model's PyTorch form in the
same dtype; from the projection's strided view; folded under vmap. Off the GPU the PyTorch form runs,
unchanged."""
import os

import pytest
import torch
from interp import run_interpreted

SCRIPT = r"""
from mixzoo.kernels import rope as R, rope_triton
from mixzoo.models import common
out = {"usable": R.usable(-1)}
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
for dt in ("float32", "bfloat16"):
    for B, H, T, D in ((2, 3, 37, 8), (1, 2, 300, 64), (1, 1, 5, 128)):
        qkv = torch.randn(B, T, 3 * H * D, generator=g).to(getattr(torch, dt))
        x = qkv[..., H * D:2 * H * D].unflatten(-1, (H, D)).transpose(1, 2)       # a strided (B, H, T, D) view
        dy = torch.randn(B, H, T, D, generator=g).to(x.dtype)
        xr = x.double().requires_grad_()
        want = R.rope_torch(xr)
        want.backward(dy.double())
        res = {}
        for name, env in (("kernel", None), ("torch", "torch")):
            if env: os.environ["MIXZOO_ROPE"] = env
            else: os.environ.pop("MIXZOO_ROPE", None)
            xx = x.detach().clone().requires_grad_()
            y = common.rope(xx)
            y.backward(dy)
            res[name] = dict(dtype=str(y.dtype), out=rel(y, want.detach()), dx=rel(xx.grad, xr.grad))
        os.environ.pop("MIXZOO_ROPE", None)
        out[f"{dt} {(B, H, T, D)}"] = res
from torch.func import vmap
from mixzoo.models import _fla
from mixzoo.train.vmapfold import folding
calls = []
rot = rope_triton.rotate
rope_triton.rotate = lambda x, *a, **k: calls.append(list(x.shape)) or rot(x, *a, **k)
x = torch.randn(3, 2, 4, 9, 8, generator=g).requires_grad_()
with folding():
    y = vmap(common.rope)(x)
(gx,) = torch.autograd.grad(y.square().sum(), x)
ref = torch.stack([common.rope(t) for t in x])
(wx,) = torch.autograd.grad(ref.square().sum(), x)
out["vmap"] = dict(calls=calls[:1], out=float((y - ref).abs().max()), grad=float((gx - wx).abs().max()))
print("RESULT", json.dumps(out))
"""


def test_rope_kernel_against_float64_and_folded():
    r = run_interpreted(SCRIPT, drop=("MIXZOO_ROPE",))
    assert r["usable"] is True
    for case, res in r.items():
        if case in ("usable", "vmap"):
            continue
        k, t = res["kernel"], res["torch"]
        dt = case.split()[0]
        assert k["dtype"] == t["dtype"] == f"torch.{dt}", (case, res)
        tol = 3e-6 if dt == "float32" else 5e-3      # float32 angles t·inv at t < 300 round to ~1e-6 (both forms)
        assert k["out"] < tol and k["dx"] < tol, (case, res)
        assert k["out"] <= 1.1 * t["out"] + 1e-6 and k["dx"] <= 1.1 * t["dx"] + 1e-6, (case, res)
    v = r["vmap"]
    assert v["calls"] == [[6, 4, 9, 8]], v                        # 3 models x 2 sequences, one call
    assert v["out"] < 1e-5 and v["grad"] < 1e-5, v


def test_off_the_gpu_the_pytorch_form_runs_unchanged():
    from mixzoo.kernels import rope
    from mixzoo.models.common import rope as model_rope
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    x = torch.randn(2, 3, 7, 8)
    assert not rope.runs_on(x)
    half = 4
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    ang = torch.arange(7, dtype=torch.float32)[:, None] * inv[None, :]
    x1, x2 = x[..., :half], x[..., half:]
    want = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], dim=-1)
    assert torch.equal(model_rope(x), want)
