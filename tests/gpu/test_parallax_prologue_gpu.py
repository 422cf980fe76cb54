"""mixzoo.kernels.parallax_prologue on the GPU: the kernels against float64 beside the composition in bf16 at MAD's
shape, and the Parallax layer with them against its separate ops (bf16 autocast), with the kernel that ran named."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("B,T,rope_r", [(128, 1024, True), (128, 128, True), (64, 256, False)])
def test_prologue_against_float64_and_the_composition(B, T, rope_r, monkeypatch):
    from mixzoo.kernels import parallax_prologue as P
    assert P.usable(0)
    H, D = 16, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, T, 3 * H * D, device="cuda", generator=g).bfloat16()
    rr = (torch.randn(B, T, H * D, device="cuda", generator=g) * 2).bfloat16()
    w = 1 + 0.3 * torch.randn(D, device="cuda", generator=g)
    gs = [torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16() for _ in range(4)]
    n = 8                                                    # float64 on the first sequences
    ins64 = [t.double().requires_grad_() for t in (qkv[:n], rr[:n], w)]
    want = P.prologue_torch(*ins64[:2], ins64[2], H, 1e-6, True, rope_r)
    wants = torch.autograd.grad(want, ins64, [x[:n].double() for x in gs])
    errs = {}
    for sw in ("fused", "torch"):
        monkeypatch.setenv("MIXZOO_PARALLAX_PROLOGUE", sw)
        ins = [t.clone().requires_grad_() for t in (qkv, rr, w)]
        got = P.prologue(ins[0], ins[1], ins[2], H, 1e-6, True, rope_r)
        grads = torch.autograd.grad(got, ins, gs)
        errs[sw] = [_rel(a[:n], b) for a, b in zip(got, want)] + [_rel(grads[0][:n], wants[0]),
                                                                   _rel(grads[1][:n], wants[1])]
        assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in got)
    print(f"\nprologue B={B} T={T} rope_r={rope_r}: against float64 (q, k, v, r, dqkv, drr) kernels "
          f"{max(errs['fused']):.2e}, composition {max(errs['torch']):.2e}")
    assert all(a <= 1.1 * b + 1e-6 for a, b in zip(errs["fused"], errs["torch"])), errs


def test_parallax_layer_with_the_prologue(monkeypatch):
    from mixzoo import kernels
    monkeypatch.setenv("MIXZOO_FLA_PAD", "none")
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    torch.manual_seed(0)
    m = build_mixer(get_mixer("parallax"), 128, num_heads=16, layer_idx=0, l_max=512).cuda()
    x = torch.randn(8, 512, 128, device="cuda")
    res = {}
    for sw in ("fused", "torch"):
        monkeypatch.setenv("MIXZOO_PARALLAX_PROLOGUE", sw)
        kernels.reset()
        m.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        res[sw] = ("parallax_prologue" in kernels.RAN, m.backend, [y.detach().float(), xi.grad.float()]
                   + [p.grad.float().clone() for p in m.parameters() if p.grad is not None])
    assert (res["fused"][0], res["torch"][0]) == (True, False)
    assert res["fused"][1] == res["torch"][1] == "fla-parallel+tiles+unpadded"
    errs = [_rel(a, b) for a, b in zip(res["fused"][2], res["torch"][2])]
    print(f"\nparallax layer, prologue kernels against the separate ops: output {errs[0]:.2e}, gradients max "
          f"{max(errs[1:]):.2e}")
    assert len(errs) >= 5 and max(errs) < 1e-2, errs
