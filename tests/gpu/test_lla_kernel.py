"""The Triton LLA kernels against the float64 reference (GPU only)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from mixzoo.kernels.lla.reference import lla_reference  # noqa: E402
from mixzoo.kernels.lla.triton_lla import lla  # noqa: E402


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _case(B, H, T, D, lam, qscale, dtype, seed, ridge_tensor=False, solve=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, go = (torch.randn(B, H, T, D, device="cuda", generator=g) for _ in range(4))
    q, k, v = (q * qscale).to(dtype), k.to(dtype), v.to(dtype)
    ridge = torch.full((B, H, T), lam, device="cuda", requires_grad=True) if ridge_tensor else lam
    xd = [t.double().requires_grad_() for t in (q, k, v)]
    rd = ridge.detach().double().requires_grad_() if ridge_tensor else lam
    ref = lla_reference(*xd, ridge=rd)
    wrt = xd + ([rd] if ridge_tensor else [])
    rg = torch.autograd.grad(ref, wrt, go.double())
    xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = lla(*xs, ridge=ridge, solve=solve)
    assert out.shape == (B, H, T, D) and out.dtype == dtype
    wrt = xs + ([ridge] if ridge_tensor else [])
    gs = torch.autograd.grad(out, wrt, go.to(dtype))
    return out, ref, gs, rg


# λ spans the lla search space (log-uniform 1e-2..1e2) and every precision level of the kernel
# (triton_lla.PREC_BELOW: 0 at λ >= 10, 1 at 3 <= λ < 10, 2 at 0.1 <= λ < 3, 3 below).
RIDGES = [0.01, 0.1, 1.0, 10.0, 100.0]


@pytest.mark.parametrize("lam", RIDGES)
@pytest.mark.parametrize("qscale", [1.0, 4.0])
@pytest.mark.parametrize("D", [64, 128])
def test_forward_backward_bf16(lam, qscale, D):
    out, ref, gs, rg = _case(2, 2, 300, D, lam, qscale, torch.bfloat16, seed=D + int(10 * lam))
    assert not out.isnan().any() and not any(g.isnan().any() for g in gs)
    assert _rel(out, ref) < 1e-2
    for g, r in zip(gs, rg):
        assert _rel(g, r) < 2e-2


@pytest.mark.parametrize("lam", [0.01, 1.0, 5.0])
@pytest.mark.parametrize("D", [16, 32])
def test_forward_backward_bf16_small_head(lam, D):
    """Small head dims at the small-ridge levels (PREC 3, 2, 1), peaked attention."""
    out, ref, gs, rg = _case(2, 2, 300, D, lam, 4.0, torch.bfloat16, seed=D + int(10 * lam))
    assert not out.isnan().any() and not any(g.isnan().any() for g in gs)
    assert _rel(out, ref) < 1e-2
    for g, r in zip(gs, rg):
        assert _rel(g, r) < 2e-2


@pytest.mark.parametrize("lam", RIDGES)
def test_early_positions(lam):
    """The first rows see one to a few keys: no NaN and the same accuracy there."""
    out, ref, gs, rg = _case(1, 4, 96, 64, lam, 4.0, torch.bfloat16, seed=7)
    assert torch.isfinite(out).all()
    assert _rel(out[..., :8, :], ref[..., :8, :]) < 1e-2
    torch.testing.assert_close(out[..., 0, :].float(), ref[..., 0, :].float(), atol=2e-2, rtol=2e-2)  # o_0 = v_0
    assert _rel(gs[2][..., :8, :], rg[2][..., :8, :]) < 2e-2


def test_fp16_padded_head_dim_and_ridge_grad():
    out, ref, gs, rg = _case(1, 2, 200, 48, 1.0, 1.0, torch.float16, seed=3, ridge_tensor=True)
    assert _rel(out, ref) < 1e-2
    for g, r in zip(gs, rg):
        assert _rel(g, r) < 2e-2


def test_long_sequence_one_config():
    out, ref, gs, rg = _case(1, 1, 2048, 128, 10.0, 1.0, torch.bfloat16, seed=11)
    assert _rel(out, ref) < 1e-2
    for g, r in zip(gs, rg):
        assert _rel(g, r) < 2e-2


def test_mechanism_uses_kernel_on_gpu():
    from mixzoo.models.lla import LocalLinearAttention
    m = LocalLinearAttention(64, num_heads=2).cuda()
    x = torch.randn(2, 128, 64, device="cuda")
    y = m(x)
    assert m.backend == "triton-cg"                     # heads of 32 dims: conjugate gradients
    y.sum().backward()
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("lam", RIDGES)
def test_backward_at_tiny_output_gradient(lam):
    """Output gradients of 1e-23 (rows of the loss that barely depend on the layer; the H200's mqar512
    step 1047 had them): the backward must be the same numbers scaled, never CG in the subnormals."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, go = (torch.randn(2, 2, 256, 64, device="cuda", generator=g) for _ in range(4))
    q, k, v = (t.bfloat16() for t in (q, k, v))
    grads = {}
    for scale in (1.0, 1e-23):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        gs = torch.autograd.grad(lla(*xs, ridge=lam), xs, (go * scale).bfloat16())
        grads[scale] = [t.double() / scale for t in gs]
        assert all(torch.isfinite(t).all() for t in gs)
    for name, a, b in zip(("dq", "dk", "dv"), grads[1.0], grads[1e-23]):
        assert _rel(b, a) < 1e-2, (lam, name, _rel(b, a))


