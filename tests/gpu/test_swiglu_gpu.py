"""mixzoo's fused SwiGLU kernels on the GPU (``mixzoo.kernels.swiglu``, the default there;
``MIXZOO_SWIGLU=torch`` asks for the PyTorch form): the self-check that enables them passes, they give
the PyTorch form's numbers at the mad recipe's MLP width in bf16 (no less accurate against float64),
the MLP under autocast takes them, and stacked training folds them into one call. Prints the
forward+backward time of both forms at MAD's baseline shape (128 x 128 tokens, 2 x 341 channels)."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def test_kernels_match_the_pytorch_form_here():
    from mixzoo.kernels import swiglu as S
    assert S.usable(torch.cuda.current_device())
    g = torch.Generator(device="cuda").manual_seed(0)
    h = (torch.randn(128, 128, 2 * 341, device="cuda", generator=g) * 2).bfloat16()
    do = torch.randn(128, 128, 341, device="cuda", generator=g).bfloat16()
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
    from mixzoo.models.backbones import MLP
    from mixzoo.train.vmapfold import folding
    calls = []
    fwd = swiglu_triton.forward
    monkeypatch.setattr(swiglu_triton, "forward", lambda h: calls.append(tuple(h.shape)) or fwd(h))
    torch.manual_seed(0)
    ms = [MLP(128, "swiglu", 4.0).cuda() for _ in range(4)]
    x = torch.randn(4, 8, 128, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = torch.stack([m(xi) for m, xi in zip(ms, x)])
        assert calls == [(8, 128, 682)] * 4
        calls.clear()
        params, bufs = stack_module_state(ms)
        with folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
    assert calls == [(32, 128, 682)]
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-3)


def test_fused_and_pytorch_forms_timed_side_by_side():
    from mixzoo.kernels import swiglu as S
    h = torch.randn(128, 128, 2 * 341, device="cuda").bfloat16().requires_grad_()
    do = torch.randn(128, 128, 341, device="cuda").bfloat16()
    ms = {}
    for _ in range(2):                                  # two rounds, alternating
        for name, fn in (("torch", S.swiglu_torch), ("kernel", S.swiglu)):
            for _ in range(3):
                fn(h).backward(do)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                fn(h).backward(do)
            end.record()
            torch.cuda.synchronize()
            ms.setdefault(name, []).append(start.elapsed_time(end) / 50)
    best = {k: min(v) for k, v in ms.items()}
    print(f"\nswiglu forward+backward at 128 x 128 x 2*341 bf16: PyTorch form {best['torch']:.3f} ms, "
          f"kernels {best['kernel']:.3f} ms ({best['torch'] / best['kernel']:.2f}x)")
    assert best["kernel"] < best["torch"]
