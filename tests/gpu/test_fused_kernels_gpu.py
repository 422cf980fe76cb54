"""mixzoo's fused kernels of the backbone on the GPU, the default there: the SwiGLU gate
(``mixzoo.kernels.swiglu``; ``MIXZOO_SWIGLU=torch`` asks for the PyTorch form) and RMS norm with its
weight (``mixzoo.kernels.rmsnorm``; ``MIXZOO_RMSNORM=torch``). For each: the self-check that enables it
passes, it gives the PyTorch form's numbers at the mad recipe's widths (no less accurate against
float64), the model's module takes it, stacked training folds it into one call for K models, and both
forms are timed side by side at MAD's baseline shape (128 x 128 tokens), printed."""
from __future__ import annotations

import pytest
import torch
from layer_check import timed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def test_kernels_match_the_pytorch_form_here():
    from mixzoo.kernels import swiglu as S
    assert S.usable(torch.cuda.current_device())
    g = torch.Generator(device="cuda").manual_seed(0)
    h = (torch.randn(128, 128, 2 * 352, device="cuda", generator=g) * 2).bfloat16()
    do = torch.randn(128, 128, 352, device="cuda", generator=g).bfloat16()
    errs = {}
    r = h.double().requires_grad_()
    want = S.swiglu_torch(r)
    want.backward(do.double())
    for name, fn in (("kernel", S.swiglu), ("torch", S.swiglu_torch)):
        x = h.clone().requires_grad_()
        y = fn(x)
        y.backward(do)
        assert y.dtype == x.grad.dtype == torch.bfloat16
        errs[name] = (_rel(y, want.detach()), _rel(x.grad, r.grad))
    print(f"\nswiglu bf16 against float64, output / gradient: kernel {errs['kernel'][0]:.2e} / {errs['kernel'][1]:.2e}, "
          f"PyTorch form {errs['torch'][0]:.2e} / {errs['torch'][1]:.2e}")
    for k in (0, 1):
        assert errs["kernel"][k] <= 1.1 * errs["torch"][k] + 1e-6


def test_the_mlp_takes_the_kernels_and_stacking_folds_them(monkeypatch):
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.kernels import swiglu_triton
    from mixzoo.kernels.swiglu import usable
    from mixzoo.models.backbones import MLP
    from mixzoo.train.vmapfold import folding
    assert usable(torch.cuda.current_device())      # its self-check runs the kernels too: before the spy
    calls = []
    fwd = swiglu_triton.forward
    monkeypatch.setattr(swiglu_triton, "forward", lambda h: calls.append(tuple(h.shape)) or fwd(h))
    torch.manual_seed(0)
    ms = [MLP(128, "swiglu", 4.0).cuda() for _ in range(4)]
    x = torch.randn(4, 8, 128, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
        assert calls == [(8, 128, 704)] * 4
        calls.clear()
        params, bufs = stack_module_state(ms)
        with folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
    assert calls == [(32, 128, 704)]
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-3)


def test_fused_and_pytorch_forms_timed_side_by_side():
    from mixzoo.kernels import swiglu as S
    h = torch.randn(128, 128, 2 * 352, device="cuda").bfloat16().requires_grad_()
    do = torch.randn(128, 128, 352, device="cuda").bfloat16()
    best = {name: timed(lambda fn=fn: fn(h).backward(do)) for name, fn in (("torch", S.swiglu_torch),
                                                                            ("kernel", S.swiglu))}
    print(f"\nswiglu forward+backward at 128 x 128 x 2*352 bf16: PyTorch form {best['torch']:.3f} ms, "
          f"kernels {best['kernel']:.3f} ms ({best['torch'] / best['kernel']:.2f}x)")
    assert best["kernel"] <= 1.05 * best["torch"]


