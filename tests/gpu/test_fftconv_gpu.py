"""Hyena's FFT step as one autograd Function (mixzoo.kernels.fftconv) on the GPU: the step alone and the mad recipe's
Hyena layer (width 128) at lengths 512 and 2048 under bf16 autocast against float64, beside the composition
(``MIXZOO_HYENA_CONV=torch``): the Function's errors no worse than the composition's; and under a CUDA graph its
forward and backward replayed give the eager call's numbers."""
from __future__ import annotations

import copy

import pytest
import torch
from layer_check import layer_grads, rel, timed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("T", [512, 2048])
def test_the_step_against_float64_beside_the_composition(T):
    """One step at the mad layer's sizes (batch 4, 128 channels), the value and the gate in bf16 as autocast hands
    them: the Function's output and gradients against the step in float64, no worse than the composition's."""
    from mixzoo.kernels import fftconv as F
    g = torch.Generator(device="cuda").manual_seed(T)
    B, C = 4, 128
    v = torch.randn(B, C, T, device="cuda", generator=g).to(torch.bfloat16)
    gate = torch.randn(B, C, T, device="cuda", generator=g).to(torch.bfloat16)
    h = torch.randn(C, T, device="cuda", generator=g) * torch.exp(-torch.arange(T, device="cuda") / 100.)
    b = torch.randn(C, device="cuda", generator=g)
    do = torch.randn(B, C, T, device="cuda", generator=g)
    hi = [t.double().requires_grad_() for t in (v, gate, h, b)]
    want = F.gated_fft_conv_torch(*hi)
    wants = [want.detach(), *torch.autograd.grad(want, hi, do.double())]
    errs = {}
    for name, fn in (("fused", lambda *a: F._GatedFFTConv.apply(*(t[None] for t in a))[0]),
                     ("torch", F.gated_fft_conv_torch)):
        ins = [t.clone().requires_grad_() for t in (v, gate, h, b)]
        out = fn(*ins)
        got = [out.detach(), *torch.autograd.grad(out, ins, do)]
        errs[name] = [rel(a, w) for a, w in zip(got, wants)]
    print(T, errs)
    for e_f, e_t in zip(errs["fused"], errs["torch"]):
        assert e_f <= 1.5 * e_t + 1e-6, errs


@pytest.mark.parametrize("switch,name,B,T", [("MIXZOO_HYENA_CONV", "fftconv", 4, 512),
                                             ("MIXZOO_HYENA_CONV", "fftconv", 4, 2048),
                                             ("MIXZOO_HYENA_TOEPLITZ", "toeplitzconv", 8, 128),
                                             ("MIXZOO_HYENA_TOEPLITZ", "toeplitzconv", 8, 256)])
def test_mad_layer_against_float64_beside_the_composition(switch, name, B, T, monkeypatch):
    """The mad recipe's Hyena layer (width 128) under bf16 autocast with the Function (the FFT step at 512 and
    2048; with MIXZOO_HYENA_TOEPLITZ=fused the Toeplitz step at 128 and 256) and with the composition, each
    against the layer in float64: the Function's errors no worse; the run's kernels name it."""
    from mixzoo import kernels
    from mixzoo.models.hyena import Hyena
    monkeypatch.setenv("MIXZOO_HYENA_OP", "steps")       # the step Functions (the operator gives their numbers)
    torch.manual_seed(0)
    m = Hyena(128).cuda()
    ref = copy.deepcopy(m).double()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(B, T, 128, device="cuda", generator=g)
    dy = torch.randn(B, T, 128, device="cuda", generator=g)

    def run(mod, xx, amp):
        kernels.reset()
        grads = layer_grads(mod, xx, dy, amp)
        return kernels.ran() or "", grads

    monkeypatch.setenv(switch, "torch")
    _, want = run(ref, x.double(), False)
    errs = {}
    for how in ("fused", "torch"):
        monkeypatch.setenv(switch, how)
        ran, got = run(m, x, True)
        errs[how] = (ran, [rel(a, b) for a, b in zip(got, want)])
    print(T, errs)
    # the run's kernels: the Function in the fused run only (the short convolution's kernel runs in both)
    assert name in errs["fused"][0].split(",") and name not in errs["torch"][0], errs
    for e_f, e_t in zip(errs["fused"][1], errs["torch"][1]):
        assert e_f <= 1.5 * e_t + 1e-4, errs


