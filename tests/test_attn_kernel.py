"""mixzoo.kernels.attn: causal softmax attention for heads of at most 16 dims as Triton kernels, on the CPU in
Triton's interpreter with the H200's numerics (a fresh process, the interpreter on before triton is imported):
against float64 with gradients, from a projection's strided views, at partial tiles and at several tilings; the
``softmax`` mechanism taking it under its switch; folded under vmap. Off the GPU (no interpreter) SDPA runs."""
import os

import pytest
import torch
from interp import run_interpreted

SCRIPT = r"""
from mixzoo.kernels import attn as A
g = torch.Generator().manual_seed(0)
rel = lambda a, b: float((a.double() - b).norm() / b.norm().clamp_min(1e-30))
out = {"usable": A.usable(-1), "cases": {}}
small = {"fwd": (32, 16, 4, 2), "dkdv": (16, 32, 4, 2), "dq": (32, 16, 4, 2)}
square = {"fwd": (16, 16, 4, 2), "dkdv": (16, 16, 4, 2), "dq": (16, 16, 4, 2)}
for B, H, T, D, dt, tiles in ((2, 3, 37, 8, "bfloat16", None), (1, 2, 150, 5, "float16", small),
                              (1, 2, 97, 16, "bfloat16", square), (2, 1, 64, 8, "bfloat16", small),
                              (1, 1, 1, 8, "bfloat16", None), (1, 2, 150, 8, "bfloat16", A.TILES)):
    qkv = torch.randn(B, T, 3 * H * D, generator=g).to(getattr(torch, dt))
    q, k, v = (t.unflatten(-1, (H, D)).transpose(1, 2) for t in qkv.chunk(3, -1))     # strided views
    do = torch.randn(B, H, T, D, generator=g).to(q.dtype)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = A.attention_torch(*ref)
    wg = torch.autograd.grad(want, ref, do.double())
    gi = [t.detach().requires_grad_() for t in (q, k, v)]
    got = A.attention(*gi, tiles=tiles)
    gg = torch.autograd.grad(got, gi, do)
    # the same in the input dtype by the PyTorch reference (float32 inside), for scale
    ti = [t.detach().requires_grad_() for t in (q, k, v)]
    tg = torch.autograd.grad(A.attention_torch(*ti), ti, do)
    out["cases"][f"{(B, H, T, D, dt)}"] = dict(
        dtype=str(got.dtype), shape=list(got.shape), heads_merge_is_view=got.transpose(1, 2).is_contiguous(),
        out=rel(got, want.detach()), grads=[rel(a, b) for a, b in zip(gg, wg)],
        torch_grads=[rel(a, b) for a, b in zip(tg, wg)], zero_dq_first=float(gg[0][:, :, 0].abs().max()))
try:
    A.attention(q, k, v, tiles={"fwd": (48, 32, 4, 2)})
    out["bad_tiles"] = None
except ValueError as e:
    out["bad_tiles"] = str(e)

# the mechanism: MIXZOO_ATTN=triton takes the kernels, sdpa the SDPA path; same numbers to bf16's level
from mixzoo.models.softmax import SoftmaxAttention
torch.manual_seed(0)
layer = SoftmaxAttention(48, num_heads=6).to(torch.bfloat16)
x = torch.randn(2, 40, 48, generator=g).to(torch.bfloat16)
res = {}
for sw in ("triton", "sdpa"):
    os.environ["MIXZOO_ATTN"] = sw
    layer.zero_grad()
    xx = x.clone().requires_grad_()
    y = layer(xx)
    y.float().square().sum().backward()
    res[sw] = (layer.backend, y.detach(), xx.grad, layer.qkv.weight.grad.clone())
os.environ.pop("MIXZOO_ATTN")
t, s = res["triton"], res["sdpa"]
out["layer"] = dict(backends=[t[0], s[0]], out=rel(t[1], s[1].double()), dx=rel(t[2], s[2].double()),
                    dw=rel(t[3], s[3].double()))

# folded under vmap: K = 3 models' calls are one call of K*B sequences
from torch.func import vmap
from mixzoo.models import _fla
from mixzoo.train.vmapfold import folding
from mixzoo.kernels import attn_triton
calls = []
orig = A._launch_fwd
A._launch_fwd = lambda q, *a: calls.append(list(q.shape)) or orig(q, *a)
os.environ["MIXZOO_ATTN"] = "triton"
qs, ks, vs = (torch.randn(3, 2, 2, 20, 8, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(3))
f = lambda q, k, v: _fla._op("mixzoo.kernels.attn", "attention")(q, k, v)
with folding():
    y = vmap(f)(qs, ks, vs)
gv = torch.autograd.grad(y.float().square().sum(), (qs, ks, vs))
A._launch_fwd = orig
ys = torch.stack([A.attention(a, b, c) for a, b, c in zip(qs, ks, vs)])
wv = torch.autograd.grad(ys.float().square().sum(), (qs, ks, vs))
out["vmap"] = dict(calls=calls, out=float((y.float() - ys.float()).abs().max()),
                   grad=max(float((a.float() - b.float()).abs().max()) for a, b in zip(gv, wv)))
print("RESULT", json.dumps(out))
"""