def test_rms_norm_kernels_match_the_pytorch_form_here():
    import torch.nn.functional as F

    from mixzoo.kernels import rmsnorm as N
    assert N.usable(torch.cuda.current_device())
    g = torch.Generator(device="cuda").manual_seed(0)
    for dt, D in ((torch.float32, 128), (torch.bfloat16, 8), (torch.float32, 256)):
        x = (torch.randn(128 * 128, D, device="cuda", generator=g) * 2).to(dt)
        w = 1 + 0.3 * torch.randn(D, device="cuda", generator=g)
        dy = torch.randn(128 * 128, D, device="cuda", generator=g)
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        want = F.rms_norm(xr, (D,), wr, 1e-6)
        want.backward(dy.double())
        errs = {}
        for name, fn in (("kernel", N.rms_norm), ("torch", N.rms_norm_torch)):
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = fn(xx, ww, 1e-6)
            y.backward(dy)
            errs[name] = [_rel(y, want.detach()), _rel(xx.grad, xr.grad), _rel(ww.grad, wr.grad)]
        print(f"\nrms_norm {dt} D={D} against float64, out / dx / dw: kernel "
              + " / ".join(f"{e:.1e}" for e in errs["kernel"]) + ", PyTorch form "
              + " / ".join(f"{e:.1e}" for e in errs["torch"]))
        for a, b in zip(errs["kernel"], errs["torch"]):
            assert a <= max(2 * b, 1e-6)


def test_the_norms_take_the_kernels_and_stacking_folds_them(monkeypatch):
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.kernels import rmsnorm_triton
    from mixzoo.kernels.rmsnorm import usable
    from mixzoo.models._parts import GatedNorm
    from mixzoo.models.common import RMSNorm
    from mixzoo.train.vmapfold import folding
    assert usable(torch.cuda.current_device())      # its self-check runs the kernels too: before the spy
    calls = []
    fwd = rmsnorm_triton.forward
    monkeypatch.setattr(rmsnorm_triton, "forward", lambda x, *a, **k: calls.append(tuple(x.shape)) or fwd(x, *a, **k))
    torch.manual_seed(0)
    for make, args, one, folded in (
            (lambda: RMSNorm(128), (torch.randn(4, 8, 128, 128, device="cuda"),), (1, 1024, 128), (4, 1024, 128)),
            (lambda: GatedNorm(8), (torch.randn(4, 8, 16, 128, 8, device="cuda").bfloat16(),
                                    torch.randn(4, 8, 128, 128, device="cuda").bfloat16()), (1, 16384, 8), (4, 16384, 8))):
        ms = [make().cuda() for _ in range(4)]
        for m in ms:
            torch.nn.init.normal_(m.weight, 1.0, 0.2)
        calls.clear()
        ref = torch.stack([m(*(a[k] for a in args)) for k, m in enumerate(ms)])
        assert calls == [one] * 4
        calls.clear()
        params, bufs = stack_module_state(ms)
        with folding():
            y = vmap(lambda p, b, *a, m=ms[0]: functional_call(m, (p, b), a))(params, bufs, *args)
        assert calls == [folded]
        torch.testing.assert_close(y.float(), ref.float(), rtol=1e-5, atol=1e-5)


