"""mixzoo.kernels.rmsnorm: RMS norm with its weight as Triton kernels, on the CPU in Triton's
interpreter with the H200's numerics (benchmarks/lla_small_ridge.py; a fresh process per case, the
interpreter being switched on before triton is imported): against float64, beside the PyTorch form;
stacked models' norms as one call with their K weights (vmap under ``folding()``); and a whole stacked
training run with the mad recipe (these kernels and the SwiGLU ones in every block) giving each run's
numbers (softmax: the rotary-embedding kernel too; gdn: the short-convolution kernel, the gated
output norm and its recurrent scan). Off the GPU (no interpreter) the model's norms
run their PyTorch forms, unchanged."""
import os

import pytest
import torch
from interp import run_interpreted

KERNELS = r"""
from mixzoo.kernels import rmsnorm as N, rmsnorm_triton
out = {"usable": N.usable(-1)}
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
for dt in ("float32", "bfloat16"):
    for shape, gated in (((5, 128), False), ((2, 3, 173), False), ((300, 8), False), ((4, 256), False),
                         ((5, 128), True), ((2, 3, 173), True), ((7, 256), True)):
        x = (torch.randn(*shape, generator=g) * 3).to(getattr(torch, dt))
        z = (torch.randn(*shape, generator=g) * 2).to(getattr(torch, dt)) if gated else None
        w = 1 + 0.3 * torch.randn(shape[-1], generator=g)
        dy = torch.randn(*shape, generator=g)
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        zr = z.double().requires_grad_() if gated else None
        a = xr * torch.nn.functional.silu(zr) if gated else xr
        want = torch.nn.functional.rms_norm(a, (shape[-1],), wr, 1e-6)     # float64 throughout
        want.backward(dy.double())
        res = {}
        for name, fn in (("kernel", N.rms_norm), ("torch", N.rms_norm_torch)):
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            zz = z.clone().requires_grad_() if gated else None
            y = fn(xx, ww, 1e-6, zz)
            y.backward(dy)
            res[name] = dict(dtype=str(y.dtype), gdtype=str(xx.grad.dtype), out=rel(y, want.detach()),
                             dx=rel(xx.grad, xr.grad), dw=rel(ww.grad, wr.grad),
                             **(dict(dz=rel(zz.grad, zr.grad)) if gated else {}))
        out[f"{dt} {shape}{' gated' if gated else ''}"] = res
# stacked: vmap over 3 models' RMSNorm and GatedNorm under folding(): one kernel call, the loop's numbers
from torch.func import functional_call, stack_module_state, vmap
from mixzoo.models.common import RMSNorm
from mixzoo.models._parts import GatedNorm
from mixzoo.train.vmapfold import folding
calls = []
fwd = rmsnorm_triton.forward
rmsnorm_triton.forward = lambda x, *a, **k: calls.append(list(x.shape)) or fwd(x, *a, **k)
torch.manual_seed(0)
for name, make, args in (("rmsnorm", lambda: RMSNorm(12), (torch.randn(3, 2, 5, 12),)),
                         ("gated", lambda: GatedNorm(8), (torch.randn(3, 2, 4, 5, 8), torch.randn(3, 2, 5, 32))),
                         ("mamba gated", lambda: RMSNorm(12), (torch.randn(3, 2, 5, 12), torch.randn(3, 2, 5, 12)))):
    ms = [make() for _ in range(3)]
    for m in ms:
        torch.nn.init.normal_(m.weight, 1.0, 0.2)
    params, bufs = stack_module_state(ms)
    args = tuple(a.requires_grad_() for a in args)
    calls.clear()
    with folding():
        y = vmap(lambda p, b, *a: functional_call(ms[0], (p, b), a))(params, bufs, *args)
    got = torch.autograd.grad(y.square().sum(), (*args, params["weight"]))
    ncalls = list(calls)
    ref = torch.stack([m(*(a[k] for a in args)) for k, m in enumerate(ms)])
    want = torch.autograd.grad(ref.square().sum(), (*args, *[m.weight for m in ms]))
    want = (*want[:len(args)], torch.stack(want[len(args):]))
    out[name] = dict(calls=ncalls, out=float((y - ref).abs().max()),
                     grads=[float((a - b).abs().max()) for a, b in zip(got, want)])
print("RESULT", json.dumps(out))
"""