def test_attention_kernels_against_float64_the_mechanism_and_folded():
    r = run_interpreted(SCRIPT, drop=("MIXZOO_ATTN", "MIXZOO_SDPA"))
    assert r["usable"] is True
    for case, c in r["cases"].items():
        assert c["dtype"] in ("torch.bfloat16", "torch.float16") and c["heads_merge_is_view"], (case, c)
        if case.startswith("(1, 1, 1,"):           # one position: o = v, no gradient reaches q or k
            assert c["out"] < 5e-3 and c["zero_dq_first"] == 0.0, c
            continue
        tol = 5e-3 if "bfloat16" in case else 1e-3
        assert c["out"] < tol, (case, c)
        # bf16 probabilities and score gradients in the products, as FlashAttention: within 2x of the
        # PyTorch reference computed in float32 and rounded to the input dtype
        assert all(e < 2 * tol for e in c["grads"]), (case, c)
        assert all(e < 2 * max(t, 1e-3) for e, t in zip(c["grads"], c["torch_grads"])), (case, c)
        assert c["zero_dq_first"] == 0.0, c          # the first query sees one key: dq = 0
    assert r["bad_tiles"] and "multiple" in r["bad_tiles"], r["bad_tiles"]
    ly = r["layer"]
    assert ly["backends"] == ["triton-attn", "sdpa"], ly
    assert ly["out"] < 1e-2 and ly["dx"] < 2e-2 and ly["dw"] < 2e-2, ly
    v = r["vmap"]
    assert v["calls"] == [[6, 2, 20, 8]], v              # 3 models x 2 sequences, one call
    assert v["out"] == 0.0 and v["grad"] == 0.0, v       # the same kernel on the same rows


def test_off_the_gpu_sdpa_runs():
    from mixzoo.kernels import attn
    from mixzoo.models.softmax import SoftmaxAttention
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    q = torch.randn(2, 3, 7, 8, dtype=torch.bfloat16)
    assert not attn.runs_on(q)
    layer = SoftmaxAttention(16, num_heads=2)
    layer(torch.randn(1, 5, 16))
    assert layer.backend == "sdpa"


def test_attention_switch_is_checked_at_the_edge(monkeypatch):
    from mixzoo import kernels
    monkeypatch.setenv("MIXZOO_ATTN", "cudnn")
    assert "MIXZOO_ATTN" in kernels.switch_error()
    monkeypatch.setenv("MIXZOO_ATTN", "triton")
    assert kernels.switch_error() is None


def test_tiles_by_length_and_the_old_set(monkeypatch):
    from mixzoo.kernels import attn
    monkeypatch.delenv("MIXZOO_ATTN_TILES", raising=False)
    assert attn.default_tiles(128) == attn.default_tiles(511) == attn.SHORT_TILES
    assert attn.default_tiles(512) == attn.default_tiles(4096) == attn.TILES
    for T in (128, 1024):                     # every default set keeps the loops' causal split
        assert attn._tiles(None, T) == attn.default_tiles(T)
    monkeypatch.setenv("MIXZOO_ATTN_TILES", "old")
    assert attn.default_tiles(128) == attn.default_tiles(1024) == attn.OLD_TILES
    assert attn._tiles({"dq": (64, 32, 4, 1)}, 1024)["dq"] == (64, 32, 4, 1)
    from mixzoo import kernels
    monkeypatch.setenv("MIXZOO_ATTN_TILES", "fast")
    assert "MIXZOO_ATTN_TILES" in kernels.switch_error()
