import pytest
import torch

from mixzoo.kernels.lla import lla_reference, lla_weights


def direct_ridge_intercept(q, k, v, lam, scale):
    """Float64 direct solve of min_{b,W} Σ_j a_j ||v_j - b - W(k_j - q)||² + λ||W||², j <= i."""
    T, D = q.shape
    out = torch.empty(T, v.shape[1], dtype=torch.float64)
    for i in range(T):
        a = torch.softmax(scale * (k[: i + 1] @ q[i]), 0)
        X = torch.cat([torch.ones(i + 1, 1, dtype=torch.float64), k[: i + 1] - q[i]], 1)
        A = X.T @ (a[:, None] * X)
        A[1:, 1:] += lam * torch.eye(D, dtype=torch.float64)   # no penalty on the intercept
        beta = torch.linalg.solve(A, X.T @ (a[:, None] * v[: i + 1]))
        out[i] = beta[0]
    return out


@pytest.mark.parametrize("lam", [0.05, 1.0, 10.0])
def test_lla_equals_direct_weighted_ridge(lam):
    g = torch.Generator().manual_seed(0)
    T, D = 23, 5
    q, k, v = (torch.randn(T, D, generator=g, dtype=torch.float64) for _ in range(3))
    scale = D ** -0.5
    ref = direct_ridge_intercept(q, k, v, lam, scale)
    out = lla_reference(q[None], k[None], v[None], ridge=lam, chunk=7)[0]
    assert torch.allclose(out, ref, atol=1e-9, rtol=1e-9)


def test_lla_weights_sum_to_one_and_match_output():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 17, 4, generator=g, dtype=torch.float64) for _ in range(3))
    w = lla_weights(q, k, ridge=0.3, chunk=5)
    assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-10)
    assert torch.all(w.triu(1) == 0)                 # causal
    assert (w < 0).any()                             # weights can be negative
    out = lla_reference(q, k, v, ridge=0.3)
    assert torch.allclose(w @ v, out, atol=1e-10)


def test_lla_tends_to_softmax_as_ridge_grows():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 31, 8, generator=g, dtype=torch.float64) for _ in range(3))
    sm = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    errs = [(lla_reference(q, k, v, ridge=lam) - sm).abs().max().item() for lam in (1.0, 1e2, 1e4, 1e8)]
    assert errs[0] > 1e-3
    assert errs == sorted(errs, reverse=True)
    assert errs[-1] < 1e-6


def test_lla_per_head_ridge_and_gradients():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    lam = torch.tensor([0.5, 2.0], dtype=torch.float64)[None, :, None]
    out = lla_reference(q, k, v, ridge=lam)
    for h, l_h in enumerate((0.5, 2.0)):
        single = lla_reference(q[:, h], k[:, h], v[:, h], ridge=l_h)
        assert torch.allclose(out[:, h], single, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b, c: lla_reference(a, b, c, ridge=0.7), (q, k, v))


def test_lla_first_position_is_its_value():
    q, k, v = (torch.randn(1, 6, 4) for _ in range(3))
    out = lla_reference(q, k, v, ridge=1.0)
    assert torch.allclose(out[0, 0], v[0, 0], atol=1e-5)
