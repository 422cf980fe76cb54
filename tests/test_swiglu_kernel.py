"""mixzoo.kernels.swiglu: the fused SwiGLU gate's Triton kernels, on the CPU in Triton's interpreter
with the H200's numerics (benchmarks/lla_small_ridge.py; switched on before triton is imported, so
each case runs in a fresh process), against the PyTorch form in float64 and in the input's dtype;
its folding under vmap (stacked training: one call for every model's rows); and the PyTorch form,
unchanged, wherever the kernels do not run."""
import os

import pytest
import torch
from interp import run_interpreted

SCRIPT = r"""
from mixzoo.kernels import swiglu as S
out = {"usable": S.usable(-1)}
g = torch.Generator().manual_seed(0)
for dt in ("float32", "bfloat16"):
    for shape in ((5, 2 * 341), (2, 3, 2 * 7), (1, 2 * 1024)):     # partial blocks, odd halves, one full block
        h = (torch.randn(*shape, generator=g) * 3).to(getattr(torch, dt))
        do = torch.randn(*shape[:-1], shape[-1] // 2, generator=g).to(h.dtype)
        x = h.clone().requires_grad_()
        y = S.swiglu(x)
        y.backward(do)
        r = h.double().requires_grad_()
        want = S.swiglu_torch(r)
        want.backward(do.double())
        rel = lambda a, b: float((a.double() - b).norm() / b.norm())
        t = h.clone().requires_grad_()                   # the PyTorch form in the same dtype: what it replaces
        yt = S.swiglu_torch(t)
        yt.backward(do)
        out[f"{dt} {shape}"] = dict(dtype=str(y.dtype), gdtype=str(x.grad.dtype), shape=list(y.shape),
                                       out=rel(y, want.detach()), grad=rel(x.grad, r.grad),
                                       torch_out=rel(yt, want.detach()), torch_grad=rel(t.grad, r.grad))
# under vmap, folded as stacked training folds it: one kernel call on the K models' rows
from torch.func import vmap
from mixzoo.models import _fla
from mixzoo.train.vmapfold import folding
from mixzoo.kernels import swiglu_triton
calls = []
fwd = swiglu_triton.forward
swiglu_triton.forward = lambda h: calls.append(tuple(h.shape)) or fwd(h)
h = torch.randn(3, 2, 5, 2 * 6, generator=g, dtype=torch.float64).float().requires_grad_()
with folding():
    op = _fla._op("mixzoo.kernels.swiglu", "swiglu")
    y = vmap(op)(h)
(gh,) = torch.autograd.grad(y.square().sum(), h)
hr = h.detach().double().requires_grad_()
want = torch.stack([S.swiglu_torch(t) for t in hr])
(wg,) = torch.autograd.grad(want.square().sum(), hr)
out["vmap"] = dict(calls=calls, out=float((y.double() - want).abs().max()), grad=float((gh.double() - wg).abs().max()))
print("RESULT", json.dumps(out))
"""


def _run(extra_env: dict | None = None) -> dict:
    return run_interpreted(SCRIPT, extra_env, drop=("MIXZOO_SWIGLU",))


def test_kernels_give_the_pytorch_form_in_the_interpreter():
    r = _run()
    assert r["usable"] is True
    for case, res in r.items():
        if case in ("usable", "vmap"):
            continue
        dt = case.split()[0]
        assert res["dtype"] == res["gdtype"] == f"torch.{dt}", (case, res)
        tol = 1e-6 if dt == "float32" else 8e-3           # one bf16 rounding (2^-9 relative) of each element
        assert res["out"] < tol and res["grad"] < tol, (case, res)
        assert res["out"] <= 1.1 * res["torch_out"] + 1e-7 and res["grad"] <= 1.1 * res["torch_grad"] + 1e-7, (case, res)
    v = r["vmap"]
    assert v["calls"] == [[6, 5, 12]], v                   # 3 models x 2 sequences: one call
    assert v["out"] < 1e-5 and v["grad"] < 1e-5, v


def test_mixzoo_swiglu_torch_asks_for_the_pytorch_form():
    r = _run({"MIXZOO_SWIGLU": "torch"})
    assert r["vmap"]["calls"] == []


def test_off_the_gpu_the_pytorch_form_runs_unchanged():
    """Without CUDA (and without the interpreter) ``swiglu`` is ``swiglu_torch`` itself: the MLP's
    numbers on the CPU are bitwise those of chunk, silu and product."""
    from mixzoo.kernels.swiglu import swiglu, swiglu_torch
    from mixzoo.models.backbones import MLP
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    h = torch.randn(4, 3, 2 * 9)
    assert torch.equal(swiglu(h), swiglu_torch(h))
    m = MLP(16, "swiglu", 4.0)
    x = torch.randn(2, 3, 16)
    a, b = m.fc1(x).chunk(2, dim=-1)
    assert torch.equal(m(x), m.fc2(torch.nn.functional.silu(a) * b))


def test_the_mad_recipe_s_swiglu_is_mad_s_width():
    # MAD's GLU (mad/model/layers/mlp.py): int(2 * dim * 4 / 3) rounded up to a multiple of 16
    from mixzoo.models import build_model
    from mixzoo.models.backbones import RECIPES, ModelConfig, mlp_hidden
    assert [mlp_hidden(d, "swiglu", 4.0) for d in (128, 64, 96, 256)] == [352, 176, 256, 688]
    assert mlp_hidden(128, "gelu", 4.0) == 512
    cfg = ModelConfig(**{**RECIPES["mad"], "n_layers": 1})
    m = build_model("lm", "softmax", {}, cfg, vocab=16)
    mlp = next(mod for mod in m.modules() if type(mod).__name__ == "MLP")
    assert tuple(mlp.fc1.weight.shape) == (2 * 352, 128) and tuple(mlp.fc2.weight.shape) == (128, 352)