@pytest.mark.parametrize("lam", RIDGES)
@pytest.mark.parametrize("qscale", [1.0, 4.0])
@pytest.mark.parametrize("D", [8, 5])
def test_direct_solve_small_head(lam, qscale, D):
    """Heads of at most 8 dims (the mad recipe's 16 heads of 8) solve C y = b explicitly in registers
    (triton_lla._direct_solve): as close to float64 as the other tests ask, at every precision level, and no
    worse than CG on the same inputs."""
    seed = 100 + D + int(10 * lam)
    out, ref, gs, rg = _case(2, 4, 300, D, lam, qscale, torch.bfloat16, seed=seed, solve="direct")
    cg_out, _, cg_gs, _ = _case(2, 4, 300, D, lam, qscale, torch.bfloat16, seed=seed, solve="cg")
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in gs)
    errs = [_rel(out, ref)] + [_rel(g, r) for g, r in zip(gs, rg)]
    cg = [_rel(cg_out, ref)] + [_rel(g, r) for g, r in zip(cg_gs, rg)]
    print(f"D {D} λ {lam} q x {qscale}: o, dq, dk, dv errors direct {errs}, cg {cg}")
    assert errs[0] < 1e-2 and max(errs[1:]) < 2e-2
    for e, c in zip(errs, cg):
        assert e < 2 * c + 2e-3


@pytest.mark.parametrize("lam", [0.01, 1.0, 100.0])
def test_direct_solve_early_positions_and_long_sequence(lam):
    """The first rows (one to a few keys) and a sequence of 2048 at head dim 8."""
    out, ref, gs, rg = _case(1, 4, 96, 8, lam, 4.0, torch.bfloat16, seed=7, solve="direct")
    assert torch.isfinite(out).all()
    assert _rel(out[..., :8, :], ref[..., :8, :]) < 1e-2
    torch.testing.assert_close(out[..., 0, :].float(), ref[..., 0, :].float(), atol=2e-2, rtol=2e-2)
    assert _rel(gs[2][..., :8, :], rg[2][..., :8, :]) < 2e-2
    out, ref, gs, rg = _case(1, 2, 2048, 8, lam, 1.0, torch.bfloat16, seed=11, solve="direct")
    assert _rel(out, ref) < 1e-2
    for g, r in zip(gs, rg):
        assert _rel(g, r) < 2e-2