def test_gate_after_the_norm_matches_and_istimed(monkeypatch):
    """The gated output norm of gdn, GLA and MesaNet (``GatedNorm``: the norm of each head, then times silu of the
    gate) at the mad recipe's 16 heads of 8 (6 x 128 sequences of 1024, bf16, the gate a split view of a wider
    projection): ``rms_norm_gate``'s kernel against float64 beside the PyTorch form; then the layer forward and
    backward with the kernel and with ``MIXZOO_GATED_NORM=torch`` timed side by side."""
    from mixzoo.kernels import rmsnorm as N
    from mixzoo.models._parts import GatedNorm
    assert N.usable(torch.cuda.current_device())
    monkeypatch.setenv("MIXZOO_GATED_NORM", "fused")                 # the kernel (also the default, unset)
    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, D = 6 * 128, 1024, 16, 8
    x = (torch.randn(B, T, H, D, device="cuda", generator=g) * 2).bfloat16()
    wide = (torch.randn(B, T, 4 * H * D + H, device="cuda", generator=g) * 2).bfloat16()
    w = 1 + 0.3 * torch.randn(D, device="cuda", generator=g)
    dy = torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16()
    sub = slice(0, B // 16)                           # float64 on a sixteenth of the sequences
    xr, wr, widr = (t[sub].double().requires_grad_() if t.dim() > 1 else t.double().requires_grad_() for t in (x, w, wide))
    want = N.rms_norm_gate_torch(xr, wr, 1e-6, widr[..., 3 * H * D:4 * H * D].view(-1, T, H, D))
    want.backward(dy[sub].double())
    errs = {}
    assert N.gate_runs_on(x, wide)
    for name, fn in (("kernel", N.rms_norm_gate), ("torch", N.rms_norm_gate_torch)):
        xx, ww, wd = x[sub].clone().requires_grad_(), w.clone().requires_grad_(), wide[sub].clone().requires_grad_()
        y = fn(xx, ww, 1e-6, wd[..., 3 * H * D:4 * H * D].view(-1, T, H, D))
        y.backward(dy[sub])
        errs[name] = [_rel(y, want.detach()), _rel(xx.grad, xr.grad), _rel(ww.grad, wr.grad), _rel(wd.grad, widr.grad)]
    print("\nrms_norm_gate bf16 16 heads of 8 against float64, out / dx / dw / dz: kernel "
          + " / ".join(f"{e:.1e}" for e in errs["kernel"]) + ", PyTorch form "
          + " / ".join(f"{e:.1e}" for e in errs["torch"]))
    for a, b in zip(errs["kernel"], errs["torch"]):
        assert a <= max(1.5 * b, 1e-6)
    m = GatedNorm(D).cuda()
    o = x.transpose(1, 2).detach().requires_grad_()                        # (B, H, T, D) as the mechanisms pass it
    wd = wide.detach().requires_grad_()
    t = {}
    for sw in ("fused", "torch"):
        monkeypatch.setenv("MIXZOO_GATED_NORM", sw)
        t[sw] = timed(lambda: m(o, wd[..., 3 * H * D:4 * H * D]).backward(dy.view(B, T, H * D)), iters=10)
    print(f"GatedNorm(8) forward+backward at {B} x {T} tokens of 16 heads, ms: kernel {t['fused']:.3f}, "
          f"PyTorch form {t['torch']:.3f} ({t['torch'] / t['fused']:.2f}x)")
    assert t["fused"] < t["torch"]


def test_rms_norm_forms_timed_side_by_side(monkeypatch):
    """The backbone's norm at MAD's shape (128 x 128 tokens of 128, float32), forward and backward:
    unstacked with the kernel and with the PyTorch form (fused F.rms_norm, then the weight); 16 stacked
    models with the kernel, with F.rms_norm folded (MIXZOO_RMSNORM=torch) and with functorch's
    decomposition (MIXZOO_RMSNORM=torch MIXZOO_FOLD_RMS_NORM=0)."""
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.models.common import RMSNorm
    from mixzoo.train.vmapfold import folding
    x = torch.randn(128, 128, 128, device="cuda", requires_grad=True)
    n = RMSNorm(128).cuda()
    dy = torch.randn(128, 128, 128, device="cuda")
    ms = [RMSNorm(128).cuda() for _ in range(16)]
    params, bufs = stack_module_state(ms)
    xs = torch.randn(16, 128, 128, 128, device="cuda", requires_grad=True)
    dys = torch.randn(16, 128, 128, 128, device="cuda")

    def stacked():
        with folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, xs)
        y.backward(dys)
    t = {}
    for env in ({}, {"MIXZOO_RMSNORM": "torch"}, {"MIXZOO_RMSNORM": "torch", "MIXZOO_FOLD_RMS_NORM": "0"}):
        for k in ("MIXZOO_RMSNORM", "MIXZOO_FOLD_RMS_NORM"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        label = " ".join(f"{k}={v}" for k, v in env.items()) or "kernel"
        if "MIXZOO_FOLD_RMS_NORM" not in env:
            t[f"one model, {label}"] = timed(lambda: n(x).backward(dy))
        t[f"16 stacked, {label}"] = timed(stacked, rounds=2, iters=10)
    print("\nRMSNorm(128) forward+backward at 128 x 128 tokens, ms: " + "; ".join(f"{k} {v:.3f}" for k, v in t.items()))
    assert t["one model, kernel"] <= 1.05 * t["one model, MIXZOO_RMSNORM=torch"]
    assert t["16 stacked, kernel"] <= 1.05 * t["16 stacked, MIXZOO_RMSNORM=torch"]


def test_rope_kernel_matches_the_pytorch_form_here_and_istimed(monkeypatch):
    """q's rotary embedding at the mad recipe's layer (batch 128, 16 heads of 8, length 128) from the
    projection's strided view, bf16: against float64 beside the model's PyTorch form, then both timed
    forward+backward side by side."""
    from mixzoo.kernels import rope as R
    from mixzoo.models.common import rope
    assert R.usable(torch.cuda.current_device())
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(128, 128, 3 * 128, device="cuda", generator=g).bfloat16()
    x = qkv[..., :128].unflatten(-1, (16, 8)).transpose(1, 2)
    dy = torch.randn(128, 16, 128, 8, device="cuda", generator=g).bfloat16()
    xr = x.double().requires_grad_()
    want = R.rope_torch(xr)
    want.backward(dy.double())
    errs, t = {}, {}
    for name, env in (("kernel", None), ("torch", "torch")):
        if env:
            monkeypatch.setenv("MIXZOO_ROPE", env)
        xx = x.detach().clone().requires_grad_()
        y = rope(xx)
        y.backward(dy)
        errs[name] = (_rel(y, want.detach()), _rel(xx.grad, xr.grad))
        xt = x.detach().requires_grad_()
        t[name] = timed(lambda xt=xt: rope(xt).backward(dy))
    monkeypatch.delenv("MIXZOO_ROPE", raising=False)
    print(f"\nrope bf16 (128, 16, 128, 8) against float64, out / dx: kernel {errs['kernel'][0]:.2e} / "
          f"{errs['kernel'][1]:.2e}, PyTorch form {errs['torch'][0]:.2e} / {errs['torch'][1]:.2e}; forward+backward "
          f"kernel {t['kernel']:.3f} ms, PyTorch form {t['torch']:.3f} ms")
    for k in (0, 1):
        assert errs["kernel"][k] <= 1.1 * errs["torch"][k] + 1e-6
    assert t["kernel"] <= 1.05 * t["torch"]


def test_a_stacked_softmax_layer_folds_the_rope_kernel(monkeypatch):
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.kernels import rope_triton
    from mixzoo.kernels.rope import usable
    from mixzoo.models.softmax import SoftmaxAttention
    from mixzoo.train.vmapfold import folding
    assert usable(torch.cuda.current_device())
    monkeypatch.setenv("MIXZOO_QKV_PROLOGUE", "torch")     # q and k by the rotation kernel (the prologue: its own test)
    calls = []
    rot = rope_triton.rotate
    monkeypatch.setattr(rope_triton, "rotate", lambda x, *a, **k: calls.append(tuple(x.shape)) or rot(x, *a, **k))
    torch.manual_seed(0)
    ms = [SoftmaxAttention(128, num_heads=16).cuda() for _ in range(4)]
    x = torch.randn(4, 8, 128, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
        assert calls == [(8, 16, 128, 8)] * 8                   # q and k of each model
        calls.clear()
        params, bufs = stack_module_state(ms)
        with folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
    assert calls == [(32, 16, 128, 8)] * 2
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-3)


def test_short_convolution_kernels_match_fold_and_aretimed(monkeypatch):
    """gdn's ConvAct at the mad recipe (128 x 128 tokens, 3 x 128 channels, width 4) under bf16
    autocast: the kernels against float64 beside the PyTorch form; 4 stacked models as one call; both
    forms timed forward+backward, one model and 16 stacked (where PyTorch's depthwise weight gradient
    was slow), printed."""
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.kernels import causal_conv as C
    from mixzoo.kernels import causal_conv_triton
    from mixzoo.models._parts import ConvAct
    from mixzoo.train.vmapfold import folding
    assert C.usable(torch.cuda.current_device())
    torch.manual_seed(0)
    m = ConvAct(384, 4).cuda()
    conv = m.conv.conv
    x = torch.randn(128, 128, 384, device="cuda")
    dy = torch.randn(128, 128, 384, device="cuda")
    ins = [x.double().requires_grad_(), conv.weight.detach().double().squeeze(1).requires_grad_(),
           conv.bias.detach().double().requires_grad_()]
    want = C.causal_conv_torch(*ins, True)
    wants = torch.autograd.grad(want, ins, dy.double())
    errs, t = {}, {}
    for form, env in (("kernel", None), ("torch", "torch")):
        if env:
            monkeypatch.setenv("MIXZOO_CONV", env)
        xx = x.clone().requires_grad_()
        m.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xx)
        y.float().backward(dy)
        errs[form] = [_rel(y, want.detach()), _rel(xx.grad, wants[0]), _rel(conv.weight.grad.squeeze(1), wants[1]),
                      _rel(conv.bias.grad, wants[2])]

        def one(xx=xx):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                m(xx).backward(dy.bfloat16())
        t[f"one model, {form}"] = timed(one, graph=False)
        ms = [ConvAct(384, 4).cuda() for _ in range(16)]
        params, bufs = stack_module_state(ms)
        xs = torch.randn(16, 128, 128, 384, device="cuda", requires_grad=True)
        dys = torch.randn(16, 128, 128, 384, device="cuda").bfloat16()

        def stacked(ms=ms, params=params, bufs=bufs, xs=xs, dys=dys):
            with torch.autocast("cuda", dtype=torch.bfloat16), folding():
                y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, xs)
            y.backward(dys)
        t[f"16 stacked, {form}"] = timed(stacked, iters=10, graph=False)
    monkeypatch.delenv("MIXZOO_CONV", raising=False)
    print("\nConvAct(384, 4) bf16 against float64, out / dx / dw / db: kernel "
          + " / ".join(f"{e:.1e}" for e in errs["kernel"]) + ", PyTorch form " + " / ".join(f"{e:.1e}" for e in errs["torch"])
          + "; forward+backward ms: " + "; ".join(f"{k} {v:.3f}" for k, v in t.items()))
    for a, b in zip(errs["kernel"], errs["torch"]):
        assert a <= 1.1 * b + 1e-6
    calls = []
    fwd = causal_conv_triton.forward
    monkeypatch.setattr(causal_conv_triton, "forward", lambda x, *a: calls.append(tuple(x.shape)) or fwd(x, *a))
    ms = [ConvAct(384, 4).cuda() for _ in range(4)]
    params, bufs = stack_module_state(ms)
    xs = torch.randn(4, 8, 128, 384, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = torch.stack([mm(xi) for mm, xi in zip(ms, xs)])
        calls.clear()
        with folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, xs)
    assert calls == [(4 * 8, 128, 384)]                                  # the 4 models' sequences in the batch
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-3)
    assert t["16 stacked, kernel"] <= 1.05 * t["16 stacked, torch"]      # eager: the 16-stacked call is device-bound


