"""Mamba-2's mamba-ssm SSD path, what the CPU can check: its reference (``mamba.ssd_reference``, the GPU
self-check's float64 answer) against the recurrence, the stacked fold of ``mamba_chunk_scan_combined`` (the K
models' heads and their B and C as the op's groups) against one call per model, the switch's validation and
the CPU layer's path. The kernels themselves run on a GPU only (tests/gpu/test_mixers_gpu.py)."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F


def scan_loop(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
              cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
              return_varlen_states=False):
    """``mamba_chunk_scan_combined``'s definition step by step, with its grouping: heads (B, T, H, P), B and C
    (B, T, G, N), head h reading group h // (H / G)."""
    Bs, T, H, P = x.shape
    r = H // B.shape[2]
    Bh, Ch = B.repeat_interleave(r, dim=2), C.repeat_interleave(r, dim=2)       # (B, T, H, N)
    dts = F.softplus(dt + dt_bias) if dt_softplus else dt
    h = x.new_zeros(Bs, H, P, B.shape[-1])
    ys = []
    for t in range(T):
        a = (A * dts[:, t]).exp()                                                # (B, H)
        h = a[..., None, None] * h + (dts[:, t, :, None] * x[:, t]).unsqueeze(-1) * Bh[:, t].unsqueeze(2)
        ys.append((h * Ch[:, t].unsqueeze(2)).sum(-1))
    y = torch.stack(ys, 1)
    return y if D is None else y + x * D[:, None]


def _inputs(K, Bs=2, T=11, H=3, P=4, N=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)          # noqa: E731
    return (r(K, Bs, T, H, P), r(K, Bs, T, H) * 0.5 - 1, -(torch.rand(K, H, generator=g, dtype=torch.float64) * 4 + 1),
            r(K, Bs, T, 1, N) * 0.5, r(K, Bs, T, 1, N) * 0.5, r(K, H), r(K, H) * 0.5)


def test_ssd_reference_is_the_recurrence():
    from mixzoo.models.mamba import ssd_reference
    x, dt, A, Bm, Cm, D, dtb = (t[0] for t in _inputs(1, T=37))
    want = scan_loop(x, dt, A, Bm, Cm, 16, D=D, dt_bias=dtb, dt_softplus=True)
    for chunk in (8, 16, 64):
        got = ssd_reference(x, dt, A, Bm, Cm, D, dtb, chunk=chunk)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_stacked_fold_groups_the_models_b_and_c():
    """Under vmap the op is one call with the K models' heads side by side and their B, C as K groups; output and
    every gradient equal K separate calls."""
    from mixzoo.train.vmapfold import foldable
    calls = []

    def op(*a, **kw):
        calls.append((tuple(a[0].shape), tuple(a[3].shape), tuple(a[2].shape)))
        return scan_loop(*a, **kw)
    op.__signature__ = inspect.signature(scan_loop)      # the fold names arguments by the op's signature
    folded = foldable(op, "mamba_chunk_scan_combined")
    K = 3
    ins = [t.requires_grad_() for t in _inputs(K)]
    dy = torch.randn(K, 2, 11, 3, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y = torch.func.vmap(lambda x, dt, A, B, C, D, b: folded(x, dt, A, B, C, 64, D=D, dt_bias=b, dt_softplus=True))(*ins)
    assert calls == [((2, 11, K * 3, 4), (2, 11, K, 5), (K * 3,))], calls
    got = torch.autograd.grad(y, ins, dy)
    sep = [t.detach().clone().requires_grad_() for t in ins]
    ys = torch.stack([scan_loop(*(t[k] for t in sep[:5]), 64, D=sep[5][k], dt_bias=sep[6][k], dt_softplus=True)
                      for k in range(K)])
    want = torch.autograd.grad(ys, sep, dy)
    torch.testing.assert_close(y, ys)
    for gg, w in zip(got, want):
        torch.testing.assert_close(gg, w)


def test_ssd_scan_gives_the_reference():
    """``ssd_scan`` (how the layer calls the op), with the op's definition step by step, is ``ssd_reference`` with
    A = -exp(A_log): output and every gradient."""
    from mixzoo.models.mamba import ssd_reference, ssd_scan
    x, dt, A, Bm, Cm, D, dtb = (t[0] for t in _inputs(1, T=23))
    A_log = (-A).log()
    ins = [t.clone().requires_grad_() for t in (x, dt, A_log, Bm[:, :, 0], Cm[:, :, 0], D, dtb)]
    got = ssd_scan(scan_loop, ins[0], ins[1], ins[2], ins[6], ins[5], ins[3], ins[4], 16)
    ref = [t.clone().requires_grad_() for t in ins]
    want = ssd_reference(ref[0], ref[1], -ref[2].exp(), ref[3].unsqueeze(2), ref[4].unsqueeze(2), ref[5], ref[6])
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=1e-10, atol=1e-10)
    for gg, w in zip(torch.autograd.grad(got, ins, dy), torch.autograd.grad(want, ref, dy)):
        torch.testing.assert_close(gg, w, rtol=1e-9, atol=1e-10)


def test_ssd_models_per_call_keeps_torch_cumsum_rows_in_range(monkeypatch):
    """At the mad recipe (batch 128, 16 heads, chunk 64) six stacked models fit one call at length 128 (24,576
    rows of the cumsum), and run 4 + 2 at 256, 2 + 2 + 2 at 512, one a call at 1024; the switch keeps one call."""
    from mixzoo.train.vmapfold import scan_rows_limit, ssd_models_per_call
    assert scan_rows_limit(64) == scan_rows_limit(63) == 32768 and scan_rows_limit(16) == 8192
    x = lambda T: torch.empty(128, T, 16, 16)                                            # noqa: E731
    assert [ssd_models_per_call(6, {"x": x(T), "chunk_size": 64}) for T in (128, 256, 512, 1024, 2048)] == [6, 4, 2, 1, 1]
    assert ssd_models_per_call(6, {"x": x(1000), "chunk_size": 64}) == 1
    monkeypatch.setenv("MIXZOO_MAMBA_SSD_FOLD", "whole")
    assert ssd_models_per_call(6, {"x": x(1024), "chunk_size": 64}) == 6


