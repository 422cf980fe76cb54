"""mixzoo.kernels.causal_conv: the short causal depthwise convolution (with SiLU) as Triton kernels,
on the CPU in Triton's interpreter with the H200's numerics (benchmarks/lla_small_ridge.py; a fresh
process, the interpreter being switched on before triton is imported): against float64 beside the
model's PyTorch form under bf16 autocast; folded under vmap (K models' sequences in one call, each reading its
model's weight). Off the
GPU the PyTorch form runs, unchanged."""
import os

import pytest
import torch
from interp import run_interpreted

SCRIPT = r"""
from mixzoo.kernels import causal_conv as C, causal_conv_triton
from mixzoo.models._parts import ConvAct
from mixzoo.models.common import ShortConv
out = {"usable": C.usable(-1)}
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm())
torch.manual_seed(0)
for name, make, (B, T, Cn) in (("convact", lambda c: ConvAct(c, 4), (2, 45, 70)),
                               ("convact", lambda c: ConvAct(c, 4), (1, 130, 384)),
                               ("shortconv", lambda c: ShortConv(c, 3), (3, 7, 5))):
    m = make(Cn)
    conv = m.conv.conv if name == "convact" else m.conv
    x = torch.randn(B, T, Cn, generator=g)
    dy = torch.randn(B, T, Cn, generator=g)
    ins = [x.double().requires_grad_(), conv.weight.detach().double().squeeze(1).requires_grad_(),
           conv.bias.detach().double().requires_grad_()]
    want = C.causal_conv_torch(*ins, name == "convact")
    wants = torch.autograd.grad(want, ins, dy.double())
    res = {}
    for form, env in (("kernel", None), ("torch", "torch")):
        if env: os.environ["MIXZOO_CONV"] = env
        else: os.environ.pop("MIXZOO_CONV", None)
        xx = x.clone().requires_grad_()
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(xx)
        y.float().backward(dy)
        res[form] = dict(dtype=str(y.dtype), out=rel(y, want.detach()), dx=rel(xx.grad, wants[0]),
                         dw=rel(conv.weight.grad.squeeze(1), wants[1]), db=rel(conv.bias.grad, wants[2]))
    os.environ.pop("MIXZOO_CONV", None)
    out[f"{name} {(B, T, Cn)}"] = res
from torch.func import functional_call, stack_module_state, vmap
from mixzoo.train.vmapfold import folding
calls = []
fwd = causal_conv_triton.forward
causal_conv_triton.forward = lambda x, *a: calls.append(list(x.shape)) or fwd(x, *a)
ms = [ConvAct(6, 4) for _ in range(3)]
params, bufs = stack_module_state(ms)
x = torch.randn(3, 2, 9, 6, generator=g).requires_grad_()
with folding():
    y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
n_folded = len(calls)
got = torch.autograd.grad(y.square().sum(), (x, params["conv.conv.weight"], params["conv.conv.bias"]))
ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
want = torch.autograd.grad(ref.square().sum(), (x, *[m.conv.conv.weight for m in ms], *[m.conv.conv.bias for m in ms]))
want = (want[0], torch.stack(want[1:4]), torch.stack(want[4:7]))
out["vmap"] = dict(calls=calls[:n_folded], out=float((y - ref).abs().max()),
                   grads=[float((a - b).abs().max()) for a, b in zip(got, want)])
sc = [ShortConv(5, 3) for _ in range(2)]              # the backbone's convolution: width 3, no SiLU, 2 models
sp, sb = stack_module_state(sc)
xs = torch.randn(2, 3, 7, 5, generator=g)
calls.clear()
with folding():
    ys = vmap(lambda p, b, xi: functional_call(sc[0], (p, b), (xi,)))(sp, sb, xs)
out["vmap shortconv"] = dict(calls=list(calls), out=float((ys - torch.stack([m(xi) for m, xi in zip(sc, xs)])).abs().max()))
os.environ["MIXZOO_CONV_FOLD"] = "channels"          # the models in the channels instead, the fold before
calls.clear()
with folding():
    y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
n_folded = len(calls)
got = torch.autograd.grad(y.square().sum(), (x, params["conv.conv.weight"], params["conv.conv.bias"]))
os.environ.pop("MIXZOO_CONV_FOLD")
out["vmap channels"] = dict(calls=calls[:n_folded], out=float((y - ref).abs().max()),
                            grads=[float((a - b).abs().max()) for a, b in zip(got, want)])
print("RESULT", json.dumps(out))
"""


def test_kernels_against_float64_beside_the_pytorch_form_and_folded():
    r = run_interpreted(SCRIPT, drop=("MIXZOO_CONV",))
    assert r["usable"] is True
    for case, res in r.items():
        if case.startswith("vmap") or case == "usable":
            continue
        k, t = res["kernel"], res["torch"]
        assert k["dtype"] == t["dtype"] == "torch.bfloat16", (case, res)
        for q in ("out", "dx", "dw", "db"):                    # one bf16 rounding where the form has two or more
            assert k[q] <= 1.1 * t[q] + 1e-6, (case, q, res)
    v = r["vmap"]
    assert v["calls"] == [[6, 9, 6]], v                       # 3 models' 2 sequences: one call, models in the batch
    assert v["out"] < 1e-5 and max(v["grads"]) < 1e-4, v
    v = r["vmap shortconv"]
    assert v["calls"] == [[6, 7, 5]] and v["out"] < 1e-5, v
    v = r["vmap channels"]
    assert v["calls"] == [[2, 9, 18]], v                      # MIXZOO_CONV_FOLD=channels: 3 models' 6 channels
    assert v["out"] < 1e-5 and max(v["grads"]) < 1e-4, v


def test_off_the_gpu_the_pytorch_form_runs_unchanged():
    import torch.nn.functional as F

    from mixzoo.kernels import causal_conv
    from mixzoo.models._parts import ConvAct
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    m = ConvAct(6, 4)
    x = torch.randn(2, 9, 6)
    assert not causal_conv.runs_on(x)
    c = m.conv.conv
    want = F.silu(F.conv1d(x.transpose(1, 2), c.weight, c.bias, padding=3, groups=6)[..., :9].transpose(1, 2))
    assert torch.equal(m(x), want)
