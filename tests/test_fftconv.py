"""mixzoo.kernels.fftconv: Hyena's FFT step as one autograd Function (its backward the convolution's adjoint),
against autograd's composition: gradcheck in float64, the reference's numbers in float64 and float32 (with a bf16
gate and value, as under autocast), K models folded under vmap as the loop of them, the Hyena layer with and
without it, and stacked training against separate runs with it on (the default, or ``MIXZOO_HYENA_CONV=fused``;
``MIXZOO_HYENA_CONV=torch`` keeps the composition); the Toeplitz products in bf16x3 (``MIXZOO_HYENA_TOEPLITZ_MM``)
against float64, the default ``fp32`` the float32 einsums bit for bit."""
from __future__ import annotations

import pytest
import torch

from mixzoo.kernels import fftconv as F


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setenv("MIXZOO_HYENA_CONV", "fused")
    monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ", "fused")
    monkeypatch.setenv("MIXZOO_HYENA_OP", "steps")        # the step Functions (the operator's tests set it back)


# the two Functions: the FFT step and the Toeplitz step, with their public calls and references
KINDS = {"fft": ("_GatedFFTConv", "gated_fft_conv", "gated_fft_conv_torch"),
         "toeplitz": ("_GatedToeplitzConv", "gated_toeplitz_conv", "gated_toeplitz_conv_torch")}


def _kind(kind):
    fn, call, ref = KINDS[kind]
    return getattr(F, fn), getattr(F, call), getattr(F, ref)


def _inputs(B, C, T, dt, gen, vdt=None, gdt=None):
    v = torch.randn(B, C, T, generator=gen, dtype=torch.float64).to(vdt or dt).requires_grad_()
    g = torch.randn(B, C, T, generator=gen, dtype=torch.float64).to(gdt or dt).requires_grad_()
    h = (torch.randn(C, T, generator=gen, dtype=torch.float64) * torch.exp(-torch.arange(T) / 50.)).to(dt).requires_grad_()
    b = torch.randn(C, generator=gen, dtype=torch.float64).to(dt).requires_grad_()
    return v, g, h, b


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_float64(fused, kind):
    v, g, h, b = _inputs(2, 3, 37, torch.float64, torch.Generator().manual_seed(0))
    fn = _kind(kind)[0]
    assert torch.autograd.gradcheck(lambda *a: fn.apply(*(x[None] for x in a))[0], (v, g, h, b))


