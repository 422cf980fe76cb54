"""mixzoo.kernels.parallax_prologue: Parallax's q, k, v, r from its two projections as one Triton kernel each way, on
the CPU in Triton's interpreter with the H200's numerics (a fresh process): against float64 beside the composition in
the same dtype; the layer with it against the layer with its separate ops; folded under vmap, one call for K models
against each model alone. The same for the kernels without r (``qkv_prologue``, softmax attention's q, k, v). Off the
GPU the layers keep their ops."""
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


QKV_SCRIPT = r"""
from mixzoo import kernels
from mixzoo.kernels import parallax_prologue as P, parallax_prologue_triton as PT
out = {"usable": P.usable(-1)}
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
# q, k, v alone against float64 and the composition in the same dtype (one group of B x T tokens; two and three
# groups below: the self-check above and the vmap fold)
for dt in ("float32", "bfloat16"):
    for B, T, H, D in ((2, 37, 3, 8), (1, 70, 2, 16), (2, 9, 16, 8)):
        qkv = torch.randn(B, T, 3 * H * D, generator=g).to(getattr(torch, dt))
        gs = [torch.randn(B, T, H, D, generator=g).to(qkv.dtype) for _ in range(3)]
        x64 = qkv.double().requires_grad_()
        want = P.qkv_prologue_torch(x64, H)
        (want_d,) = torch.autograd.grad(want, x64, [x.double() for x in gs])
        res = {}
        for name in ("fused", "torch"):
            os.environ["MIXZOO_QKV_PROLOGUE"] = name
            kernels.reset()
            x = qkv.clone().requires_grad_()
            got = P.qkv_prologue(x, H)
            (d,) = torch.autograd.grad(got, x, gs)
            res[name] = dict(ran=kernels.ran(), dtypes=sorted({str(t.dtype) for t in (*got, d)}),
                             shapes=[list(t.shape) for t in (*got, d)], contiguous=all(t.is_contiguous() for t in got),
                             out=[rel(a, b.detach()) for a, b in zip(got, want)], dqkv=rel(d, want_d))
        out[f"{dt} {(B, T, H, D)}"] = res
os.environ.pop("MIXZOO_QKV_PROLOGUE")
# the softmax layer: q, k, v by the kernels against the split views and the rotation kernel (interpreted), float32
from mixzoo.registry import build_mixer, get_mixer, load_builtins
load_builtins()
layer = {}
for env in ("fused", "torch"):
    os.environ["MIXZOO_QKV_PROLOGUE"] = env
    torch.manual_seed(0)
    m = build_mixer(get_mixer("softmax"), 64, num_heads=8, layer_idx=0, l_max=32)
    torch.manual_seed(1)
    x = torch.randn(2, 21, 64, requires_grad=True)
    kernels.reset()
    y = m(x)
    y.square().sum().backward()
    layer[env + " ran"] = kernels.ran()
    layer[env] = [y.detach(), x.grad] + [p.grad for p in m.parameters()]
out["layer"] = dict(ran=[layer["fused ran"], layer["torch ran"]], n=len(layer["fused"]),
                    err=max(rel(a, b.double()) for a, b in zip(layer["fused"], layer["torch"])))
# unset, each mechanism's default: softmax's the rotation kernels, LLA's the prologue (its kernel, here interpreted,
# reads the prologue's (B, T, H, D) heads through their strides); LLA's layer with and without it
os.environ.pop("MIXZOO_QKV_PROLOGUE")
defaults, lla = {}, {}
for env in (None, "fused", "torch"):
    if env:
        os.environ["MIXZOO_QKV_PROLOGUE"] = env
    for name in ("softmax", "lla") if env is None else ("lla",):
        torch.manual_seed(0)
        m = build_mixer(get_mixer(name), 64, num_heads=8, layer_idx=0, l_max=32,
                        **({"backend": "triton", "learn_ridge": True} if name == "lla" else {}))
        torch.manual_seed(1)
        x = torch.randn(2, 21, 64, requires_grad=True)
        kernels.reset()
        y = m(x)
        y.square().sum().backward()
        if env is None:
            defaults[name] = kernels.ran()
        else:
            lla[env] = [y.detach(), x.grad] + [p.grad for p in m.parameters()]
out["defaults"] = defaults
out["lla layer"] = dict(n=len(lla["fused"]), err=max(rel(a, b.double()) for a, b in zip(lla["fused"], lla["torch"])))
os.environ["MIXZOO_QKV_PROLOGUE"] = "fused"
# folded under vmap: K = 3 models, one kernel call of 3 groups, each model's numbers
from torch.func import functional_call, stack_module_state, vmap
from mixzoo.models import _fla
from mixzoo.train.vmapfold import folding
calls = []
fwd = PT.forward
PT.forward = lambda qkv, *a, **k: calls.append(list(qkv.shape)) or fwd(qkv, *a, **k)
K, B, T, H, D = 3, 2, 11, 4, 8
qkv = torch.randn(K, B, T, 3 * H * D, generator=g, requires_grad=True)
f = lambda a: _fla._op("mixzoo.kernels.parallax_prologue", "qkv_prologue")(a, H)
with folding():
    ys = vmap(f)(qkv)
ncalls = list(calls)
loss = sum((y.double() ** 2 * (i + 1)).sum() for i, y in enumerate(ys))
(gq,) = torch.autograd.grad(loss, qkv)
refs = [P.qkv_prologue(qkv[k], H) for k in range(K)]
loss_r = sum((torch.stack([r[i] for r in refs]).double() ** 2 * (i + 1)).sum() for i in range(3))
(gr,) = torch.autograd.grad(loss_r, qkv)
out["vmap"] = dict(calls=ncalls, out=max(float((y - torch.stack([r[i] for r in refs])).abs().max())
                                         for i, y in enumerate(ys)), grad=float((gq - gr).abs().max()))
# three stacked softmax layers: one call, each layer's numbers
torch.manual_seed(0)
ms = [build_mixer(get_mixer("softmax"), 32, num_heads=4, layer_idx=0, l_max=16) for _ in range(K)]
x = torch.randn(K, 2, 9, 32, generator=g)
calls.clear()
params, bufs = stack_module_state(ms)
with folding():
    y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
ncalls = list(calls)
(gw,) = torch.autograd.grad(y.square().sum(), params["qkv.weight"])
ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
wants = torch.autograd.grad(ref.square().sum(), [m.qkv.weight for m in ms])
out["stacked"] = dict(calls=ncalls, out=rel(y, ref.double()), grad=rel(gw, torch.stack(wants).double()))
print("RESULT", json.dumps(out))
"""


