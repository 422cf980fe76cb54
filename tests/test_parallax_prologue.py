"""mixzoo.kernels.parallax_prologue: Parallax's q, k, v, r from its two projections as one Triton kernel each way, on
the CPU in Triton's interpreter with the H200's numerics (a fresh process): against float64 beside the composition in
the same dtype; the layer with it against the layer with its separate ops; folded under vmap, one call for K models
against each model alone. Off the GPU the layer keeps its ops."""
import os

import pytest
import torch
from interp import run_interpreted

SCRIPT = r"""
from mixzoo.kernels import parallax_prologue as P, parallax_prologue_triton as PT
out = {"usable": P.usable(-1)}
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
for dt in ("float32", "bfloat16"):
    for B, T, H, D, norm, rq, rr_ in ((2, 37, 3, 8, True, True, True), (1, 70, 2, 16, True, True, False),
                                      (2, 9, 16, 8, False, False, True), (1, 33, 5, 4, True, False, False)):
        C = H * D
        qkv = torch.randn(B, T, 3 * C, generator=g).to(getattr(torch, dt))
        rr = (torch.randn(B, T, C, generator=g) * 2).to(qkv.dtype)
        w = (1 + 0.3 * torch.randn(D, generator=g)) if norm else None
        gs = [torch.randn(B, T, H, D, generator=g).to(qkv.dtype) for _ in range(4)]
        ins64 = [t.double().requires_grad_() for t in (qkv, rr) + ((w,) if norm else ())]
        want = P.prologue_torch(ins64[0], ins64[1], ins64[2] if norm else None, H, 1e-6, rq, rr_)
        wants = torch.autograd.grad(want, ins64, [x.double() for x in gs])
        res = {}
        for name, env in (("kernel", "fused"), ("torch", "torch")):
            os.environ["MIXZOO_PARALLAX_PROLOGUE"] = env
            ins = [t.detach().clone().requires_grad_() for t in (qkv, rr) + ((w,) if norm else ())]
            got = P.prologue(ins[0], ins[1], ins[2] if norm else None, H, 1e-6, rq, rr_)
            grads = torch.autograd.grad(got, ins, gs)
            res[name] = dict(dtypes=sorted({str(t.dtype) for t in got}), shapes=[list(t.shape) for t in got],
                             contiguous=all(t.is_contiguous() for t in got),
                             out=max(rel(a, b.detach()) for a, b in zip(got, want)),
                             grads=[rel(a, b) for a, b in zip(grads, wants)])
        out[f"{dt} {(B, T, H, D, norm, rq, rr_)}"] = res
os.environ.pop("MIXZOO_PARALLAX_PROLOGUE")
# the layer: its prologue by the kernels against its separate ops (mixzoo's rope and norm kernels, interpreted)
from mixzoo.registry import build_mixer, get_mixer, load_builtins
load_builtins()
layer = {}
for env in ("fused", "torch"):
    os.environ["MIXZOO_PARALLAX_PROLOGUE"] = env
    torch.manual_seed(0)
    m = build_mixer(get_mixer("parallax"), 64, num_heads=8, layer_idx=0, l_max=32)
    torch.manual_seed(1)
    x = torch.randn(2, 21, 64, requires_grad=True)
    y = m(x)
    y.square().sum().backward()
    from mixzoo import kernels
    layer[env + " ran"] = "parallax_prologue" in kernels.RAN
    kernels.reset()
    layer[env] = [y.detach(), x.grad] + [p.grad for p in m.parameters() if p.grad is not None]
out["layer"] = dict(ran=[layer["fused ran"], layer["torch ran"]], n=len(layer["fused"]),
                    err=max(rel(a, b.double()) for a, b in zip(layer["fused"], layer["torch"])))
os.environ["MIXZOO_PARALLAX_PROLOGUE"] = "fused"
# folded under vmap: K = 3 models (their own norm weights), one kernel call
from torch.func import vmap
from mixzoo.models import _fla
from mixzoo.train.vmapfold import folding
calls = []
fwd = PT.forward
PT.forward = lambda qkv, *a, **k: calls.append(list(qkv.shape)) or fwd(qkv, *a, **k)
K, B, T, H, D = 3, 2, 11, 4, 8
qkv = torch.randn(K, B, T, 3 * H * D, generator=g, requires_grad=True)
rr = torch.randn(K, B, T, H * D, generator=g, requires_grad=True)
w = (1 + 0.3 * torch.randn(K, D, generator=g)).requires_grad_()
f = lambda a, b, c: _fla._op("mixzoo.kernels.parallax_prologue", "prologue")(a, b, c, H, 1e-6, True, True)
with folding():
    ys = vmap(f)(qkv, rr, w)
loss = sum((y.double() ** 2 * (i + 1)).sum() for i, y in enumerate(ys))
gq = torch.autograd.grad(loss, (qkv, rr, w))
refs = [P.prologue(qkv[k], rr[k], w[k], H, 1e-6, True, True) for k in range(K)]
loss_r = sum((torch.stack([r[i] for r in refs]).double() ** 2 * (i + 1)).sum() for i in range(4))
gr = torch.autograd.grad(loss_r, (qkv, rr, w))
out["vmap"] = dict(calls=calls, out=max(float((y - torch.stack([r[i] for r in refs])).abs().max()) for i, y in enumerate(ys)),
                   grad=max(rel(a, b.double()) for a, b in zip(gq, gr)))
print("RESULT", json.dumps(out))
"""


def test_prologue_kernels_against_float64_the_layer_and_folded():
    r = run_interpreted(SCRIPT, drop=("MIXZOO_PARALLAX_PROLOGUE", "MIXZOO_ROPE", "MIXZOO_RMSNORM"))
    assert r["usable"] is True
    for case, res in r.items():
        if case in ("usable", "layer", "vmap"):
            continue
        k, t = res["kernel"], res["torch"]
        dt = case.split()[0]
        assert k["dtypes"] == t["dtypes"] == [f"torch.{dt}"] and k["shapes"] == t["shapes"], (case, res)
        assert k["contiguous"] and t["contiguous"], (case, res)
        tol = 3e-6 if dt == "float32" else 6e-3
        assert k["out"] < tol and max(k["grads"]) < tol, (case, res)
        assert k["out"] <= 1.1 * t["out"] + 1e-6, (case, res)
        assert all(a <= 1.1 * b + 1e-6 for a, b in zip(k["grads"], t["grads"])), (case, res)
    assert r["layer"]["ran"] == [True, False], r["layer"]
    assert r["layer"]["n"] >= 5 and r["layer"]["err"] < 1e-5, r["layer"]
    v = r["vmap"]
    assert v["calls"][0] == [3, 22, 96], v                            # 3 models' 2 x 11 tokens, one call
    assert v["out"] < 1e-6 and v["grad"] < 1e-6, v


def test_off_the_gpu_the_layer_keeps_its_ops():
    from mixzoo.kernels import parallax_prologue as P
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    assert not P.runs_on(torch.zeros(2, 5, 3 * 32), 4)
    os.environ["MIXZOO_PARALLAX_PROLOGUE"] = "torch"
    try:
        assert P.switch() == "torch"
    finally:
        del os.environ["MIXZOO_PARALLAX_PROLOGUE"]
