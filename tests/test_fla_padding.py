"""Padding head dimensions to fla's minimum dot width (``_fla.pad_heads``) is exact.

fla's Triton kernels need K >= 16; mixzoo pads narrower heads (the mad recipe's 16 heads of width 8)
with zeros and slices the output. On the CPU the kernels do not run, so each op's plain-PyTorch form
(the same math the kernel computes) is evaluated on padded and unpadded inputs: outputs and input
gradients must agree. The GPU test of the kernels themselves at those widths is in tests/gpu.
"""
import pytest
import torch

from mixzoo.models import _fla
from mixzoo.models._scan import gated_delta_chunk, simple_gla_chunk
from mixzoo.models.parallax import parallax_reference


def _grads(fn, ts):
    ts = [t.clone().requires_grad_(True) for t in ts]
    out = fn(*ts)
    out.pow(2).sum().backward()
    return out.detach(), [t.grad for t in ts]


def _check(op, ts, n_value_last=True, tol=1e-10):
    """``op`` on the inputs as they are and on pad_heads(inputs), output sliced to the value width."""
    D = ts[-1].shape[-1] if n_value_last else ts[0].shape[-1]
    out, g = _grads(op, ts)

    def padded(*xs):
        return op(*_fla.pad_heads(*xs))[..., :D]
    out_p, g_p = _grads(padded, ts)
    torch.testing.assert_close(out_p, out, rtol=tol, atol=tol)
    for a, b in zip(g_p, g):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_pad_heads_pads_only_narrow_heads():
    a, b = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 32)
    pa, pb = _fla.pad_heads(a, b)
    assert pa.shape[-1] == _fla.MIN_DOT and pb is b
    assert torch.equal(pa[..., :8], a) and not pa[..., 8:].any()
    # strided views come back contiguous, padded or not (fla's kernels take contiguous inputs)
    sa, sb = _fla.pad_heads(a.transpose(1, 2), b.transpose(1, 2))
    assert sa.is_contiguous() and sb.is_contiguous()
    assert torch.equal(sa[..., :8], a.transpose(1, 2)) and torch.equal(sb, b.transpose(1, 2))


@pytest.mark.parametrize("d", [4, 8])
def test_parallax_padding_exact(d):
    g = torch.Generator().manual_seed(0)
    q, r, k, v = (torch.randn(2, 3, 20, d, generator=g, dtype=torch.float64) for _ in range(4))
    _check(lambda q, r, k, v: parallax_reference(q, r, k, v, scale=d ** -0.5), [q, r, k, v])


def test_gla_padding_exact():
    ref = _fla.naive("gla", "naive_recurrent_gla")
    if ref is None:
        pytest.skip("flash-linear-attention is not installed")
    g = torch.Generator().manual_seed(1)
    B, T, H = 2, 24, 3
    q, k = (torch.randn(B, T, H, 4, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, 8, generator=g, dtype=torch.float64)
    gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, 4, generator=g, dtype=torch.float64)) / 16
    # fla's recurrence scales by (its K)^-1/2 and computes in float32; the kernel call passes the
    # unpadded scale, which the factor here restores
    _check(lambda q, k, gk, v: ref(q * (q.shape[-1] / 4) ** 0.5, k, v, gk)[0].double(), [q, k, gk, v],
           tol=1e-5)


def test_gated_delta_padding_exact():
    g = torch.Generator().manual_seed(2)
    B, H, T, d = 2, 3, 40, 8
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, T, d, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    gate = -torch.rand(B, H, T, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    _check(lambda q, k, v: gated_delta_chunk(q, k, v, gate, beta, scale=d ** -0.5, chunk=16), [q, k, v])


def test_simple_gla_padding_exact():
    g = torch.Generator().manual_seed(3)
    B, H, T = 2, 4, 40
    q, k = (torch.randn(B, H, T, 16, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, 8, generator=g, dtype=torch.float64)
    gate = -torch.rand(B, H, T, generator=g, dtype=torch.float64)
    _check(lambda q, k, v: simple_gla_chunk(q, k, v, gate, chunk=16), [q, k, v])