def test_qkv_prologue_against_float64_the_softmax_layer_and_folded():
    r = run_interpreted(QKV_SCRIPT, drop=("MIXZOO_QKV_PROLOGUE", "MIXZOO_PARALLAX_PROLOGUE", "MIXZOO_ROPE",
                                          "MIXZOO_ATTN", "MIXZOO_SDPA"))
    assert r["usable"] is True
    for case, res in r.items():
        if case in ("usable", "layer", "vmap", "stacked", "defaults", "lla layer"):
            continue
        k, t = res["fused"], res["torch"]
        dt = case.split()[0]
        assert (k["ran"], t["ran"]) == ("qkv_prologue", None), (case, res)
        assert k["dtypes"] == t["dtypes"] == [f"torch.{dt}"] and k["shapes"] == t["shapes"], (case, res)
        assert k["contiguous"] and t["contiguous"], (case, res)
        assert k["out"][2] == t["out"][2] == 0.0, (case, res)                  # v: a copy
        tol = 3e-6 if dt == "float32" else 6e-3
        assert max(k["out"]) < tol and k["dqkv"] < tol, (case, res)
        assert all(a <= 1.1 * b + 1e-6 for a, b in zip(k["out"] + [k["dqkv"]], t["out"] + [t["dqkv"]])), (case, res)
    ly = r["layer"]
    assert ly["ran"][0] == "qkv_prologue" and "qkv_prologue" not in (ly["ran"][1] or ""), ly
    assert ly["n"] == 4 and ly["err"] < 1e-5, ly                         # y, dx, dW_qkv, dW_out
    d = r["defaults"]                                                    # MIXZOO_QKV_PROLOGUE unset
    assert "qkv_prologue" not in (d["softmax"] or "") and "rope" in d["softmax"], d
    assert "qkv_prologue" in d["lla"] and "rope" not in (d["lla"] or ""), d
    la = r["lla layer"]
    assert la["n"] == 5 and la["err"] < 1e-5, la                         # y, dx, dW_qkv, dW_out, dλ
    v = r["vmap"]
    assert v["calls"] == [[3, 22, 96]], v                               # 3 models' 2 x 11 tokens, one call
    assert v["out"] == 0.0 and v["grad"] == 0.0, v                      # the same rows through the same kernel
    st = r["stacked"]
    assert st["calls"] == [[3, 18, 96]], st
    assert st["out"] < 1e-6 and st["grad"] < 1e-6, st


def test_off_the_gpu_softmax_keeps_its_ops(monkeypatch, capsys):
    from mixzoo.cli import main
    from mixzoo.kernels import parallax_prologue as P
    from mixzoo.models.common import qkv_heads, rope, split_heads
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    qkv = torch.randn(2, 5, 3 * 32)
    assert not P.qkv_runs_on(qkv, 4)
    q, k, v = qkv_heads(qkv, 4, True)
    want = [split_heads(t, 4) for t in qkv.chunk(3, dim=-1)]
    assert torch.equal(q, rope(want[0])) and torch.equal(k, rope(want[1])) and torch.equal(v, want[2])
    assert all(a.data_ptr() == b.data_ptr() and a.stride() == b.stride()        # no rotation: views of qkv
               for a, b in zip(qkv_heads(qkv, 4, False), want))
    monkeypatch.setenv("MIXZOO_QKV_PROLOGUE", "torch")
    assert P.qkv_switch() == "torch"
    monkeypatch.setenv("MIXZOO_QKV_PROLOGUE", "bad")                 # bad input: one line, exit code 2
    assert main(["tasks"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mixzoo: error: MIXZOO_QKV_PROLOGUE='bad'; allowed: torch, fused (or unset)"], err