def test_ssd_intra_kernels_match_fold_and_aretimed(monkeypatch):
    """Mamba-2's within-chunk SSD part at the mad recipe (batch 128, length 128 in chunks of 64, 16
    heads of 16, state 64), float32 with full float32 products (``MIXZOO_SSD_DOT=ieee``; the default bf16
    form is test_ssd_bf16_products_side_by_side's): the kernels against float64 beside the PyTorch form; a
    Mamba-2 layer's forward+backward (bf16 autocast, torch-chunk) timed with both, one model and 16 stacked
    (one kernel call for all), printed."""
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.kernels import ssd_intra as S
    from mixzoo.kernels import ssd_intra_triton
    from mixzoo.registry import build_mixer, get_mixer
    from mixzoo.train.vmapfold import folding
    monkeypatch.setenv("MIXZOO_SSD_DOT", "ieee")
    monkeypatch.setenv("MIXZOO_MAMBA_SSD", "torch-chunk")      # the layer on the path whose kernel this times
    assert S.usable(torch.cuda.current_device())
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, N, C, K, V = 128, 16, 2, 64, 64, 16
    q, k = (torch.randn(B, N, C, K, device="cuda", generator=g) * K ** -0.5 for _ in range(2))
    v = torch.randn(B, H, N, C, V, device="cuda", generator=g)
    gc = (-torch.rand(B, H, N, C, device="cuda", generator=g) * 0.1).cumsum(-1)
    ks = torch.rand(B, H, N, C, device="cuda", generator=g) * 0.1
    do = torch.randn(B, H, N, C, V, device="cuda", generator=g)
    ins = [t.double().requires_grad_() for t in (q, k, v, gc, ks)]
    want = S.intra_torch(*ins)
    wants = torch.autograd.grad(want, ins, do.double())
    errs = {}
    for name, fn in (("kernel", S.intra), ("torch", S.intra_torch)):
        x = [t.clone().requires_grad_() for t in (q, k, v, gc, ks)]
        y = fn(*x)
        y.backward(do)
        errs[name] = [_rel(y, want.detach())] + [_rel(a.grad, b) for a, b in zip(x, wants)]
    t = {}
    torch.manual_seed(0)
    m = build_mixer(get_mixer("mamba"), 128, num_heads=16, layer_idx=0, l_max=128).cuda()
    xs = torch.randn(128, 128, 128, device="cuda", requires_grad=True)
    ms = [build_mixer(get_mixer("mamba"), 128, num_heads=16, layer_idx=0, l_max=128).cuda() for _ in range(16)]
    params, bufs = stack_module_state(ms)
    x16 = torch.randn(16, 128, 128, 128, device="cuda", requires_grad=True)

    def one():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xs)
        y.float().square().mean().backward()

    def stacked():
        with torch.autocast("cuda", dtype=torch.bfloat16), folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x16)
        y.float().square().mean().backward()
    for name, env in (("kernel", None), ("torch", "torch")):
        if env:
            monkeypatch.setenv("MIXZOO_SSD", env)
        t[f"one layer, {name}"] = timed(one, graph=False)
        t[f"16 stacked, {name}"] = timed(stacked, iters=5, graph=False)
    monkeypatch.delenv("MIXZOO_SSD", raising=False)
    assert m.backend == "torch-chunk"
    print("\nssd intra float32 against float64, out / dq / dk / dv / dg / dks: kernel "
          + " / ".join(f"{e:.1e}" for e in errs["kernel"]) + ", PyTorch form " + " / ".join(f"{e:.1e}" for e in errs["torch"])
          + "; Mamba-2 layer forward+backward ms: " + "; ".join(f"{k_} {v_:.3f}" for k_, v_ in t.items()))
    for a, b in zip(errs["kernel"], errs["torch"]):
        assert a <= max(4 * b, 1e-5)
    calls = []
    fwd = ssd_intra_triton.forward
    monkeypatch.setattr(ssd_intra_triton, "forward", lambda *a: calls.append(tuple(a[2].shape)) or fwd(*a))
    stacked()
    assert calls == [(16 * 128, 16, 2, 64, 16)]
    assert t["16 stacked, kernel"] <= 1.05 * t["16 stacked, torch"]      # eager: the 16-stacked call is device-bound


