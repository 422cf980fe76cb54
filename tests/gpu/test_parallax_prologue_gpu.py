"""mixzoo.kernels.parallax_prologue on the GPU: the kernels against float64 beside the composition in bf16 at MAD's
shape, and the Parallax layer with them against its separate ops (bf16 autocast), with the kernel that ran named. The
same for the kernels without r (``qkv_prologue``) and the softmax layer, which also folds them when stacked; and their
forward+backward timed against the two rotation kernels and the chunks' concatenation they replace, printed."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def _layer_each_way(m, x, var: str, monkeypatch) -> dict:
    """The layer's forward and backward (bf16 autocast) with the switch ``var`` at fused and at torch: per value, the
    kernels that ran, the layer's backend, and its output and gradients (input, parameters) in float32."""
    from mixzoo import kernels
    res = {}
    for sw in ("fused", "torch"):
        monkeypatch.setenv(var, sw)
        kernels.reset()
        m.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        res[sw] = (set(kernels.RAN), m.backend, [y.detach().float(), xi.grad.float()]
                   + [p.grad.float().clone() for p in m.parameters() if p.grad is not None])
    return res


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
    monkeypatch.setenv("MIXZOO_FLA_PAD", "none")
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    torch.manual_seed(0)
    m = build_mixer(get_mixer("parallax"), 128, num_heads=16, layer_idx=0, l_max=512).cuda()
    x = torch.randn(8, 512, 128, device="cuda")
    res = _layer_each_way(m, x, "MIXZOO_PARALLAX_PROLOGUE", monkeypatch)
    assert ("parallax_prologue" in res["fused"][0], "parallax_prologue" in res["torch"][0]) == (True, False)
    assert res["fused"][1] == res["torch"][1] == "fla-parallel+tiles+unpadded"
    errs = [_rel(a, b) for a, b in zip(res["fused"][2], res["torch"][2])]
    print(f"\nparallax layer, prologue kernels against the separate ops: output {errs[0]:.2e}, gradients max "
          f"{max(errs[1:]):.2e}")
    assert len(errs) >= 5 and max(errs) < 1e-2, errs


@pytest.mark.parametrize("B,T", [(128, 1024), (128, 128)])
def test_qkv_prologue_against_float64_and_the_composition(B, T, monkeypatch):
    from mixzoo.kernels import parallax_prologue as P
    assert P.usable(0)
    H, D = 16, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, T, 3 * H * D, device="cuda", generator=g).bfloat16()
    gs = [torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16() for _ in range(3)]
    n = 8                                                    # float64 on the first sequences
    x64 = qkv[:n].double().requires_grad_()
    want = P.qkv_prologue_torch(x64, H)
    (want_d,) = torch.autograd.grad(want, x64, [x[:n].double() for x in gs])
    errs = {}
    for sw in ("fused", "torch"):
        monkeypatch.setenv("MIXZOO_QKV_PROLOGUE", sw)
        x = qkv.clone().requires_grad_()
        got = P.qkv_prologue(x, H)
        (d,) = torch.autograd.grad(got, x, gs)
        errs[sw] = [_rel(a[:n], b.detach()) for a, b in zip(got, want)] + [_rel(d[:n], want_d)]
        assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in (*got, d))
    print(f"\nqkv prologue B={B} T={T}: against float64 (q, k, v, dqkv) kernels {max(errs['fused']):.2e}, "
          f"composition {max(errs['torch']):.2e}")
    assert all(a <= 1.1 * b + 1e-6 for a, b in zip(errs["fused"], errs["torch"])), errs


def test_softmax_layer_with_the_qkv_prologue_and_stacked(monkeypatch):
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.kernels import parallax_prologue_triton as PT
    from mixzoo.models.softmax import SoftmaxAttention
    from mixzoo.train.vmapfold import folding
    torch.manual_seed(0)
    m = SoftmaxAttention(128, num_heads=16).cuda()
    x = torch.randn(8, 512, 128, device="cuda")
    res = _layer_each_way(m, x, "MIXZOO_QKV_PROLOGUE", monkeypatch)
    assert (res["fused"][0] & {"qkv_prologue", "rope"}, res["torch"][0] & {"qkv_prologue", "rope"}) == (
        {"qkv_prologue"}, {"rope"})
    assert res["fused"][1] == res["torch"][1] == "triton-attn"
    errs = [_rel(a, b) for a, b in zip(res["fused"][2], res["torch"][2])]
    print(f"\nsoftmax layer, qkv prologue against the rotation kernels: output {errs[0]:.2e}, gradients max "
          f"{max(errs[1:]):.2e}")
    assert len(errs) == 4 and max(errs) < 1e-3, errs
    # 4 stacked layers: one prologue call (4 groups of 8 x 128 tokens) each way, each layer's numbers
    monkeypatch.setenv("MIXZOO_QKV_PROLOGUE", "fused")
    calls = []
    fwd = PT.forward
    monkeypatch.setattr(PT, "forward", lambda qkv, *a, **k: calls.append(tuple(qkv.shape)) or fwd(qkv, *a, **k))
    ms = [SoftmaxAttention(128, num_heads=16).cuda() for _ in range(4)]
    xs = torch.randn(4, 8, 128, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = torch.stack([mi(xi) for mi, xi in zip(ms, xs)])
        calls.clear()
        params, bufs = stack_module_state(ms)
        with folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, xs)
    assert calls == [(4, 8 * 128, 3 * 128)], calls
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-3)


def _qkv_times(layer, B: int, T: int, monkeypatch) -> dict:
    from test_fused_kernels_gpu import _timed

    from mixzoo.models.common import qkv_heads
    H = layer.h
    C = layer.qkv.in_features
    qkv = torch.randn(B, T, 3 * C, device="cuda").bfloat16().requires_grad_()
    gs = [torch.randn(B, T, H, C // H, device="cuda").bfloat16().transpose(1, 2) for _ in range(3)]
    x = torch.randn(B, T, C, device="cuda").requires_grad_()

    def layer_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)
        torch.autograd.grad(y.float().square().mean(), [x, *layer.parameters()])
    t = {}
    for sw in ("fused", "torch"):
        monkeypatch.setenv("MIXZOO_QKV_PROLOGUE", sw)
        t[sw] = _timed(lambda: torch.autograd.grad(qkv_heads(qkv, H, True), qkv, gs))
        t["layer " + sw] = _timed(layer_step)
    return t


def test_qkv_prologue_timed_against_the_rotation_kernels(monkeypatch):
    """Forward+backward of q, k, v from qkv (bf16, 16 heads of 8; the gradients as the attention kernels give them,
    (B, T, H, D) in memory), graphed: the prologue, and the split views, two rotation kernels and the chunks'
    concatenation; then the whole softmax layer each way (its attention reads q and k in either layout)."""
    from mixzoo.models.softmax import SoftmaxAttention
    torch.manual_seed(0)
    layer = SoftmaxAttention(128, num_heads=16).cuda()
    lines = []
    for B, T in ((128, 128), (128, 1024)):
        t = _qkv_times(layer, B, T, monkeypatch)
        lines.append(f"B={B} T={T}: prologue {t['fused']:.3f} ms, rotation kernels + concatenation {t['torch']:.3f} ms "
                     f"({t['torch'] / t['fused']:.2f}x); softmax layer {t['layer fused']:.3f} ms against "
                     f"{t['layer torch']:.3f} ms ({t['layer torch'] / t['layer fused']:.2f}x)")
        assert t["fused"] <= 1.05 * t["torch"], lines[-1]
    print("\nqkv prologue, forward+backward, graphed:\n" + "\n".join(lines))