TRAINING = r"""
from mixzoo.models import RECIPES, ModelConfig
from mixzoo.tasks.mqar import MQAR
from mixzoo.train import TrainConfig, train
from mixzoo.train.stacked import train_stacked
from mixzoo.kernels import causal_conv_triton, parallax_prologue_triton, rmsnorm_triton, rope_triton, swiglu_triton
seen = set()
for mod, fn in ((rmsnorm_triton, "forward"), (swiglu_triton, "forward"), (rope_triton, "rotate"),
                (causal_conv_triton, "forward"), (parallax_prologue_triton, "forward")):
    f = getattr(mod, fn)
    setattr(mod, fn, (lambda f, name: lambda *a, **k: seen.add(name.split(".")[-1]) or f(*a, **k))(f, mod.__name__))
task = MQAR(V=32, L=16, kv=2)
mcfg = ModelConfig(**{**RECIPES["mad"], "d_model": 16, "num_heads": 2})
base = dict(steps=3, batch_size=4, eval_every=3, n_train=12, n_val=4, n_test=4, eval_batch_size=4)
cfgs = [TrainConfig(lr=lr, weight_decay=wd, **base) for lr, wd in ((3e-3, 0.1), (1e-2, 0.0))]
out = {}
for mixer in ("softmax", "gdn"):
    seen.clear()
    solo = [train(task, mixer, {}, mcfg, c, seed=s, device="cpu") for c, s in zip(cfgs, (0, 1))]
    stacked = train_stacked(task, mixer, {}, mcfg, cfgs, (0, 1), device="cpu")
    out[mixer] = dict(kernels=sorted(seen), modes=[r.step_mode for r in stacked],
                      recorded=[r.kernels for r in solo + stacked],
                      solo=[[h["train_loss"] for h in r.history] + [r.test["accuracy"]] for r in solo],
                      stacked=[[h["train_loss"] for h in r.history] + [r.test["accuracy"]] for r in stacked])
os.environ.pop("MIXZOO_EAGER_KERNELS")           # the default: an eager run takes the PyTorch forms
out["eager default"] = train(task, "softmax", {}, mcfg, cfgs[0], seed=0, device="cpu").kernels
print("RESULT", json.dumps(out))
"""


ADD = r"""
from mixzoo.kernels import rmsnorm as N, rmsnorm_triton
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
out = {"usable": N.usable(-1)}
for rdt, odt, with_ds in (("float32", "float32", True), ("bfloat16", "float32", True), ("bfloat16", "bfloat16", True),
                          ("bfloat16", "float32", False)):
    x = torch.randn(3, 7, 173, generator=g) * 3
    r = (torch.randn(3, 7, 173, generator=g) * 2).to(getattr(torch, rdt))
    w = 1 + 0.3 * torch.randn(173, generator=g)
    dy = torch.randn(3, 7, 173, generator=g).to(getattr(torch, odt))
    ds = torch.randn(3, 7, 173, generator=g) if with_ds else None
    xr, rr, wr = (t.double().requires_grad_() for t in (x, r, w))
    sr = xr + rr
    want = torch.nn.functional.rms_norm(sr, (173,), wr, 1e-6)
    torch.autograd.backward([sr, want] if with_ds else [want], [ds.double(), dy.double()] if with_ds else [dy.double()])
    res = {}
    for name, fn in (("kernel", N.add_rms_norm), ("torch", N.add_rms_norm_torch)):
        xx, rx, ww = (t.clone().requires_grad_() for t in (x, r, w))
        s, y = fn(xx, rx, ww, 1e-6, getattr(torch, odt))
        torch.autograd.backward([s, y] if with_ds else [y], [ds, dy] if with_ds else [dy])
        res[name] = dict(dtypes=[str(t.dtype) for t in (s, y, xx.grad, rx.grad)], s=rel(s, sr.detach()),
                         y=rel(y, want.detach()), dx=rel(xx.grad, xr.grad), dr=rel(rx.grad, rr.grad),
                         dw=rel(ww.grad, wr.grad), s_equal=bool(torch.equal(s, x + r)))
    out[f"r {rdt} out {odt}{' ds' if with_ds else ''}"] = res
# stacked: 3 models' RMSNorm with a residual under vmap and folding(): one kernel call, the loop's numbers
from torch.func import functional_call, stack_module_state, vmap
from mixzoo.models.common import RMSNorm
from mixzoo.train.vmapfold import folding
calls = []
fwd = rmsnorm_triton.forward
rmsnorm_triton.forward = lambda x, *a, **k: calls.append(list(x.shape)) or fwd(x, *a, **k)
torch.manual_seed(0)
ms = [RMSNorm(12) for _ in range(3)]
for m in ms:
    torch.nn.init.normal_(m.weight, 1.0, 0.2)
params, bufs = stack_module_state(ms)
x, r = torch.randn(3, 2, 5, 12, requires_grad=True), torch.randn(3, 2, 5, 12).bfloat16().requires_grad_()
with folding():
    s, y = vmap(lambda p, b, x, r: functional_call(ms[0], (p, b), (x,), dict(residual=r)))(params, bufs, x, r)
got = torch.autograd.grad(y.square().sum() + s.sin().sum(), (x, r, params["weight"]))
ncalls = list(calls)
refs = [m(x[k], residual=r[k]) for k, m in enumerate(ms)]
ref_s, ref_y = torch.stack([a for a, _ in refs]), torch.stack([b for _, b in refs])
want = torch.autograd.grad(ref_y.square().sum() + ref_s.sin().sum(), (x, r, *[m.weight for m in ms]))
want = (*want[:2], torch.stack(want[2:]))
out["stacked"] = dict(calls=ncalls, out=[float((y - ref_y).abs().max()), float((s - ref_s).abs().max())],
                      grads=[float((a.float() - b.float()).abs().max()) for a, b in zip(got, want)])
print("RESULT", json.dumps(out))
"""


