"""CPU tests of the exact LLA reference (the oracle of the GPU kernels) and of the kernels' backward algebra."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mixzoo.kernels.lla.reference import lla_reference, lla_weights


def _qkv(T=20, D=6, B=2, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, D, generator=g, dtype=dtype) for _ in range(3)]


def _dense(q, k, v, lam, scale):
    """Moments about the query with the ridge λω, solved directly (FlashLLA's estimator, unnormalized)."""
    T, D = q.shape[-2:]
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    w = torch.exp(s - s.amax(-1, keepdim=True))
    om = w.sum(-1)
    d = k.unsqueeze(-3) - q.unsqueeze(-2)                               # (..., i, j, D)
    mu = (w.unsqueeze(-1) * d).sum(-2)
    sig = torch.einsum("...ij,...ijd,...ije->...ide", w, d, d) + lam * om[..., None, None] * torch.eye(D, dtype=q.dtype)
    rho = torch.linalg.solve(sig, mu.unsqueeze(-1)).squeeze(-1)
    delta = om - (mu * rho).sum(-1)
    sw = w * (1 - (d * rho.unsqueeze(-2)).sum(-1)) / delta.unsqueeze(-1)
    return sw @ v


@pytest.mark.parametrize("lam", [0.1, 1.0, 10.0])
def test_matches_moments_about_the_query(lam):
    q, k, v = _qkv()
    torch.testing.assert_close(lla_reference(q, k, v, ridge=lam), _dense(q, k, v, lam, 6 ** -0.5), rtol=1e-9, atol=1e-9)


def test_weights_sum_to_one_and_first_position():
    q, k, v = _qkv(T=12)
    w = lla_weights(q, k, ridge=0.5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 12, dtype=torch.float64))
    assert torch.all(w.triu(1) == 0)
    torch.testing.assert_close(lla_reference(q, k, v, ridge=0.5)[:, 0], v[:, 0])


def test_large_ridge_is_softmax_attention():
    q, k, v = _qkv()
    sm = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(lla_reference(q, k, v, ridge=1e9), sm, rtol=1e-6, atol=1e-6)


def test_chunking_and_per_token_ridge():
    q, k, v = _qkv(T=33)
    lam = torch.rand(2, 33, dtype=torch.float64) + 0.1
    a = lla_reference(q, k, v, ridge=lam, chunk=5)
    b = lla_reference(q, k, v, ridge=lam, chunk=33)
    torch.testing.assert_close(a, b)
    i = 17
    torch.testing.assert_close(a[:, i], lla_reference(q, k, v, ridge=lam[:, i:i + 1].expand(2, 33))[:, i])


def test_peaked_attention_finite():
    q, k, v = _qkv(T=40, D=8)
    out = lla_reference(q * 8, k, v, ridge=0.1)
    assert torch.isfinite(out).all()
    out32 = lla_reference(q.float() * 8, k.float(), v.float(), ridge=0.1)
    assert float((out32.double() - out).norm() / out.norm()) < 1e-3


def test_gradcheck():
    q, k, v = (t.requires_grad_() for t in _qkv(T=6, D=3, B=1))
    lam = torch.full((1, 6), 0.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c, r: lla_reference(a, b, c, ridge=r), (q, k, v, lam))


@pytest.mark.parametrize("lam", [0.1, 1.0, 10.0])
def test_kernel_backward_algebra(lam):
    """The closed-form backward the Triton kernels compute (centred form, one extra solve) equals autograd."""
    T, D = 18, 5
    q, k, v = (t[0] for t in _qkv(T=T, D=D, B=1, seed=3))
    q = q * 2
    g = torch.randn(T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    scale = D ** -0.5
    s = (q @ k.T * scale).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    a = torch.softmax(s, -1)
    kbar = a @ k
    C = torch.einsum("ij,jd,je->ide", a, k, k) - kbar[:, :, None] * kbar[:, None, :] + lam * torch.eye(D, dtype=q.dtype)
    y = torch.linalg.solve(C, (kbar - q)[..., None])[..., 0]
    psi = 1 - (y @ k.T - (y * kbar).sum(-1, keepdim=True))
    o = (a * psi) @ v
    gam = g @ v.T
    gbar = (a * gam).sum(-1, keepdim=True)
    nu = torch.linalg.solve(C, ((a * gam) @ k - gbar * kbar)[..., None])[..., 0]
    f = nu @ k.T - (nu * kbar).sum(-1, keepdim=True)
    P = a * ((gam - gbar - f) * psi + lam * (nu * y).sum(-1, keepdim=True))
    dq = nu + scale * P @ k
    dk = scale * P.T @ q - (a * psi).T @ nu + (a * (f - (gam - gbar))).T @ y
    dv = (a * psi).T @ g
    dlam = (nu * y).sum(-1)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    lt = torch.full((T,), lam, dtype=torch.float64, requires_grad=True)
    ref = lla_reference(*xs, ridge=lt)
    grads = torch.autograd.grad(ref, xs + [lt], g)
    torch.testing.assert_close(o, ref)
    for mine, theirs in zip((dq, dk, dv, dlam), grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-8, atol=1e-10)


def test_import_mixzoo_does_not_import_triton():
    code = "import sys, mixzoo, mixzoo.models.lla, mixzoo.kernels.lla; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_many_sequences_run_in_slices_with_the_same_numbers(monkeypatch):
    """A call whose key outer products exceed KK_BUDGET runs over slices of its first dimension
    (ttr passes thousands of sequences at once): same outputs and gradients, per-sequence ridges
    sliced with them."""
    import mixzoo.kernels.lla.reference as ref
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(5, 2, 16, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    lam = (torch.rand(5, 2, 16, generator=g, dtype=torch.float64) + 0.1).requires_grad_()
    whole = lla_reference(q, k, v, ridge=lam)
    want = torch.autograd.grad(whole.square().sum(), (q, k, v, lam))
    monkeypatch.setattr(ref, "KK_BUDGET", 2 * 2 * 16 * 16)          # two sequences' worth a slice
    sliced = lla_reference(q, k, v, ridge=lam)
    torch.testing.assert_close(sliced, whole, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(sliced.square().sum(), (q, k, v, lam)), want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lla_reference(q, k, v, ridge=0.5), _dense(q, k, v, 0.5, 0.5), rtol=1e-9, atol=1e-9)


def test_learned_ridge_refuses_cuda_graph_capture(monkeypatch):
    """A learned ridge's kernel precision is chosen on the host from last step's ridge: a captured
    graph would keep one level for good, so LLA raises while a capture is running (the graphed step
    mode then trains eagerly); a fixed ridge's level is constant and captures."""
    from mixzoo.models.lla import LocalLinearAttention
    m = LocalLinearAttention(16, num_heads=2, learn_ridge=True)
    lam = m.ridge()
    assert isinstance(m.precision(lam), int)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA graph"):
        m.precision(lam)
    fixed = LocalLinearAttention(16, num_heads=2, ridge=1.0)
    assert isinstance(fixed.precision(fixed.ridge()), int)
