"""GPU checks of the mechanisms: fast paths against references (bf16), the contract on CUDA,
and the speed budget (forward+backward <= 10 ms at batch 8, length 1024, width 128, 2 heads)."""
from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

NAMES = ["softmax", "lla", "parallax", "mesa", "gdn", "mamba", "gla", "hyena", "linear"]
BUDGET_MS = 10.0


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda").to(dtype)


@pytest.mark.parametrize("T", [64, 200])
def test_torch_chunk_scans_match_recurrence_on_gpu(T):
    from mixzoo.models._scan import gated_delta_chunk, gated_delta_recurrent, simple_gla_chunk, simple_gla_recurrent
    torch.manual_seed(0)
    B, H, K, V = 2, 2, 32, 32
    q, v = _rand(B, H, T, K), _rand(B, H, T, V)
    k = torch.nn.functional.normalize(_rand(B, H, T, K).float(), dim=-1).to(torch.bfloat16)
    g = -torch.rand(B, H, T, device="cuda") * 0.3
    beta = torch.rand(B, H, T, device="cuda") * 2
    neg = torch.rand(B, H, T, device="cuda") < 0.3
    for got, want in [
        (gated_delta_chunk(q, k, v, g, beta), gated_delta_recurrent(q, k, v, g, beta)),
        (simple_gla_chunk(q, k, v, g), simple_gla_recurrent(q, k, v, g)),
        (simple_gla_chunk(q, k, v, g, neg=neg), simple_gla_recurrent(q, k, v, g, neg=neg)),
    ]:
        err = (got.float() - want.float()).norm() / want.float().norm()
        assert err < 2e-2, err