POST = r"""
from mixzoo.kernels import rmsnorm as N, rmsnorm_triton
from mixzoo.models._parts import GatedNorm
out = {"usable": N.usable(-1)}                      # its self-check first (it runs the kernels itself), then the spy
posts = []
fwd = rmsnorm_triton.forward
rmsnorm_triton.forward = lambda x, *a, **k: posts.append(k.get("post") is not None) or fwd(x, *a, **k)
os.environ["MIXZOO_GATED_NORM"] = "fused"          # the kernel (also the default, unset)
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
for dt in ("float32", "bfloat16"):
    for B, T, H, D in ((2, 5, 3, 8), (1, 7, 2, 173)):
        x = (torch.randn(B, T, H, D, generator=g) * 3).to(getattr(torch, dt))
        wide = (torch.randn(B, T, H * D + 5, generator=g) * 2).to(getattr(torch, dt))   # the gate: a split view
        w = 1 + 0.3 * torch.randn(D, generator=g)
        dy = torch.randn(B, T, H, D, generator=g).to(getattr(torch, dt))
        xr, wr, widr = (t.double().requires_grad_() for t in (x, w, wide))
        want = N.rms_norm_gate_torch(xr, wr, 1e-6, widr[..., 2:2 + H * D].view(B, T, H, D))     # float64 throughout
        want.backward(dy.double())
        res = {}
        for name, fn in (("kernel", N.rms_norm_gate), ("torch", N.rms_norm_gate_torch)):
            xx, ww, wd = (t.clone().requires_grad_() for t in (x, w, wide))
            y = fn(xx, ww, 1e-6, wd[..., 2:2 + H * D].view(B, T, H, D))
            y.backward(dy)
            res[name] = dict(dtype=str(y.dtype), gdtypes=[str(t.grad.dtype) for t in (xx, wd)], y=y.double(),
                             out=rel(y, want.detach()), dx=rel(xx.grad, xr.grad), dw=rel(ww.grad, wr.grad),
                             dz=rel(wd.grad, widr.grad), dz_outside=float(wd.grad[..., :2].abs().max()))
        res["ulps"] = float(((res["kernel"].pop("y") - res["torch"].pop("y")).abs()
                             / want.detach().abs().clamp_min(1e-3)).max())
        out[f"{dt} {B}x{T}x{H}x{D}"] = res
out["kernel calls"] = sum(posts)
from mixzoo.kernels import RAN
out["recorded"] = "rmsnorm-gate" in RAN
# the layer (gdn's, GLA's, MesaNet's output norm) with the kernel against its PyTorch form (MIXZOO_GATED_NORM=torch)
torch.manual_seed(0)
m = GatedNorm(8)
torch.nn.init.normal_(m.weight, 1.0, 0.2)
o = torch.randn(2, 4, 6, 8)
proj = torch.randn(2, 6, 40)
grads, out["layer calls"] = {}, {}
for sw in ("fused", "torch", None):
    if sw is None:
        os.environ.pop("MIXZOO_GATED_NORM")
    else:
        os.environ["MIXZOO_GATED_NORM"] = sw
    oo, pp = o.clone().requires_grad_(), proj.clone().requires_grad_()
    m.weight.grad = None
    posts.clear()
    y = m(oo, pp[..., 3:35])
    y.square().sum().backward()
    grads[sw or "default"] = [y, oo.grad, pp.grad, m.weight.grad]
    out["layer calls"][sw or "default"] = list(posts)
out["layer"] = [float((a - b).abs().max()) for a, b in zip(grads["fused"], grads["torch"])]
out["default is fused"] = all(torch.equal(a, b) for a, b in zip(grads["default"], grads["fused"]))
print("RESULT", json.dumps(out))
"""


