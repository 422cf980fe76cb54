"""mixzoo's PyTorch stand-in for fla's gated chunk_bwd_dqkwg: against autograd of the chunk
equations in float64, and wired into fla's dispatcher."""
import math

import pytest
import torch

from mixzoo.kernels.fla_dqkwg import chunk_bwd_dqkwg_torch


def _oracle(q, k, v, do, h, dh, w, dv, g_nat, scale, BT):
    """Autograd of <o, do> + <h_next, dh> + <-w h, dv> per chunk, in float64 (natural-log g)."""
    q, k, w, g_nat = (t.detach().clone().double().requires_grad_() for t in (q, k, w, g_nat))
    v, do, h, dh, dv = (t.double() for t in (v, do, h, dh, dv))
    B, T, H, K = q.shape
    HV = v.shape[2]
    rep = HV // H
    total = 0.0
    for c in range(-(-T // BT)):
        sl = slice(c * BT, min(c * BT + BT, T))
        for hv in range(HV):
            hq = hv // rep
            qc, kc, gc = q[:, sl, hq], k[:, sl, hq], g_nat[:, sl, hv]        # (B, n, K), (B, n)
            vc, doc, dvc, wc = v[:, sl, hv], do[:, sl, hv], dv[:, sl, hv], w[:, sl, hv]
            S, dS = h[:, c, hv], dh[:, c, hv]                               # (B, K, V)
            n = qc.shape[1]
            decay = (gc[:, :, None] - gc[:, None, :]).exp() * torch.ones(n, n, dtype=torch.float64).tril()
            o = scale * (gc.exp()[..., None] * (qc @ S) + (decay * (qc @ kc.transpose(1, 2))) @ vc)
            gl = gc[:, -1:]
            S_next = gl.exp()[..., None] * S + ((gl - gc).exp()[..., None] * kc).transpose(1, 2) @ vc
            total = total + (o * doc).sum() + (S_next * dS).sum() - ((wc @ S) * dvc).sum()
    total.backward()
    return q.grad, k.grad, w.grad, g_nat.grad


@pytest.mark.parametrize("T,BT,H,HV", [(100, 32, 2, 2), (64, 16, 1, 2), (37, 64, 2, 2)])
def test_matches_autograd_of_the_chunk_equations(T, BT, H, HV):
    torch.manual_seed(0)
    B, K, V = 2, 16, 8
    NT = -(-T // BT)
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, do, dv = torch.randn(B, T, HV, V), torch.randn(B, T, HV, V), torch.randn(B, T, HV, V)
    w = torch.randn(B, T, HV, K)
    h, dh = torch.randn(B, NT, HV, K, V), torch.randn(B, NT, HV, K, V)
    # chunk-local cumulative log decay (natural units); fla passes it in log2 units
    raw = -torch.rand(B, T, HV) * 0.3
    g_nat = torch.cat([raw[:, c * BT:(c + 1) * BT].cumsum(1) for c in range(NT)], 1)
    scale = K ** -0.5
    dq, dk, dw, dg = chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g_nat / math.log(2), dv=dv,
                                           scale=scale, chunk_size=BT)
    rq, rk, rw, rg = _oracle(q, k, v, do, h, dh, w, dv, g_nat, scale, BT)
    for name, a, b in (("dq", dq, rq), ("dk", dk, rk), ("dw", dw, rw), ("dg", dg, rg)):
        assert a.shape == b.shape, name
        # fla's next kernels read these by raw offsets: they must be dense, not strided views
        assert a.is_contiguous(), f"{name} is a strided view (T={T}, chunk {BT})"
        err = (a.double() - b).abs().max() / b.abs().max()
        assert err < 1e-5, f"{name}: relative error {err:.2e}"


def test_state_v_first_layout_and_rejections():
    torch.manual_seed(1)
    B, T, H, K, V, BT = 1, 40, 1, 8, 4, 16
    q, k, w = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, do, dv = torch.randn(B, T, H, V), torch.randn(B, T, H, V), torch.randn(B, T, H, V)
    h, dh = torch.randn(B, 3, H, K, V), torch.randn(B, 3, H, K, V)
    g = -torch.rand(B, T, H)
    a = chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g, dv=dv, chunk_size=BT)
    b = chunk_bwd_dqkwg_torch(q, k, v, do, h.transpose(-1, -2), dh.transpose(-1, -2), w=w, g=g,
                              dv=dv, chunk_size=BT, state_v_first=True)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)
    with pytest.raises(ValueError):
        chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, g=None, chunk_size=BT)