@pytest.mark.parametrize("fold,calls", [("split", [2, 2, 1]), ("whole", [5])])
def test_stacked_ssd_scan_runs_in_groups_of_models(fold, calls, monkeypatch):
    """Under vmap ``ssd_scan`` is one call of the op per group of models (here the scan's row limit made tiny, so
    that two models fit a call), each with the group's heads side by side (their A, D, dt_bias per model) and
    their B, C as its groups; output and every gradient equal K separate calls, and the output is in the stacked
    (K, B, T, H, P) layout."""
    from mixzoo.models.mamba import ssd_scan
    from mixzoo.train import vmapfold
    from mixzoo.train.vmapfold import foldable
    monkeypatch.setenv("MIXZOO_MAMBA_SSD_FOLD", fold)
    K, Bs, T, H, P = 5, 2, 11, 3, 4                     # rows a model: 2 x 3 x 1 chunk = 6
    monkeypatch.setattr(vmapfold, "SCAN_LOG_THREADS", -2)   # at most 2^(-2 + 6) = 16 rows a call: 2 models
    seen = []

    def op(*a, **kw):
        seen.append((tuple(a[0].shape), tuple(a[2].shape), tuple(a[3].shape)))
        return scan_loop(*a, **kw)
    op.__signature__ = inspect.signature(scan_loop)
    folded_op = foldable(op, "mamba_chunk_scan_combined")
    x, dt, A, Bm, Cm, D, dtb = _inputs(K)
    ins = [t.requires_grad_() for t in (x, dt, (-A).log(), Bm[:, :, :, 0], Cm[:, :, :, 0], D, dtb)]
    y = torch.func.vmap(lambda x, dt, al, b, c, d, db: ssd_scan(folded_op, x, dt, al, db, d, b, c, 64))(*ins)
    assert seen == [((Bs, T, g * H, P), (g * H,), (Bs, T, g, 5)) for g in calls], seen
    assert y.shape == (K, Bs, T, H, P)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = torch.autograd.grad(y, ins, dy)
    sep = [t.detach().clone().requires_grad_() for t in ins]
    ys = torch.stack([ssd_scan(scan_loop, sep[0][k], sep[1][k], sep[2][k], sep[6][k], sep[5][k], sep[3][k], sep[4][k], 64)
                      for k in range(K)])
    want = torch.autograd.grad(ys, sep, dy)
    torch.testing.assert_close(y.double(), ys.double())
    for gg, w in zip(got, want):
        torch.testing.assert_close(gg, w)


def test_fold_in_groups_returns_tuples():
    """``FoldSpec.per_call`` on an op with several outputs: each tensor output concatenated over the groups on a
    leading model dimension, a None output (a final state not asked for) passed through."""
    from mixzoo.train.vmapfold import FoldSpec, foldable
    sizes = []

    def op(x, w):
        sizes.append(x.shape[0])
        return x * w, None, x.sum(-1)
    f = foldable(op, "three_outputs", FoldSpec(per_call=lambda K, a: 3))
    x, w = torch.randn(7, 2, 5, requires_grad=True), torch.randn(5)
    a, none, b = torch.func.vmap(lambda x: f(x, w), in_dims=1, out_dims=(1, None, 1))(x.transpose(0, 1))
    assert sizes == [6, 6, 2] and none is None and a.shape == (2, 7, 5) and b.shape == (2, 7)
    torch.testing.assert_close(a, (x * w).transpose(0, 1))
    torch.testing.assert_close(b, x.sum(-1).transpose(0, 1))
    (g,) = torch.autograd.grad(a.sum() + b.sum(), [x])
    torch.testing.assert_close(g, (w + 1).expand_as(x))


def test_switch_is_validated_and_the_cpu_layer_runs_torch_chunk(monkeypatch):
    from mixzoo import kernels
    from mixzoo.registry import build_mixer, get_mixer
    monkeypatch.setenv("MIXZOO_MAMBA_SSD", "triton")
    assert "MIXZOO_MAMBA_SSD" in kernels.switch_error() and "mamba-ssm, torch-chunk" in kernels.switch_error()
    monkeypatch.setenv("MIXZOO_MAMBA_SSD", "torch-chunk")
    assert kernels.switch_error() is None
    monkeypatch.setenv("MIXZOO_MAMBA_SSD_FOLD", "halves")
    assert "MIXZOO_MAMBA_SSD_FOLD" in kernels.switch_error() and "split, whole" in kernels.switch_error()
    monkeypatch.delenv("MIXZOO_MAMBA_SSD_FOLD")
    monkeypatch.delenv("MIXZOO_MAMBA_SSD")
    m = build_mixer(get_mixer("mamba"), 32, num_heads=4, layer_idx=0, l_max=20)
    m(torch.randn(2, 20, 32))
    assert m.backend == "torch-chunk"
    m = build_mixer(get_mixer("mamba"), 32, num_heads=4, layer_idx=0, l_max=20, backend="mamba-ssm")
    with pytest.raises(RuntimeError, match="mamba-ssm's Triton SSD cannot run here"):
        m(torch.randn(2, 20, 32))