SSD_BF16_CHECK = r"""
import json
from mixzoo.kernels import ssd_intra as S
print("RESULT", json.dumps({f: [e for _, e in S.errors_here(0, f)] for f in ("bf16", "ieee")}), flush=True)
"""

SSD_BF16_TIMES = r"""
import json, os, sys
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "gpu"))
from layer_check import timed
from mixzoo.registry import build_mixer, get_mixer, load_builtins
load_builtins()
out = {}
torch.manual_seed(0)
m = build_mixer(get_mixer("mamba"), 128, num_heads=16, layer_idx=0, l_max=1024).cuda()
for L in (128, 1024):
    xs = torch.randn(128, L, 128, device="cuda", requires_grad=True)
    def one():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xs)
        y.float().square().mean().backward()
    for f in ("ieee", "bf16", "ieee"):
        os.environ["MIXZOO_SSD_DOT"] = f
        out[f"L{L} {f}"] = min(out.get(f"L{L} {f}", float("inf")), timed(one, graph=False, iters=20))
print("RESULT", json.dumps(out), flush=True)
"""


def test_ssd_bf16_products_side_by_side():
    """MIXZOO_SSD_DOT=bf16 (the default) on the device: the self-check's cases against float64 in a process of its own with
    CUDA_LAUNCH_BLOCKING=1 (a fault poisons only that process, and is named), within bfloat16's tolerance; then,
    in another process, a Mamba-2 layer's forward+backward at the mad recipe, batch 128, lengths 128 and 1024,
    timed with each form in turn (ieee, bf16, ieee), printed."""
    import json
    import os
    import subprocess
    import sys

    def run(script, env):
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                           env={**os.environ, **env})
        assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-4000:])
        return json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
    errs = run(SSD_BF16_CHECK, {"CUDA_LAUNCH_BLOCKING": "1"})
    times = run(SSD_BF16_TIMES, {"MIXZOO_MAMBA_SSD": "torch-chunk"})
    print("\nssd products, errors against float64 (o, dq, dk, dv, dg, dks) per case: ieee " + json.dumps(errs["ieee"])
          + ", bf16 " + json.dumps(errs["bf16"]) + "; Mamba-2 layer forward+backward ms: "
          + "; ".join(f"{k} {v:.3f}" for k, v in times.items()))
    assert max(max(e) for e in errs["ieee"]) < 1e-5, errs
    assert max(max(e) for e in errs["bf16"]) < 2e-2, errs