def test_diagonal_sums_are_the_adjoint_of_the_toeplitz_matrix():
    gen = torch.Generator().manual_seed(3)
    for T in (1, 2, 7, 33):
        h = torch.randn(2, 3, T, generator=gen, dtype=torch.float64, requires_grad=True)
        m = torch.randn(2, 3, T, T, generator=gen, dtype=torch.float64)
        want = torch.stack([sum(m[..., t, t - k] for t in range(k, T)) for k in range(T)], -1)
        torch.testing.assert_close(F.diagonal_sums(m), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.autograd.grad(F.toeplitz(h), h, m)[0], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", [5, 64, 300])
def test_the_reference_s_numbers(fused, T, kind):
    """float64: equal to 1e-12; float32 with a bf16 value and gate (autocast's): the gradients' dtypes as autograd's,
    within float32 rounding of the reference computed in float64."""
    gen = torch.Generator().manual_seed(T)
    v, g, h, b = _inputs(3, 4, T, torch.float64, gen)
    do = torch.randn(3, 4, T, generator=gen, dtype=torch.float64)
    _, call, reference = _kind(kind)
    out, ref = call(v, g, h, b), reference(v, g, h, b)
    ga, gb = torch.autograd.grad(out, (v, g, h, b), do), torch.autograd.grad(ref, (v, g, h, b), do)
    assert float((out - ref).detach().abs().max()) < 1e-12
    assert all(float((x - y).abs().max()) < 1e-12 * max(1., float(y.abs().max())) for x, y in zip(ga, gb))
    lo = [x.detach().to(torch.bfloat16 if i < 2 else torch.float32).requires_grad_() for i, x in enumerate((v, g, h, b))]
    out32 = call(*lo)
    assert out32.dtype == torch.float32
    g32 = torch.autograd.grad(out32, lo, do.float())
    hi = [x.detach().double().requires_grad_() for x in lo]
    ref64 = reference(*hi)
    g64 = torch.autograd.grad(ref64, hi, do)
    assert [x.dtype for x in g32] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    assert float((out32.detach() - ref64.detach()).norm() / ref64.detach().norm()) < 1e-6
    for x, y, tol in zip(g32, g64, (1e-2, 1e-2, 1e-5, 1e-5)):       # bf16 gradients rounded once
        assert float((x.double() - y).norm() / y.norm()) < tol


@pytest.mark.parametrize("kind", KINDS)
def test_folded_under_vmap_is_the_loop_of_models(fused, kind):
    """K = 3 models' steps under vmap (folding(): one call of 3 groups) give each model's own call."""
    from mixzoo.models import _fla
    from mixzoo.train.vmapfold import folding
    gen = torch.Generator().manual_seed(1)
    K, B, C, T = 3, 2, 4, 40
    v, g = (torch.randn(K, B, C, T, generator=gen, dtype=torch.float64) for _ in range(2))
    h, b = torch.randn(K, C, T, generator=gen, dtype=torch.float64), torch.randn(K, C, generator=gen, dtype=torch.float64)
    ins = [x.clone().requires_grad_() for x in (v, g, h, b)]
    calls = []
    fn, call, _ = _kind(kind)
    real = fn.apply

    def spy(*a):
        calls.append(tuple(a[0].shape))
        return real(*a)
    with folding():
        op = _fla._op("mixzoo.kernels.fftconv", KINDS[kind][1])
        try:
            fn.apply = spy
            out = torch.func.vmap(op)(*ins)
        finally:
            fn.apply = real
    assert calls == [(K, B, C, T)]
    do = torch.randn(K, B, C, T, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(out, ins, do)
    for k in range(K):
        one = [x[k].clone().requires_grad_() for x in (v, g, h, b)]
        o = call(*one)
        torch.testing.assert_close(out[k], o, rtol=1e-12, atol=1e-12)
        for got, want in zip(grads, torch.autograd.grad(o, one, do[k])):
            torch.testing.assert_close(got[k], want, rtol=1e-10, atol=1e-12)


# (switch, kernel name, the length its Function serves, the other path's length, the kernels ran there (the other
# step's default), whether it runs when unset)
LAYER_CASES = [("MIXZOO_HYENA_CONV", "fftconv", 300, 200, None, True),
               ("MIXZOO_HYENA_TOEPLITZ", "toeplitzconv", 200, 300, "fftconv", False)]


@pytest.mark.parametrize("switch,name,T_on,T_off,ran_off,default", LAYER_CASES)
def test_hyena_layer_with_and_without_it(switch, name, T_on, T_off, ran_off, default, monkeypatch):
    """The Hyena layer under bf16 autocast with each Function (the FFT step at length 300, the Toeplitz step at 200)
    and without: the same output (its forward runs the composition's operators) and gradients within float32
    reordering; it is named in the kernels ran, only at its path's length; unset, the FFT Function runs and the
    Toeplitz one does not (not yet timed)."""
    from mixzoo import kernels
    from mixzoo.models.hyena import Hyena
    monkeypatch.setenv("MIXZOO_HYENA_OP", "steps")
    torch.manual_seed(0)
    m = Hyena(16)
    res = {}
    for how in ("torch", "fused", None):
        if how is None:
            monkeypatch.delenv(switch, raising=False)
        else:
            monkeypatch.setenv(switch, how)
        for T in (T_on, T_off):
            kernels.reset()
            x = torch.randn(2, T, 16, generator=torch.Generator().manual_seed(T)).requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = m(x)
            y.float().sum().backward()
            res[how, T] = (y.detach().float(), x.grad.clone(), [p.grad.clone() for p in m.parameters()], kernels.ran())
            m.zero_grad()
    assert res["fused", T_on][3] == name and res["fused", T_off][3] == ran_off
    assert res["torch", T_on][3] is None and res[None, T_on][3] == (name if default else None)
    for T in (T_on, T_off):
        a, b = res["fused", T], res["torch", T]
        assert torch.equal(a[0], b[0])
        torch.testing.assert_close(a[1], b[1], rtol=2e-2, atol=1e-3)    # bf16 input gradient
        for pa, pb in zip(a[2], b[2]):
            assert float((pa - pb).norm()) <= 1e-4 * float(pb.norm()) + 1e-6


@pytest.mark.parametrize("op,L,name,mm", [("steps", 272, "fftconv", None), ("steps", 96, "toeplitzconv", None),
                                          ("fused", 272, "hyenaop", None), ("fused", 96, "hyenaop", None),
                                          ("steps", 96, "toeplitzconv", "bf16x3"), ("fused", 96, "hyenaop", "bf16x3")])
def test_stacked_training_with_it_gives_each_run_s_numbers(fused, monkeypatch, op, L, name, mm):
    """K = 2 runs of Hyena at length 272 (FFT path) or 96 (Toeplitz path) as one stacked model give the separate
    runs' numbers (tests/test_stacked.py's tolerances for Hyena), every run naming the Function among its
    kernels: each step's Function (MIXZOO_HYENA_OP=steps), or the operator's (fused, the default); at 96 also with
    the Toeplitz products in bf16x3 (MIXZOO_HYENA_TOEPLITZ_MM=bf16x3: the runs then name ``toeplitz-bf16x3`` too)."""
    monkeypatch.setenv("MIXZOO_HYENA_OP", op)
    if mm is None:
        monkeypatch.delenv("MIXZOO_HYENA_TOEPLITZ_MM", raising=False)
    else:
        monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", mm)
    from mixzoo.models import ModelConfig
    from mixzoo.tasks.mqar import MQAR
    from mixzoo.train import TrainConfig, train
    from mixzoo.train.stacked import train_stacked
    task, mcfg = MQAR(V=32, L=L, kv=2), ModelConfig(d_model=16, num_heads=2)
    base = dict(steps=4, batch_size=2, eval_every=2, n_train=8, n_val=4, n_test=4, eval_batch_size=4)
    cfgs = [TrainConfig(lr=lr, **base) for lr in (3e-3, 1e-2)]
    solo = [train(task, "hyena", {}, mcfg, c, seed=0, device="cpu") for c in cfgs]
    stacked = train_stacked(task, "hyena", {}, mcfg, cfgs, (0, 0), device="cpu")
    for r, q in zip(solo, stacked):
        assert r.state == q.state == "COMPLETE" and name in r.kernels and name in q.kernels
        assert all(("toeplitz-bf16x3" in x.kernels.split(",")) == (mm == "bf16x3") for x in (r, q)), (r.kernels, mm)
        for a, b in zip(r.history, q.history):
            for k in ("train_loss", "loss"):
                assert abs(a[k] - b[k]) <= 3e-4 * abs(a[k]), (k, a[k], b[k])


def test_the_switch_is_checked():
    import os

    from mixzoo import kernels
    old = os.environ.get("MIXZOO_HYENA_CONV")
    try:
        os.environ["MIXZOO_HYENA_CONV"] = "fast"
        assert kernels.switch_error() == "MIXZOO_HYENA_CONV='fast'; allowed: fused, torch (or unset)"
    finally:
        if old is None:
            os.environ.pop("MIXZOO_HYENA_CONV")
        else:
            os.environ["MIXZOO_HYENA_CONV"] = old


def test_the_toeplitz_products_switch_is_checked(monkeypatch):
    """MIXZOO_HYENA_TOEPLITZ_MM: rejected at the command line (switch_error) and by the Function's read of it."""
    from mixzoo import kernels
    monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", "bf16")
    assert kernels.switch_error() == "MIXZOO_HYENA_TOEPLITZ_MM='bf16'; allowed: fp32, bf16x3 (or unset)"
    with pytest.raises(ValueError, match="MIXZOO_HYENA_TOEPLITZ_MM"):
        F._toeplitz_mm(torch.float32)
    for mm in ("fp32", "bf16x3"):
        monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", mm)
        assert kernels.switch_error() is None
        assert F._toeplitz_mm(torch.float32) == mm and F._toeplitz_mm(torch.float64) == "fp32"
    monkeypatch.delenv("MIXZOO_HYENA_TOEPLITZ_MM")
    assert F._toeplitz_mm(torch.float32) == "fp32"                # the default


# -- Hyena's whole operator as one Function (MIXZOO_HYENA_OP=fused) -------------------------------------------------

def _op_inputs(B, T, C, N, gen, udt=torch.float64):
    u = torch.randn(B, T, (N + 1) * C, generator=gen, dtype=torch.float64).to(udt).requires_grad_()
    h = (torch.randn(N, C, T, generator=gen, dtype=torch.float64) * torch.exp(-torch.arange(T) / 30.)).requires_grad_()
    b = torch.randn(N, C, generator=gen, dtype=torch.float64).requires_grad_()
    return u, h, b


@pytest.mark.parametrize("direct", [True, False])
def test_the_operator_gradcheck_float64(fused, monkeypatch, direct):
    monkeypatch.setenv("MIXZOO_HYENA_OP", "fused")
    u, h, b = _op_inputs(2, 9, 3, 2, torch.Generator().manual_seed(4))
    assert torch.autograd.gradcheck(lambda *a: F._HyenaOperator.apply(*(x[None] for x in a), direct)[0], (u, h, b))
    assert float((F.hyena_operator(u, h, b, direct) - F.hyena_operator_torch(u, h, b, direct)).abs().max()) < 1e-12


@pytest.mark.parametrize("layout", ["channels", "strided"])
@pytest.mark.parametrize("N", [1, 2, 3])
@pytest.mark.parametrize("T", [40, 300])
def test_the_operator_is_the_chained_steps_bit_for_bit(fused, monkeypatch, T, N, layout):
    """u in bf16 (autocast's), filters and biases float32: the operator's output and its gradients of u and h equal to
    the step Functions chained in the layer's layout, bit for bit, at a Toeplitz length (40) and an FFT length (300),
    in either layout (``MIXZOO_HYENA_LAYOUT``); the biases' gradient too at the Toeplitz length in the strided layout,
    and within float32 reordering otherwise (its sum over the batch and time reads the FFTs' zero-padded buffers, or
    contiguous rows where the steps read transposed ones, in another order)."""
    monkeypatch.setenv("MIXZOO_HYENA_OP", "fused")
    monkeypatch.setenv("MIXZOO_HYENA_LAYOUT", layout)
    gen = torch.Generator().manual_seed(T + N)
    B, C, direct = 3, 4, T <= 256
    u, h, b = _op_inputs(B, T, C, N, gen, torch.bfloat16)
    h, b = (x.detach().float().requires_grad_() for x in (h, b))
    do = torch.randn(B, T, C, generator=gen).to(torch.bfloat16)
    y = F.hyena_operator(u, h, b, direct)
    got = [y, *torch.autograd.grad(y, (u, h, b), do)]
    step = F.gated_toeplitz_conv if direct else F.gated_fft_conv
    *gates, v = u.transpose(1, 2).split(C, dim=1)
    for n in range(N):
        v = step(v, gates[n], h[n], b[n])
    y2 = v.transpose(1, 2).to(u.dtype)
    want = [y2, *torch.autograd.grad(y2, (u, h, b), do)]
    assert [x.dtype for x in got] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    assert all(torch.equal(a, w) for a, w in zip(got[:3], want[:3]))
    if direct and layout == "strided":
        assert torch.equal(got[3], want[3])
    else:
        assert float((got[3] - want[3]).norm()) <= 1e-6 * float(want[3].norm())


@pytest.mark.parametrize("direct,mm", [(True, None), (False, None), (True, "bf16x3")])
def test_the_operator_folded_under_vmap_is_the_loop_of_models(fused, monkeypatch, direct, mm):
    """K = 3 models in one call of 3 groups give each model's own call: in float64 (to its rounding), and in float32
    with the Toeplitz products in bf16x3 (within float32 reordering)."""
    from mixzoo.models import _fla
    from mixzoo.train.vmapfold import folding
    monkeypatch.setenv("MIXZOO_HYENA_OP", "fused")
    dt = torch.float64
    if mm is not None:
        monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", mm)
        dt = torch.float32
    gen = torch.Generator().manual_seed(5)
    K, B, T, C, N = 3, 2, 40, 4, 2
    u = torch.randn(K, B, T, (N + 1) * C, generator=gen, dtype=dt)
    h, b = torch.randn(K, N, C, T, generator=gen, dtype=dt), torch.randn(K, N, C, generator=gen, dtype=dt)
    if mm is not None:                                  # filters decaying along the lag, as Hyena's window makes them
        h = h * torch.exp(-torch.arange(T) / 30.)
    ins = [x.clone().requires_grad_() for x in (u, h, b)]
    calls, real = [], F._HyenaOperator.apply

    def spy(*a):
        calls.append(tuple(a[0].shape))
        return real(*a)
    from mixzoo import kernels
    kernels.reset()
    with folding():
        op = _fla._op("mixzoo.kernels.fftconv", "hyena_operator")
        try:
            F._HyenaOperator.apply = spy
            out = torch.func.vmap(op, in_dims=(0, 0, 0, None))(*ins, direct)
        finally:
            F._HyenaOperator.apply = real
    assert calls == [(K, B, T, (N + 1) * C)]
    assert ("toeplitz-bf16x3" in kernels.RAN) == (mm == "bf16x3")
    do = torch.randn(K, B, T, C, generator=gen, dtype=dt)
    grads = torch.autograd.grad(out, ins, do)
    for k in range(K):
        one = [x[k].clone().requires_grad_() for x in (u, h, b)]
        o = F.hyena_operator(*one, direct)
        if mm is not None:
            for got, want in zip([out[k], *(g[k] for g in grads)], [o, *torch.autograd.grad(o, one, do[k])]):
                got, want = got.detach(), want.detach()
                assert float((got - want).norm()) <= 1e-6 * float(want.norm()), (k, float((got - want).norm()))
            continue
        torch.testing.assert_close(out[k], o, rtol=1e-12, atol=1e-12)
        for got, want in zip(grads, torch.autograd.grad(o, one, do[k])):
            torch.testing.assert_close(got[k], want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("T", [96, 300])
def test_hyena_layer_with_the_operator(fused, monkeypatch, T):
    """The Hyena layer under bf16 autocast with the operator as one Function (the default) and with its steps:
    gradients equal (bit for bit but the Hyena biases': float32 reordering, the default channels-first layout sums
    contiguous rows where the steps sum transposed ones, and at FFT lengths the padded buffers); the output within bf16
    rounding (the output projection's product takes a contiguous input instead of a transposed one, and sums in
    another order); the kernels ran name ``hyenaop``."""
    from mixzoo import kernels
    from mixzoo.models.hyena import Hyena
    torch.manual_seed(0)
    m = Hyena(16)
    res = {}
    for how in ("steps", "fused", None):
        if how is None:
            monkeypatch.delenv("MIXZOO_HYENA_OP")
        else:
            monkeypatch.setenv("MIXZOO_HYENA_OP", how)
        kernels.reset()
        x = torch.randn(2, T, 16, generator=torch.Generator().manual_seed(T)).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
        y.float().sum().backward()
        res[how] = (y.detach().float(), x.grad.clone(), [p.grad.clone() for p in m.parameters()], kernels.ran())
        m.zero_grad()
    a, b = res["steps"], res["fused"]
    assert b[3] == res[None][3] == "hyenaop" and "hyenaop" not in (a[3] or "")     # unset: the operator
    assert float((a[0] - b[0]).abs().max()) <= 2 ** -7 * float(a[0].abs().max())
    assert torch.equal(a[1], b[1])
    for (name, _), p, q in zip(m.named_parameters(), a[2], b[2]):
        assert torch.equal(p, q) if name != "bias" else float((p - q).norm()) <= 1e-6 * float(p.norm())



# -- the channels-first layout's transposes (fftconv_triton) in Triton's interpreter ------------------------------------

_TRANSPOSE_SCRIPT = r"""
from mixzoo.kernels import fftconv as F, fftconv_triton as FT
g = torch.Generator().manual_seed(0)
out = {}
x = torch.randn(2, 3, 70, 150, generator=g).to(torch.bfloat16)
cases = {"bf16->bf16": (x, torch.bfloat16), "bf16->f32": (x, torch.float32),
         "transposed view": (x.transpose(-1, -2), torch.bfloat16), "sliced view": (x[:, :, 5:40, 3:133], torch.float32),
         "f64 3-d": (torch.randn(5, 33, 17, generator=g, dtype=torch.float64), torch.float64)}
for name, (t, dt) in cases.items():
    for tile in (None, (16, 32, 2)):
        y = FT.transpose(t, dt, tile)
        want = t.transpose(-1, -2).to(dt)
        out[f"{name} {tile}"] = dict(equal=bool(torch.equal(y, want)), contiguous=y.is_contiguous(), dtype=str(y.dtype))
# the operator in both layouts: the channels-first one through the kernel (the interpreter counts as a device)
os.environ["MIXZOO_HYENA_OP"] = "fused"
for T in (40, 300):
    B, C, N = 2, 4, 2
    u = torch.randn(B, T, (N + 1) * C, generator=g).to(torch.bfloat16)
    h = torch.randn(N, C, T, generator=g) * torch.exp(-torch.arange(T) / 30.)
    b = torch.randn(N, C, generator=g)
    do = torch.randn(B, T, C, generator=g).to(torch.bfloat16)
    res = {}
    for layout in ("channels", "strided"):
        os.environ["MIXZOO_HYENA_LAYOUT"] = layout
        ins = [t.clone().requires_grad_() for t in (u, h, b)]
        y = F.hyena_operator(*ins, T <= 256)
        res[layout] = [y, *torch.autograd.grad(y, ins, do)]
    a, s = res["channels"], res["strided"]
    out[f"op {T}"] = dict(equal=[bool(torch.equal(p, q)) for p, q in zip(a[:3], s[:3])],
                          db=float((a[3] - s[3]).norm() / s[3].norm()), dtypes=[str(t.dtype) for t in a])
print("RESULT", json.dumps(out))
"""


def test_transpose_kernel_and_the_channels_first_operator_in_the_interpreter():
    """fftconv_triton.transpose: any strides, a cast, partial tiles, two tilings -> the transposed copy exactly; the
    operator with it (channels-first) gives the strided layout's output and gradients of u and h bit for bit, the
    biases' within float32 reordering, at a Toeplitz length and an FFT length."""
    from interp import run_interpreted
    r = run_interpreted(_TRANSPOSE_SCRIPT, drop=("MIXZOO_HYENA_LAYOUT", "MIXZOO_HYENA_OP"))
    for case, res in r.items():
        if case.startswith("op "):
            assert res["equal"] == [True, True, True] and res["db"] < 1e-6, (case, res)
            assert res["dtypes"] == ["torch.bfloat16", "torch.bfloat16", "torch.float32", "torch.float32"], (case, res)
        else:
            assert res["equal"] and res["contiguous"], (case, res)
    assert len(r) == 12


@pytest.mark.parametrize("op", ["fused", "steps"])
def test_the_ffts_scale_in_the_filters_is_bit_for_bit_the_output_scale(fused, monkeypatch, op):
    """MIXZOO_HYENA_FFT_SCALE: the FFTs' 1/n in the filters' spectrum (the default) or on irfft's output; n is a power
    of two, so the operator's (and the chained steps') output and every gradient are the same bit for bit."""
    monkeypatch.setenv("MIXZOO_HYENA_OP", op)
    gen = torch.Generator().manual_seed(7)
    B, T, C, N = 3, 300, 4, 2
    u, h, b = _op_inputs(B, T, C, N, gen, torch.bfloat16)
    h, b = (x.detach().float() for x in (h, b))
    do = torch.randn(B, T, C, generator=gen).to(torch.bfloat16)
    res = {}
    for scale in ("output", "filter"):
        monkeypatch.setenv("MIXZOO_HYENA_FFT_SCALE", scale)
        ins = [t.detach().clone().requires_grad_() for t in (u, h, b)]
        if op == "fused":
            y = F.hyena_operator(*ins, False)
        else:
            *gates, v = ins[0].transpose(1, 2).split(C, dim=1)
            for n in range(N):
                v = F.gated_fft_conv(v, gates[n], ins[1][n], ins[2][n])
            y = v.transpose(1, 2).to(u.dtype)
        res[scale] = [y, *torch.autograd.grad(y, ins, do)]
    assert all(torch.equal(a, w) for a, w in zip(res["filter"], res["output"]))


# -- the Toeplitz products in bf16x3 (MIXZOO_HYENA_TOEPLITZ_MM=bf16x3) ---------------------------------------------------

def _no_lo(monkeypatch):
    """The splits' lo parts zeroed: bf16x3's GEMMs then form plain bf16 products (hi·hi), the control of the bound."""
    real = F._split

    def split(x, lo):
        out = real(x, lo)
        out[..., lo, :] = 0
        return out
    monkeypatch.setattr(F, "_split", split)


def _op_errors(u, h, b, do, want):
    """The operator's output and gradients of (u, h, b) in float32 against ``want`` (float64): ‖a − w‖ / ‖w‖ each."""
    ins = [x.detach().float().requires_grad_() for x in (u, h, b)]
    y = F.hyena_operator(*ins, True)
    got = [y, *torch.autograd.grad(y, ins, do.float())]
    return [float((a.detach().double() - w).norm() / w.norm()) for a, w in zip(got, want)]


@pytest.mark.parametrize("layout", ["channels", "strided"])
@pytest.mark.parametrize("T,N", [(40, 2), (128, 3)])
def test_bf16x3_against_float64(fused, monkeypatch, T, N, layout):
    """The operator (u, h, b float32) with the three Toeplitz products in bf16x3, in either layout, against the operator
    in float64 at the same values: output and the gradients du, dh, db within 1e-4 relative (norm), which plain bf16
    products do not meet. Measured here (CPU): bf16x3 3.9e-6 to 7.4e-6 (1.4e-5 for db at T = 256, N = 3), the float32
    einsums 1e-7 to 3e-7; the lo parts dropped (plain bf16 products) 2.3e-3 to 4.1e-3, checked here above 5e-4 (and
    each operand's lo alone dropped, M's, v's or dz's, gives 1.6e-3 to 2.9e-3: this test fails)."""
    monkeypatch.setenv("MIXZOO_HYENA_OP", "fused")
    monkeypatch.setenv("MIXZOO_HYENA_LAYOUT", layout)
    gen = torch.Generator().manual_seed(T + N)
    u, h, b = (x.detach().float().double() for x in _op_inputs(3, T, 4, N, gen))
    do = torch.randn(3, T, 4, generator=gen, dtype=torch.float64)
    ins = [x.clone().requires_grad_() for x in (u, h, b)]
    monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", "bf16x3")      # float64 keeps its einsums: the reference
    y = F.hyena_operator(*ins, True)
    want = [y.detach(), *torch.autograd.grad(y, ins, do)]
    errs = _op_errors(u, h, b, do, want)
    monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", "fp32")
    errs32 = _op_errors(u, h, b, do, want)
    monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", "bf16x3")
    _no_lo(monkeypatch)
    errs16 = _op_errors(u, h, b, do, want)
    assert max(errs) < 1e-4 and max(errs32) < 1e-6, (errs, errs32)
    assert min(errs16) > 5e-4, errs16


def test_bf16x3_step_against_float64(fused, monkeypatch):
    """The Toeplitz step's Function (MIXZOO_HYENA_TOEPLITZ=fused) in bf16x3: output and the gradients of v, g, h, b
    against float64 within 1e-4 (norm), plain bf16 products above 5e-4. Measured here (CPU): bf16x3 4.4e-6 to 5.0e-6
    (db 6.8e-8: not a product's), the float32 einsums 7e-8 to 1.4e-7, plain bf16 2.4e-3."""
    gen = torch.Generator().manual_seed(11)
    v, g, h, b = (x.detach().float().double() for x in _inputs(3, 4, 64, torch.float64, gen))
    do = torch.randn(3, 4, 64, generator=gen, dtype=torch.float64)
    ins = [x.clone().requires_grad_() for x in (v, g, h, b)]
    y = F.gated_toeplitz_conv(*ins)
    want = [y.detach(), *torch.autograd.grad(y, ins, do)]
    monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", "bf16x3")

    def errors():
        one = [x.detach().float().requires_grad_() for x in (v, g, h, b)]
        out = F.gated_toeplitz_conv(*one)
        got = [out, *torch.autograd.grad(out, one, do.float())]
        return [float((a.detach().double() - w).norm() / w.norm()) for a, w in zip(got, want)]
    errs = errors()
    _no_lo(monkeypatch)
    errs16 = errors()
    assert max(errs) < 1e-4, errs
    assert max(errs16) > 5e-4, errs16


@pytest.mark.parametrize("parts_first", [True, False])
def test_bf16x3_toeplitz_parts_are_each_part_s_toeplitz_matrix(parts_first):
    """_toeplitz_parts: the three parts' Toeplitz matrices, M_p = toeplitz(hp[p]) bit for bit, contiguous in the layout
    its GEMM reads ([p, t, s] for dv's, [t, p, s] for the forward's)."""
    hp = torch.randn(2, 3, 3, 37, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    got = F._toeplitz_parts(hp, parts_first)
    assert got.is_contiguous() and got.dtype == torch.bfloat16
    for p in range(3):
        assert torch.equal(got[:, :, p] if parts_first else got[:, :, :, p], F.toeplitz(hp[:, :, p]))


def _conv_einsums(vf, M, dz):
    """The Toeplitz products as fftconv forms them without bf16x3: einsums (y, dv, dh) with M = toeplitz(h)."""
    return (torch.einsum("gcts,gbcs->gbct", M, vf), torch.einsum("gcts,gbct->gbcs", M, dz),
            F.diagonal_sums(torch.einsum("gbct,gbcs->gcts", dz, vf)))


@pytest.mark.parametrize("mm", [None, "fp32"])
def test_fp32_is_the_float32_einsums_bit_for_bit(fused, monkeypatch, mm):
    """Unset or ``fp32``: the Toeplitz products are the float32 einsums, bit for bit (the forward keeps M), and so is
    the operator (its convolution swapped for the einsums gives the same output and gradients); float64 takes its
    einsums whatever the switch."""
    if mm is None:
        monkeypatch.delenv("MIXZOO_HYENA_TOEPLITZ_MM", raising=False)
    else:
        monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", mm)
    monkeypatch.setenv("MIXZOO_HYENA_OP", "fused")
    gen = torch.Generator().manual_seed(13)
    G, B, C, T = 2, 3, 4, 40
    vf, dz = (torch.randn(G, B, C, T, generator=gen) for _ in range(2))
    hf = torch.randn(G, C, T, generator=gen)
    mode = F._toeplitz_mm(torch.float32)
    assert mode == "fp32"
    y, kept = F._conv_forward(vf, hf, True, mm=mode)
    dv, dh = F._conv_backward(dz, vf, kept, True, True, True, mm=mode)
    want = _conv_einsums(vf, F.toeplitz(hf), dz)
    assert torch.equal(kept[0], F.toeplitz(hf)) and all(torch.equal(a, w) for a, w in zip((y, dv, dh), want))

    u, h, b = _op_inputs(3, T, C, 2, gen, torch.float32)
    h, b = (x.detach().float() for x in (h, b))
    do = torch.randn(3, T, C, generator=gen)

    def run():
        ins = [x.detach().clone().requires_grad_() for x in (u, h, b)]
        out = F.hyena_operator(*ins, True)
        return [out, *torch.autograd.grad(out, ins, do)]
    got = run()
    fwd, bwd = F._conv_forward, F._conv_backward

    def einsum_forward(vf, hf, direct, padded=None, norm="backward", mm="fp32"):
        M = F.toeplitz(hf)
        return _conv_einsums(vf, M, vf)[0], (M,)

    def einsum_backward(dz, vf, kept, direct, need_v, need_h, padded=None, norm="backward", mm="fp32"):
        _, dv, dh = _conv_einsums(vf, kept[0], dz)
        return dv, dh if need_h else None
    monkeypatch.setattr(F, "_conv_forward", einsum_forward)
    monkeypatch.setattr(F, "_conv_backward", einsum_backward)
    assert all(torch.equal(a, w) for a, w in zip(got, run()))
    monkeypatch.setattr(F, "_conv_forward", fwd)
    monkeypatch.setattr(F, "_conv_backward", bwd)
    # float64: the einsums whatever the switch
    monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", "bf16x3")
    y64, kept64 = F._conv_forward(vf.double(), hf.double(), True, mm=F._toeplitz_mm(torch.float64))
    assert torch.equal(y64, _conv_einsums(vf.double(), F.toeplitz(hf.double()), vf.double())[0]) and len(kept64) == 1