def test_gdn_torch_chunk_matches_fla_reference_on_gpu():
    from mixzoo.models._fla import naive
    from mixzoo.models._scan import gated_delta_chunk
    ref = naive("gated_delta_rule", "naive_recurrent_gated_delta_rule")
    if ref is None:
        pytest.skip("fla not installed")
    torch.manual_seed(0)
    B, H, T, K = 2, 2, 150, 32
    q, k, v = (torch.randn(B, T, H, K, device="cuda") for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    g, beta = -torch.rand(B, T, H, device="cuda") * 0.2, torch.rand(B, T, H, device="cuda")
    want, _ = ref(q=q, k=k, v=v, beta=beta, g=g, scale=K ** -0.5)
    tt = lambda t: t.transpose(1, 2)
    got = tt(gated_delta_chunk(tt(q), tt(k), tt(v), tt(g), tt(beta), scale=K ** -0.5))
    assert (got - want).abs().max() < 1e-3


@pytest.mark.parametrize("name,knobs", [(n, {}) for n in NAMES if n != "mesa"] + [
    ("gdn", {"allow_neg_eigval": True}), ("mamba", {"allow_neg_eigval": True}), ("mamba", {"version": 1})])
def test_contract_and_fast_path_on_gpu(name, knobs):
    from mixzoo.check import check_mixer
    results = check_mixer(name, knobs=knobs, device="cuda", d_model=64, seq_len=100)
    for r in results:
        print(name, knobs, r.status, r.check, r.detail)
    assert all(r.ok for r in results), [r for r in results if not r.ok]


@pytest.fixture(scope="module")
def bench_rows():
    from mixzoo.bench.mixers import bench_mixers, format_table, progress_line
    rows = bench_mixers(NAMES, batch=8, seq_len=1024, d_model=128, num_heads=2, warmup=3, iters=20,
                        log=lambda r: print(progress_line(r), flush=True))
    print("\n" + format_table(rows))
    out = os.environ.get("MIXZOO_BENCH_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return {r["mechanism"]: r for r in rows}


@pytest.mark.parametrize("name", NAMES)
def test_speed_budget(bench_rows, name):
    row = bench_rows[name]
    assert "error" not in row, row["error"]
    if name == "lla" and row["backend"] == "torch":
        pytest.skip(f"LLA Triton kernel absent; the exact reference took {row['ms']:.1f} ms")
    assert row["ms"] <= BUDGET_MS, f"{name} ({row['backend']}): {row['ms']:.2f} ms > {BUDGET_MS} ms"


def test_host_sync_detection():
    """Control for check-mixer's host-syncs check: a device read is reported, device work is not."""
    from mixzoo.check import host_syncs
    x = torch.ones(4, device="cuda")
    assert host_syncs(lambda: (x * 2).sum()) == []
    where = host_syncs(lambda: float(x.sum()))
    assert len(where) == 1, where


# fla's MesaNet kernels last: a kernel fault poisons the CUDA context for every later test
@pytest.mark.parametrize("l2norm", ["torch", "fla"])      # MIXZOO_MESA_L2NORM
@pytest.mark.parametrize("d_model,seq_len", [(128, 100), (64, 128)])
def test_mesa_contract_and_fast_path_on_gpu(d_model, seq_len, l2norm, monkeypatch):
    monkeypatch.setenv("MIXZOO_MESA_L2NORM", l2norm)
    from mixzoo.check import check_mixer
    results = check_mixer("mesa", device="cuda", d_model=d_model, seq_len=seq_len)
    for r in results:
        print("mesa", d_model, seq_len, r.status, r.check, r.detail)
    assert all(r.ok for r in results), [r for r in results if not r.ok]


# the mad recipe's heads (width 128 in 16 heads of 8) are narrower than fla's kernels take
# (tl.dot K >= 16): each fla path runs them zero-padded to 16 and must match its reference
# (Mamba-2's value heads of 16 there take torch-chunk: test_mamba_backend_by_head_width)
@pytest.mark.parametrize("name", ["parallax", "gla", "gdn"])
def test_fast_path_at_mad_head_width(name):
    from mixzoo.check import check_mixer
    results = check_mixer(name, device="cuda", d_model=128, num_heads=16, seq_len=100)
    for r in results:
        print(name, "16 heads", r.status, r.check, r.detail)
    assert all(r.ok for r in results), [r for r in results if not r.ok]


def test_mamba_backend_by_head_width(monkeypatch):
    """Mamba-2 takes fla's kernel for value heads of 64 or more; below, mamba-ssm's Triton SSD where installed
    (else torch-chunk), torch-chunk with MIXZOO_MAMBA_SSD=torch-chunk, and fla's kernel padded to 64 when asked
    for; each narrow path matches torch-chunk."""
    from mixzoo.check import _rel
    from mixzoo.models.mamba import ssd_op
    from mixzoo.registry import build_mixer, get_mixer
    x = torch.randn(2, 100, 128, generator=torch.Generator().manual_seed(0)).cuda()
    seen, ys = {}, {}
    for heads, backend, switch in ((2, "auto", None), (16, "auto", None), (16, "auto", "torch-chunk"),
                                   (16, "fla", None), (16, "torch", None)):
        if switch:
            monkeypatch.setenv("MIXZOO_MAMBA_SSD", switch)
        else:
            monkeypatch.delenv("MIXZOO_MAMBA_SSD", raising=False)
        torch.manual_seed(0)
        m = build_mixer(get_mixer("mamba"), 128, num_heads=heads, layer_idx=0, l_max=100, backend=backend).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ys[(heads, backend, switch)] = m(x).float()
        seen[(heads, backend, switch)] = m.backend
    print(seen)
    assert seen[(2, "auto", None)].startswith("fla-simple-gla"), seen
    assert seen[(16, "auto", None)] == ("mamba-ssm-ssd" if ssd_op() is not None else "torch-chunk"), seen
    assert seen[(16, "auto", "torch-chunk")] == seen[(16, "torch", None)] == "torch-chunk", seen
    assert seen[(16, "fla", None)].startswith("fla-simple-gla"), seen
    ref = ys[(16, "torch", None)]
    for key in ((16, "auto", None), (16, "fla", None)):
        assert _rel(ys[key], ref) < 5e-2, (key, _rel(ys[key], ref))


def test_mamba_ssm_ssd_matches_torch_chunk():
    """mamba-ssm's Triton SSD (where installed): its self-check's errors against float64 at the mad recipe's heads
    of 16 and the states of mamba's search space (16, 32, 64), chunk 64, printed and within SSD_TOLERANCE (each
    width autotunes first, minutes at most); a Mamba-2 layer asked for backend="mamba-ssm" against
    backend="torch" (same weights, bf16), output and every parameter's gradient."""
    from mixzoo.check import _rel
    from mixzoo.models import mamba as M
    from mixzoo.registry import build_mixer, get_mixer
    if M.ssd_op() is None:
        pytest.skip("mamba-ssm is not installed here")
    errs = {}
    for P, N, chunk in ((16, 16, 64), (16, 32, 64), (16, 64, 64)):
        errs[(P, N, chunk)] = M.ssd_errors(torch.cuda.current_device(), P, N, chunk)
        print(f"ssd P {P} N {N} chunk {chunk}: y, dx, ddt, dA_log, dB, dC, dD, ddt_bias "
              + " ".join(f"{e:.1e}" for e in errs[(P, N, chunk)]))
    for (P, N, chunk), e in errs.items():
        assert max(e) <= M.SSD_TOLERANCE, (P, N, chunk, e)
    x = torch.randn(4, 200, 128, generator=torch.Generator().manual_seed(1)).cuda()
    outs = {}
    for backend in ("mamba-ssm", "torch"):
        torch.manual_seed(0)
        m = build_mixer(get_mixer("mamba"), 128, num_heads=16, layer_idx=0, l_max=200, backend=backend).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        y.float().square().mean().backward()
        outs[backend] = (m.backend, y.float(), {n: p.grad.float() for n, p in m.named_parameters()})
    assert outs["mamba-ssm"][0] == "mamba-ssm-ssd"
    assert outs["torch"][0] == "torch-chunk"
    rels = {"output": _rel(outs["mamba-ssm"][1], outs["torch"][1])}
    rels |= {n: _rel(g, outs["torch"][2][n]) for n, g in outs["mamba-ssm"][2].items()}
    print("mamba-ssm-ssd vs torch-chunk (bf16): " + ", ".join(f"{k} {v:.1e}" for k, v in rels.items()))
    assert all(v < 5e-2 for v in rels.values()), rels


def test_mad_shape_step_time_within_3x_softmax():
    """Mamba, MesaNet and GDN at the mad recipe's layer and MAD's baseline shape, side by side."""
    from mixzoo.bench.mixers import MAD, bench_mixers, format_table
    rows = bench_mixers(["softmax", "mamba", "gdn", "mesa"], **MAD)
    print("\n" + format_table(rows))
    by = {r["mechanism"]: r for r in rows}
    assert all("error" not in r for r in rows), rows
    for name in ("mamba", "gdn", "mesa"):
        assert by[name]["ms"] <= 3 * by["softmax"]["ms"], (name, by[name]["ms"], by["softmax"]["ms"])


@pytest.mark.parametrize("l2norm", ["torch", "fla"])      # MIXZOO_MESA_L2NORM: F.normalize, or fla's in the call
def test_mesa_fast_path_at_mad_head_width(l2norm, monkeypatch):
    monkeypatch.setenv("MIXZOO_MESA_L2NORM", l2norm)
    from mixzoo.check import check_mixer
    results = check_mixer("mesa", device="cuda", d_model=128, num_heads=16, seq_len=100)
    for r in results:
        print("mesa 16 heads", r.status, r.check, r.detail)
    assert all(r.ok for r in results), [r for r in results if not r.ok]


@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn", "math"])
def test_softmax_sdpa_backends_agree_at_the_mad_shape(backend, monkeypatch):
    # MAD's shape (16 heads of 8, length 127, stacked models' batch): MIXZOO_SDPA's kernel gives PyTorch's
    # choice's numbers (bf16), forward and backward, and its time is printed beside it
    import time

    from mixzoo.models.softmax import SoftmaxAttention
    torch.manual_seed(0)
    m = SoftmaxAttention(128, num_heads=16).cuda()
    x = torch.randn(256, 127, 128, device="cuda")
    outs, ms = {}, {}
    for name in ("auto", backend):
        if name != "auto":
            monkeypatch.setenv("MIXZOO_SDPA", name)
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        outs[name] = (y.float(), xi.grad.float())
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                m(xi).float().square().mean().backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                m(xi).float().square().mean().backward()
        torch.cuda.synchronize()
        ms[name] = (time.perf_counter() - t0) * 100
    print(f"\nsoftmax attention forward+backward, batch 256 x 127 x 128, 16 heads: auto {ms['auto']:.3f} ms, "
          f"{backend} {ms[backend]:.3f} ms")
    for a, b in zip(outs["auto"], outs[backend]):
        assert float((a - b).norm() / b.norm()) < 2e-2