def test_residual_add_and_norm_match_and_aretimed(monkeypatch):
    """``add_rms_norm`` (a block's residual add and the next norm in one kernel each way) at MAD's shape against
    float64 beside the PyTorch form, and a whole pre-norm step of it (float32 stream, bf16 branch output, its
    gradient from the stream and from the norm) timed against the add then the norm's kernel
    (``MIXZOO_FUSE_ADD=0``), one model and 6 stacked."""
    import torch.nn.functional as F
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.kernels import rmsnorm as N
    from mixzoo.models.common import RMSNorm
    from mixzoo.train.vmapfold import folding
    assert N.usable(torch.cuda.current_device())
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(128 * 128, 128, device="cuda", generator=g)
    r = torch.randn(128 * 128, 128, device="cuda", generator=g).bfloat16()
    w = 1 + 0.3 * torch.randn(128, device="cuda", generator=g)
    dy, ds = torch.randn(128 * 128, 128, device="cuda", generator=g).bfloat16(), torch.randn_like(x)
    xr, rr, wr = (t.double().requires_grad_() for t in (x, r, w))
    sr = xr + rr
    want = F.rms_norm(sr, (128,), wr, 1e-6)
    torch.autograd.backward([sr, want], [ds.double(), dy.double()])
    errs = {}
    for name, fn in (("kernel", N.add_rms_norm), ("torch", N.add_rms_norm_torch)):
        xx, rx, ww = (t.clone().requires_grad_() for t in (x, r, w))
        s, y = fn(xx, rx, ww, 1e-6, torch.bfloat16)
        assert torch.equal(s, x + r) and y.dtype == torch.bfloat16 and rx.grad is None
        torch.autograd.backward([s, y], [ds, dy])
        errs[name] = [_rel(y, want.detach()), _rel(xx.grad, xr.grad), _rel(rx.grad, rr.grad), _rel(ww.grad, wr.grad)]
    print("\nadd_rms_norm against float64, y / dx / dr / dw: kernel " + " / ".join(f"{e:.1e}" for e in errs["kernel"])
          + ", PyTorch form " + " / ".join(f"{e:.1e}" for e in errs["torch"]))
    for a, b in zip(errs["kernel"], errs["torch"]):
        assert a <= max(1.01 * b, 1e-6)
    n = RMSNorm(128).cuda()
    xs = torch.randn(128, 128, 128, device="cuda", requires_grad=True)
    rs = torch.randn(128, 128, 128, device="cuda").bfloat16().requires_grad_()
    ms = [RMSNorm(128).cuda() for _ in range(6)]
    params, bufs = stack_module_state(ms)
    xk = torch.randn(6, 128, 128, 128, device="cuda", requires_grad=True)
    rk = torch.randn(6, 128, 128, 128, device="cuda").bfloat16().requires_grad_()

    def one():
        s, y = n(xs, residual=rs, out_dtype=torch.bfloat16)
        (s.sum() + y.float().square().sum()).backward()

    def stacked():
        with folding():
            s, y = vmap(lambda p, b, xi, ri: functional_call(ms[0], (p, b), (xi,), dict(
                residual=ri, out_dtype=torch.bfloat16)))(params, bufs, xk, rk)
        (s.sum() + y.float().square().sum()).backward()
    t = {}
    for env in ("1", "0"):
        monkeypatch.setenv("MIXZOO_FUSE_ADD", env)
        label = "fused" if env == "1" else "MIXZOO_FUSE_ADD=0"
        t[f"one model, {label}"] = timed(one)
        t[f"6 stacked, {label}"] = timed(stacked, rounds=2, iters=10)
    print("residual add + RMSNorm(128) forward+backward at 128 x 128 tokens (a sum and a square on top), ms: "
          + "; ".join(f"{k} {v:.3f}" for k, v in t.items()))
    assert t["6 stacked, fused"] <= 1.05 * t["6 stacked, MIXZOO_FUSE_ADD=0"]