def _replayed(fn):
    """fn's outputs (a list of tensors) from one replay of a CUDA graph that captured it, after two warm-up calls on
    a side stream, and the graph (it owns the outputs' memory: keep it while they are read)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    graph.replay()
    torch.cuda.synchronize()
    return outs, graph


def test_captured_in_a_cuda_graph():
    from mixzoo.kernels import fftconv as F
    g = torch.Generator(device="cuda").manual_seed(2)
    B, C, T = 8, 128, 1024
    v = torch.randn(B, C, T, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    gate = torch.randn(B, C, T, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    h = (torch.randn(C, T, device="cuda", generator=g) * 0.05).requires_grad_()
    b = torch.randn(C, device="cuda", generator=g).requires_grad_()
    do = torch.randn(B, C, T, device="cuda", generator=g)
    ins = (v, gate, h, b)

    def step():
        out = F._GatedFFTConv.apply(*(t[None] for t in ins))[0]
        return [out.detach(), *torch.autograd.grad(out, ins, do)]
    want = step()
    outs, _graph = _replayed(step)
    for a, b_ in zip(outs, want):
        assert torch.equal(a, b_)


@pytest.mark.parametrize("mode", ["stacked", "stacked+graphed"])
def test_stacked_training_at_512_matches_separate_runs(mode, monkeypatch):
    """MAD's in-context recall at length 512 (Hyena's FFT path, so the Function runs folded under vmap): 3 models
    trained as one stacked step against each trained alone, 20 steps at batch 32 (the tolerance and the
    comparison of tests/gpu/test_throughput_gpu.py: training loss at steps 5..20, 2e-2 relative); every run's
    kernels name the Function."""
    monkeypatch.setenv("MIXZOO_EAGER_KERNELS", "1")        # the separate runs on the stacked run's kernels
    monkeypatch.setenv("MIXZOO_HYENA_OP", "steps")         # the FFT step's Function (the operator: the test below)
    from mixzoo.models import RECIPES, ModelConfig
    from mixzoo.tasks.mad import MADRecall
    from mixzoo.train import TrainConfig, train
    from mixzoo.train.stacked import train_stacked
    task = MADRecall(L=512)
    data = {split: task.generate(split, n, 0, "cuda") for split, n in (("train", 256), ("val", 32), ("test", 32))}
    cfg = dict(steps=20, batch_size=32, eval_every=5, eval_batch_size=32)
    mcfg = ModelConfig(**RECIPES["mad"])
    cfgs = [TrainConfig(**cfg, lr=lr, step_mode=mode) for lr in (5e-4, 1e-3, 2e-3)]
    stacked = train_stacked(task, "hyena", {}, mcfg, cfgs, [0, 1, 2], device="cuda", data=data)
    assert [r.step_mode for r in stacked] == [mode] * 3, stacked[0].step_mode_reason
    worst = 0.0
    for c, s, r in zip(cfgs, [0, 1, 2], stacked):
        alone = train(task, "hyena", {}, mcfg, TrainConfig(**cfg, lr=c.lr), seed=s, device="cuda", data=data)
        assert r.state == alone.state == "COMPLETE" and r.backend == alone.backend == "torch-fft"
        assert "fftconv" in (r.kernels or "") and "fftconv" in (alone.kernels or ""), (r.kernels, alone.kernels)
        a, b = alone.history, r.history
        assert [h["step"] for h in a] == [h["step"] for h in b] == [5, 10, 15, 20]
        worst = max(worst, max(abs(x["train_loss"] - y["train_loss"]) / abs(x["train_loss"]) for x, y in zip(a, b)))
    print(f"{mode}-K3-vs-separate[hyena, length 512]: largest relative difference of the training loss {worst:.2e}")
    assert worst < 2e-2



@pytest.mark.parametrize("layout", ["channels", "strided"])
@pytest.mark.parametrize("T", [128, 1024])
def test_the_operator_is_the_chained_steps_bit_for_bit(T, layout, monkeypatch):
    """Hyena's operator as one Function (MIXZOO_HYENA_OP=fused) against its steps chained (the step Functions, both
    on), the mad layer's sizes under bf16 autocast's dtypes (u bf16), in either layout (MIXZOO_HYENA_LAYOUT; the
    channels-first one through fftconv_triton's transposes): output and gradients equal bit for bit (the biases'
    gradient within float32 reordering at the FFT length, and in the channels-first layout: tests/test_fftconv.py),
    eager and replayed from a CUDA graph (bit for bit the eager call)."""
    from mixzoo.kernels import fftconv as F
    for k, v in (("MIXZOO_HYENA_OP", "fused"), ("MIXZOO_HYENA_CONV", "fused"), ("MIXZOO_HYENA_TOEPLITZ", "fused"),
                 ("MIXZOO_HYENA_LAYOUT", layout)):
        monkeypatch.setenv(k, v)
    g = torch.Generator(device="cuda").manual_seed(T)
    B, C, N, direct = 8, 128, 2, T <= 256
    u = torch.randn(B, T, (N + 1) * C, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    h = (torch.randn(N, C, T, device="cuda", generator=g) * torch.exp(-torch.arange(T, device="cuda") / 100.)).requires_grad_()
    b = torch.randn(N, C, device="cuda", generator=g).requires_grad_()
    do = torch.randn(B, T, C, device="cuda", generator=g).to(torch.bfloat16)
    step = F.gated_toeplitz_conv if direct else F.gated_fft_conv

    def chained():
        *gates, v = u.transpose(1, 2).split(C, dim=1)
        for n in range(N):
            v = step(v, gates[n], h[n], b[n])
        y = v.transpose(1, 2).to(u.dtype)
        return [y.detach(), *torch.autograd.grad(y, (u, h, b), do)]

    def fused():
        y = F.hyena_operator(u, h, b, direct)
        return [y.detach(), *torch.autograd.grad(y, (u, h, b), do)]
    want, got = chained(), fused()
    assert all(torch.equal(a, w) for a, w in zip(got[:3], want[:3])), [float((a.float() - w.float()).abs().max())
                                                                       for a, w in zip(got, want)]
    if direct and layout == "strided":
        assert torch.equal(got[3], want[3])
    else:
        assert float((got[3] - want[3]).norm()) <= 1e-6 * float(want[3].norm())
    outs, _graph = _replayed(fused)
    assert all(torch.equal(a, w) for a, w in zip(outs, got))
    if not direct:                        # the FFTs' 1/n on irfft's output (torch's place): the same numbers
        monkeypatch.setenv("MIXZOO_HYENA_FFT_SCALE", "output")
        assert all(torch.equal(a, w) for a, w in zip(fused(), got))


@pytest.mark.parametrize("L", [128, 512])
def test_stacked_graphed_training_with_the_operator_matches_separate_runs(L, monkeypatch):
    """As test_stacked_training_at_512_matches_separate_runs, stacked+graphed, with the operator as one Function
    (MIXZOO_HYENA_OP=fused) at a Toeplitz length (128) and an FFT length (512): every run names ``hyenaop``."""
    monkeypatch.setenv("MIXZOO_EAGER_KERNELS", "1")
    monkeypatch.setenv("MIXZOO_HYENA_OP", "fused")
    from mixzoo.models import RECIPES, ModelConfig
    from mixzoo.tasks.mad import MADRecall
    from mixzoo.train import TrainConfig, train
    from mixzoo.train.stacked import train_stacked
    task = MADRecall(L=L)
    data = {split: task.generate(split, n, 0, "cuda") for split, n in (("train", 256), ("val", 32), ("test", 32))}
    cfg = dict(steps=20, batch_size=32, eval_every=5, eval_batch_size=32)
    mcfg = ModelConfig(**RECIPES["mad"])
    cfgs = [TrainConfig(**cfg, lr=lr, step_mode="stacked+graphed") for lr in (5e-4, 1e-3, 2e-3)]
    stacked = train_stacked(task, "hyena", {}, mcfg, cfgs, [0, 1, 2], device="cuda", data=data)
    assert [r.step_mode for r in stacked] == ["stacked+graphed"] * 3, stacked[0].step_mode_reason
    worst = 0.0
    for c, s, r in zip(cfgs, [0, 1, 2], stacked):
        alone = train(task, "hyena", {}, mcfg, TrainConfig(**cfg, lr=c.lr), seed=s, device="cuda", data=data)
        assert r.state == alone.state == "COMPLETE"
        assert "hyenaop" in (r.kernels or "") and "hyenaop" in (alone.kernels or ""), (r.kernels, alone.kernels)
        a, b = alone.history, r.history
        worst = max(worst, max(abs(x["train_loss"] - y["train_loss"]) / abs(x["train_loss"]) for x, y in zip(a, b)))
    print(f"operator stacked+graphed-K3-vs-separate[hyena, length {L}]: largest relative difference {worst:.2e}")
    assert worst < 2e-2


@pytest.mark.parametrize("T", [128, 256])
def test_bf16x3_toeplitz_products_against_float64_and_timed(T, monkeypatch):
    """Hyena's operator at the Toeplitz lengths, at MAD's stacked shape (G = 6 models folded, batch 128, 128 channels,
    order 2), u, h, b float32: with the Toeplitz products in bf16x3 (MIXZOO_HYENA_TOEPLITZ_MM=bf16x3: bf16 tensor-core
    GEMMs, float32 output and accumulation) the output and the gradients of u, h, b within 1e-4 relative (norm) of the
    operator in float64 at the same values, as on the CPU (tests/test_fftconv.py: 4e-6 to 1.5e-5 there, plain bf16
    products 2e-3 to 4e-3); fp32's errors printed beside. bf16x3's forward and backward replayed from a CUDA graph give
    the eager call's numbers. Then the operator's forward+backward timed with either form (u in bf16, as autocast hands
    it in training; layer_check.timed's eager loop: best of 2 rounds of 50 calls), printed."""
    from mixzoo import kernels
    from mixzoo.kernels import fftconv as F
    monkeypatch.setenv("MIXZOO_HYENA_OP", "fused")
    monkeypatch.delenv("MIXZOO_HYENA_LAYOUT", raising=False)        # the default, channels-first layout
    g = torch.Generator(device="cuda").manual_seed(T)
    G, B, C, N = 6, 128, 128, 2
    u = torch.randn(G, B, T, (N + 1) * C, device="cuda", generator=g)
    h = torch.randn(G, N, C, T, device="cuda", generator=g) * torch.exp(-torch.arange(T, device="cuda") / 100.)
    b = torch.randn(G, N, C, device="cuda", generator=g)
    do = torch.randn(G, B, T, C, device="cuda", generator=g)

    def step(ins, d):
        y = F._HyenaOperator.apply(*ins, True)
        return [y.detach(), *torch.autograd.grad(y, ins, d)]
    hi = [t.double().requires_grad_() for t in (u, h, b)]
    want = step(hi, do.double())
    del hi
    errs = {}
    for mm in ("fp32", "bf16x3"):
        monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", mm)
        kernels.reset()
        got = step([t.clone().requires_grad_() for t in (u, h, b)], do)
        errs[mm] = [rel(a, w) for a, w in zip(got, want)]
        assert ("toeplitz-bf16x3" in (kernels.ran() or "").split(",")) == (mm == "bf16x3"), kernels.ran()
    del want, got
    print(f"\nT={T} relative errors against float64 (y, du, dh, db): "
          + ", ".join(f"{mm} [{', '.join(f'{e:.1e}' for e in es)}]" for mm, es in errs.items()))
    assert max(errs["bf16x3"]) < 1e-4, errs

    ins = [t.clone().requires_grad_() for t in (u, h, b)]       # bf16x3 still on: eager against a graph's replay
    eager = step(ins, do)
    outs, _graph = _replayed(lambda: step(ins, do))
    assert all(torch.equal(a, w) for a, w in zip(outs, eager))
    del outs, _graph, eager

    ins = [u.to(torch.bfloat16).requires_grad_(), h.clone().requires_grad_(), b.clone().requires_grad_()]
    dob = do.to(torch.bfloat16)
    ms = {}
    for mm in ("fp32", "bf16x3"):
        monkeypatch.setenv("MIXZOO_HYENA_TOEPLITZ_MM", mm)
        ms[mm] = timed(lambda: step(ins, dob), graph=False)
    print(f"T={T} G={G} B={B} C={C} N={N} operator forward+backward ({torch.cuda.get_device_name()}): "
          f"fp32 {ms['fp32']:.3f} ms, bf16x3 {ms['bf16x3']:.3f} ms ({ms['fp32'] / ms['bf16x3']:.2f}x)")