def test_gate_after_the_norm_in_one_kernel():
    """``rms_norm_gate``, the gated output norm of gdn, GLA and MesaNet (the norm, then times silu of the gate), with
    ``MIXZOO_GATED_NORM=fused``: the gate read through a wider row's strides, float32 and bf16, heads of 8 and 173;
    against float64 beside the PyTorch form, the same dtypes; the gate's gradient only where it was read; the layer
    with the kernel and with ``MIXZOO_GATED_NORM=torch`` within float32 reordering, and unset (the default) the
    kernel, bit for bit."""
    r = _run(POST)
    assert r.pop("usable") is True
    assert r.pop("kernel calls") == 4, r                              # each case's forward ran the kernel
    assert r.pop("recorded") is True                                  # and a run's kernels name it
    assert r.pop("layer calls") == {"fused": [True], "torch": [False], "default": [True]}
    assert r.pop("default is fused") is True                          # unset: the kernel
    layer = r.pop("layer")
    assert max(layer) < 1e-5, layer
    for case, res in r.items():
        k, t = res["kernel"], res["torch"]
        assert k["dtype"] == t["dtype"] == f"torch.{case.split()[0]}", (case, res)
        assert k["gdtypes"] == t["gdtypes"], (case, res)
        assert k["dz_outside"] == t["dz_outside"] == 0.0, (case, res)
        # float32: reordering only; bf16: the output a rounding apart at most
        assert res["ulps"] < (1e-5 if case.startswith("float32") else 1e-2), (case, res)
        for q in ("out", "dx", "dw", "dz"):
            assert k[q] <= max(1.5 * t[q], 1e-6), (case, q, res)


def test_residual_add_and_norm_in_one_kernel():
    """``add_rms_norm``: s = x + r exactly as PyTorch's add (float32 x, float32 or bf16 r), the norm of s in float32
    or bf16, backward with and without a gradient of s from elsewhere; against float64 beside the PyTorch form;
    stacked models' norms with their residuals one call under vmap, the loop's numbers."""
    r = _run(ADD)
    assert r.pop("usable") is True
    st = r.pop("stacked")
    assert st["calls"] == [[3, 10, 12]], st                           # 3 models x 2 x 5 rows, one call
    assert max(st["out"]) < 1e-5 and max(st["grads"]) < 1e-3, st
    for case, res in r.items():
        k, t = res["kernel"], res["torch"]
        assert k["dtypes"] == t["dtypes"], (case, res)
        assert k["s_equal"] and t["s_equal"], (case, res)
        for q in ("s", "y", "dx", "dr", "dw"):
            assert k[q] <= max(1.01 * t[q], 1e-6), (case, q, res)


def _run(script: str, env: dict | None = None) -> dict:
    return run_interpreted(script, env, drop=("MIXZOO_RMSNORM", "MIXZOO_SWIGLU", "MIXZOO_ROPE", "MIXZOO_CONV",
                                              "MIXZOO_SSD", "MIXZOO_EAGER_KERNELS", "MIXZOO_QKV_PROLOGUE",
                                              "MIXZOO_GATED_NORM"))


def test_kernels_against_float64_and_folded_under_vmap():
    r = _run(KERNELS)
    assert r["usable"] is True
    for case, res in r.items():
        if case in ("usable", "rmsnorm", "gated", "mamba gated"):
            continue
        k, t = res["kernel"], res["torch"]
        assert k["dtype"] == "torch.float32" and k["gdtype"] == f"torch.{case.split()[0]}", (case, res)
        for q in ("out", "dx", "dw", "dz"):   # float32 arithmetic either way; the bf16 cases' dx, dz are rounded once
            if q in k:
                assert k[q] <= max(2 * t[q], 1e-6), (case, q, res)
        assert ("dz" in k) == case.endswith("gated"), (case, res)
    assert r["rmsnorm"]["calls"] == [[3, 10, 12]], r["rmsnorm"]        # 3 models x 2 x 5 rows, one call
    assert r["gated"]["calls"] == [[3, 40, 8]], r["gated"]             # 3 models x 2 x 5 x 4 heads
    assert r["mamba gated"]["calls"] == [[3, 10, 12]], r["mamba gated"]   # the gate folded with the rows
    for name in ("rmsnorm", "gated", "mamba gated"):
        assert r[name]["out"] < 1e-5 and max(r[name]["grads"]) < 1e-4, r[name]