def test_direct_solve_at_tiny_output_gradient():
    """Output gradients of 1e-23: the direct ν solve scales its right-hand side as CG does."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, go = (torch.randn(2, 4, 256, 8, device="cuda", generator=g) for _ in range(4))
    q, k, v = (t.bfloat16() for t in (q, k, v))
    grads = {}
    for scale in (1.0, 1e-23):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        gs = torch.autograd.grad(lla(*xs, ridge=1.0, solve="direct"), xs, (go * scale).bfloat16())
        assert all(torch.isfinite(t).all() for t in gs)
        grads[scale] = [t.double() / scale for t in gs]
    for a, b in zip(grads[1.0], grads[1e-23]):
        assert float((a - b).norm() / a.norm()) < 1e-2


@pytest.mark.parametrize("lam", RIDGES)
def test_direct_solve_onepass_output(lam, monkeypatch):
    """The output formed from moments of the forward's first pass (Σ a v, Σ a v kᵀ; ``onepass``): as close to
    float64 as the two-pass output, peaked attention, at every precision level."""
    from mixzoo.kernels.lla import triton_lla as K
    seed = 300 + int(10 * lam)
    monkeypatch.setitem(K.DEFAULTS, "onepass", False)
    two, ref, _, _ = _case(2, 4, 300, 8, lam, 4.0, torch.bfloat16, seed=seed, solve="direct")
    monkeypatch.setitem(K.DEFAULTS, "onepass", True)
    one, _, gs, rg = _case(2, 4, 300, 8, lam, 4.0, torch.bfloat16, seed=seed, solve="direct")
    print(f"λ {lam}: o error one pass {_rel(one, ref):.2e}, two passes {_rel(two, ref):.2e}")
    assert torch.isfinite(one).all()
    assert _rel(one, ref) < 1e-2 and _rel(one, ref) < 2 * _rel(two, ref) + 2e-3
    for g, r in zip(gs, rg):
        assert _rel(g, r) < 2e-2


@pytest.mark.parametrize("lam", RIDGES)
def test_direct_solve_h_from_forward(lam, monkeypatch):
    """The backward's right-hand side h = Σ_VKᵀ g from the forward's moments (``h_from_forward``, the default: the
    forward one pass, the query pass without its pass before the solve) against h summed over the keys again
    (``MIXZOO_LLA_H=summed``): output and gradients as close to float64 at every precision level, peaked attention,
    no worse than the summed form (smaller at level 0, where the summed h takes its weights in one bf16 part)."""
    from mixzoo.kernels.lla import triton_lla as K
    seed = 400 + int(10 * lam)
    errs = {}
    for form in ("summed", "forward"):
        monkeypatch.setenv("MIXZOO_LLA_H", form)
        out, ref, gs, rg = _case(2, 4, 300, 8, lam, 4.0, torch.bfloat16, seed=seed, solve="direct")
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in gs)
        errs[form] = [_rel(out, ref)] + [_rel(g, r) for g, r in zip(gs, rg)]
    assert K.h_from_forward() and K.c_from_forward()
    print(f"λ {lam}: o, dq, dk, dv errors h from the forward {errs['forward']}, summed again {errs['summed']}")
    assert errs["forward"][0] < 1e-2 and max(errs["forward"][1:]) < 2e-2
    for a, b in zip(errs["forward"], errs["summed"]):
        assert a <= 1.1 * b + 5e-4


@pytest.mark.parametrize("B,T", [(768, 1024), (768, 128)])
def test_strided_heads_equal_the_padded_copies(B, T, monkeypatch):
    """The heads of 8 as views of a (B, T, 3·128) projection, λ per head through zero strides, handed over contiguous
    per head and as they lie (``MIXZOO_LLA_HEADS=strided``, the default), against the padded contiguous copies: the
    output and the gradients of the projection and of λ equal up to float32's
    summation order (on an H100 the output was equal bit for bit, the projection's gradient not); the three timed side
    by side (forward+backward, the copies included).
    B = 768 is the stacked step's batch (6 models x 128) of MAD's shape."""
    import triton.testing
    H, D = 16, 8
    g = torch.Generator(device="cuda").manual_seed(2)
    qkv0 = torch.randn(B, T, 3 * H * D, device="cuda", generator=g).bfloat16()
    go = torch.randn(B, T, H * D, device="cuda", generator=g).bfloat16()
    lam0 = torch.rand(1, H, 1, device="cuda", generator=g) + 0.5

    def run(mode):
        monkeypatch.setenv("MIXZOO_LLA_HEADS", mode)
        qkv, lam = qkv0.clone().requires_grad_(), lam0.clone().requires_grad_()
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        o = lla(q, k, v, ridge=lam.expand(B, -1, 1)).transpose(1, 2).reshape(B, T, H * D)
        return [o] + list(torch.autograd.grad(o, (qkv, lam), go))
    modes = ("contiguous", "strided", "padded")
    res = {m: run(m) for m in modes}
    for m in modes[:2]:
        # the same operations on the same numbers; on the GPU the compiled layouts of the three launches differ, and
        # with them the order of the float32 sums along a row (the interpreter test finds them equal bit for bit)
        for name, x, y in zip(("o", "dqkv", "dlam"), res[m], res["padded"]):
            assert x.shape == y.shape, (m, name)
            assert float((x.double() - y.double()).norm() / y.double().norm()) < 1e-3, (m, name)
    t = {m: triton.testing.do_bench(lambda m=m: run(m), warmup=5, rep=60, return_mode="median") for m in modes}
    print(f"\nlla B={B} T={T} heads of 8, forward+backward ms: " + ", ".join(f"{m} {v:.3f}" for m, v in t.items())
          + f" (padded / contiguous {t['padded'] / t['contiguous']:.2f}x)")