def test_installs_into_fla_dispatch(monkeypatch):
    """Where fla refuses its kernel, fla's own dispatched entry point runs ours (CPU tensors)."""
    pytest.importorskip("fla")
    from mixzoo.kernels import fla_dqkwg
    assert fla_dqkwg.install()
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg
    monkeypatch.setattr(fla_dqkwg, "triton_refused", lambda: True)
    torch.manual_seed(2)
    B, T, H, K, V = 1, 64, 2, 16, 16
    q, k, w = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, do, dv = torch.randn(B, T, H, V), torch.randn(B, T, H, V), torch.randn(B, T, H, V)
    h, dh = torch.randn(B, 1, H, K, V), torch.randn(B, 1, H, K, V)
    g = -torch.rand(B, T, H).cumsum(1)
    got = chunk_bwd_dqkwg(q=q, k=k, v=v, w=w, g=g, h=h, dv=dv, do=do, dh=dh, scale=0.25)
    want = chunk_bwd_dqkwg_torch(q=q, k=k, v=v, w=w, g=g, h=h, dv=dv, do=do, dh=dh, scale=0.25)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y)


def test_float32_sums_under_autocast():
    """fla calls its backward under the forward's autocast state: bf16 autocast must not turn the
    float32 sums into bf16 matmuls (dg = q·dq - k·dk is a difference of them)."""
    torch.manual_seed(0)
    B, T, H, K, V, BT = 2, 96, 2, 16, 16, 32
    NT = -(-T // BT)
    bf = torch.bfloat16
    q, k = torch.randn(B, T, H, K).to(bf), torch.randn(B, T, H, K).to(bf)
    v, do, dv = (torch.randn(B, T, H, V).to(bf) for _ in range(3))
    w = torch.randn(B, T, H, K).to(bf)
    h, dh = torch.randn(B, NT, H, K, V).to(bf), torch.randn(B, NT, H, K, V)
    g = torch.cat([(-torch.rand(B, BT, H) * 0.3).cumsum(1) for _ in range(NT)], 1) / math.log(2)
    plain = chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g, dv=dv, chunk_size=BT)
    with torch.autocast("cpu", dtype=bf):
        auto = chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g, dv=dv, chunk_size=BT)
    for name, a, b in zip(("dq", "dk", "dw", "dg"), plain, auto):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_few_kernel_launches():
    """This step runs once per gated fla backward and is launch-bound at the mad recipe's shapes on a
    GPU: after the first call (its constant masks are made once per length and chunk), at most 56
    operations that launch a kernel (78 before they were cached and the copies fused)."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    views = {"view", "transpose", "expand", "unsqueeze", "_unsafe_view", "alias", "slice", "select", "t",
             "permute", "squeeze", "detach", "empty"}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    B, T, H, K, V, BT = 2, 128, 4, 16, 16, 64
    bf = torch.bfloat16
    q, k, w = (torch.randn(B, T, H, K).to(bf) for _ in range(3))
    v, do, dv = (torch.randn(B, T, H, V).to(bf) for _ in range(3))
    h, dh = torch.randn(B, 2, H, K, V).to(bf), torch.randn(B, 2, H, K, V)
    g = torch.cat([(-torch.rand(B, BT, H) * 0.3).cumsum(1) for _ in range(2)], 1) / math.log(2)
    chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g, dv=dv, chunk_size=BT)
    with Count() as c:
        chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g, dv=dv, chunk_size=BT)
    launches = sum(n for op, n in c.n.items() if op not in views)
    assert launches <= 56, sorted(c.n.items())