def test_a_stacked_run_with_the_kernels_gives_each_run_s_numbers():
    r = _run(TRAINING, {"MIXZOO_EAGER_KERNELS": "1"})        # the separate (eager) runs take the kernels too
    assert r.pop("eager default") is None, r
    want = {"softmax": ["rmsnorm_triton", "rope_triton", "swiglu_triton"],
            "gdn": ["causal_conv_triton", "rmsnorm_triton", "swiglu_triton"]}
    # each run's result names them (gdn's recurrent scan, mixzoo.kernels.recurrent, too, and its
    # gated output norm, fused by default)
    recorded = {"softmax": "rmsnorm,rope,swiglu", "gdn": "causal_conv,delta_rec,rmsnorm,rmsnorm-gate,swiglu"}
    for mixer, res in r.items():
        assert res["kernels"] == want[mixer], (mixer, res)
        assert res["recorded"] == [recorded[mixer]] * 4, (mixer, res)
        assert res["modes"] == ["stacked", "stacked"], (mixer, res)
        for a, b in zip(res["solo"], res["stacked"]):
            for x, y in zip(a, b):
                assert abs(x - y) <= 1e-4 * max(abs(x), 1e-3), (mixer, a, b)


def test_off_the_gpu_the_norms_run_their_pytorch_forms():
    import torch.nn.functional as F

    from mixzoo.kernels import rmsnorm
    from mixzoo.models._parts import GatedNorm
    from mixzoo.models.common import RMSNorm
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    x = torch.randn(2, 5, 12)
    assert not rmsnorm.runs_on(x)
    n = RMSNorm(12)
    torch.nn.init.normal_(n.weight)
    assert torch.equal(n(x), F.rms_norm(x, (12,), eps=n.eps) * n.weight)
    gn = GatedNorm(8)
    o, gate = torch.randn(2, 4, 5, 8), torch.randn(2, 5, 32)
    want = F.rms_norm(o.transpose(1, 2), (8,), gn.weight, gn.eps).reshape(2, 5, 32) * F.silu(gate)
    assert torch.equal(gn(o, gate), want)


TILES = r"""
import norm_tiles as B
from mixzoo.kernels import rmsnorm_triton as K, swiglu_triton as S
out = {}
g = torch.Generator().manual_seed(1)
for case in ("add16", "gate"):
    f, b, _, _ = B.norm_case(case, 2, 40, 24, torch.device("cpu"), g)
    ref_o = f(None); ref_g = b(ref_o, None)
    for tile in ((64, 1), (256, 2), (4096, 4)):     # 2, 8 and all 40 rows a program (D 24 padded to 32)
        o = f(tile); gr = b(o, tile)
        out[f"{case} {tile}"] = dict(
            out=all(torch.equal(x, y) for x, y in zip(o, ref_o)),
            grads=[None if x is None else float((x - y).abs().max()) for x, y in zip(gr, ref_g)])
f, b, _, _ = B.swiglu_case(37, 24, torch.device("cpu"), g)
o0 = f(None)
out["blocks"] = [list(K._blocks(40, 24, t)) for t in ((64, 1), (256, 2), (4096, 4))]
out["swiglu"] = all(torch.equal(f(t)[0], o0[0]) and torch.equal(b(o0, t)[0], b(o0, None)[0]) for t in ((64, 1), (512, 2)))
print("RESULT", json.dumps(out))
"""


def test_launch_tiles_give_the_default_s_numbers():
    """The ``tile`` launch parameter (benchmarks/norm_tiles.py times it): row blocks of 2, 8 and 40 rows (a partial
    block among them) give the default's norm and input gradients bit for bit, the weight gradient within float32
    reordering; SwiGLU's blocks the same outputs."""
    r = _run(TILES)
    assert r.pop("swiglu") is True
    assert r.pop("blocks") == [[2, 32, 20, 1], [8, 32, 5, 2], [64, 32, 1, 4]]   # rows, width, programs, warps
    for case, res in r.items():
        assert res["out"], (case, res)
        dx, dw, *rest = res["grads"]
        assert dx == 0.0 and all(x in (0.0, None) for x in rest), (case, res)
        assert dw < 1e-5, (case, res)
