"""mixzoo.kernels.gla_steps: steps of fla's chunked GLA (the output, o; the value gradient, dv; the state's
parts of dq, dk and the log-decays' gradient, dqkg) as Triton kernels, on the CPU in Triton's interpreter with the
H200's numerics: the backward's references against autograd of a chunk's forward, the kernels against the
references in float64, bit for bit against fla's own kernels at the same tiles, and taking fla's dispatched calls
once installed."""
import math

import pytest
import torch
from interp import run_interpreted

from mixzoo.kernels import gla_steps as G


def test_reference_is_the_gradient_of_the_chunk_output_and_next_state():
    """``bwd_dv_torch`` (float64, float64 keys: no rounding) is d/dv of sum_t do_t . o_t with o_t = sum_{s<=t}
    A[t, s] v_s in each chunk, plus <dh, sum_s (k_s 2^{g_L - g_s})ᵀ v_s>, the next state's part."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V, BT = 2, 40, 3, 5, 6, 16              # a partial last chunk
    NT = -(-T // BT)
    k = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    g = (-torch.rand(B, NT * BT, H, K, generator=gen, dtype=torch.float64) * 0.3).view(B, NT, BT, H, K)
    g = g.cumsum(2).view(B, NT * BT, H, K)[:, :T]
    A = torch.randn(B, T, H, BT, generator=gen, dtype=torch.float64)
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    dh = torch.randn(B, NT, H, K, V, generator=gen, dtype=torch.float64)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64, requires_grad=True)
    loss = 0
    for n in range(NT):
        a, b = n * BT, min(T, n * BT + BT)
        L = b - a
        An = A[:, a:b, :, :L].masked_fill(~torch.ones(L, L, dtype=torch.bool).tril().view(1, L, 1, L), 0.)
        o = torch.einsum("bths,bshv->bthv", An, v[:, a:b])
        kd = k[:, a:b] * torch.exp2(g[:, b - 1:b] - g[:, a:b])
        loss = loss + (do[:, a:b] * o).sum() + (dh[:, n] * torch.einsum("bshk,bshv->bhkv", kd, v[:, a:b])).sum()
    (want,) = torch.autograd.grad(loss, v)
    got = G.bwd_dv_torch(k, g.contiguous(), A, do, dh, BT, dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_dqkg_reference_is_the_gradient_of_a_chunked_gla_forward():
    """``bwd_dqkg_torch`` (float64, no rounding) against autograd of sum do . o + <dh, next state> per chunk,
    o_t = σ sum_{s <= t} (q_t 2^{g_t}) . (k_s 2^{-g_s}) v_s + σ (q_t 2^{g_t}) h, next state 2^{g_L} h +
    sum_s (k_s 2^{g_L - g_s})ᵀ v_s, g the chunk-local cumulative sum of increments a (log2): given the in-chunk
    parts of dq, dk (autograd of the first term), dq and dk are the whole gradients and dg = da / ln 2."""
    gen = torch.Generator().manual_seed(1)
    B, T, H, K, V, BT, scale = 2, 40, 2, 5, 6, 16, 0.7
    NT = -(-T // BT)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)          # noqa: E731
    q, k, v, do = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), r(B, T, H, V)
    h, dh = r(B, NT, H, K, V), r(B, NT, H, K, V)
    a = (-torch.rand(B, T, H, K, generator=gen, dtype=torch.float64) * 0.3)
    qa, ka, aa = (t.clone().requires_grad_() for t in (q, k, a))

    def loss(q, k, a, state=True, inner=True):
        total = 0
        for n in range(NT):
            s0, s1 = n * BT, min(T, n * BT + BT)
            L = s1 - s0
            g = a[:, s0:s1].cumsum(1)
            qg, kg = q[:, s0:s1] * torch.exp2(g), k[:, s0:s1] * torch.exp2(-g)
            if inner:
                causal = torch.ones(L, L, dtype=torch.bool).tril().view(1, L, 1, L)
                A = torch.einsum("bthk,bshk->bths", qg, kg).masked_fill(~causal, 0.)
                total = total + (do[:, s0:s1] * scale * torch.einsum("bths,bshv->bthv", A, v[:, s0:s1])).sum()
            if state:
                total = total + (do[:, s0:s1] * scale * torch.einsum("bthk,bhkv->bthv", qg, h[:, n])).sum()
                nxt = torch.exp2(g[:, -1]).unsqueeze(-1) * h[:, n] + torch.einsum(
                    "bshk,bshv->bhkv", k[:, s0:s1] * torch.exp2(g[:, -1:] - g), v[:, s0:s1])
                total = total + (dh[:, n] * nxt).sum()
        return total
    dq_in, dk_in = torch.autograd.grad(loss(qa, ka, a, state=False), (qa, ka))
    want_dq, want_dk, want_da = torch.autograd.grad(loss(qa, ka, aa), (qa, ka, aa))
    g = torch.cat([a[:, n * BT:(n + 1) * BT].cumsum(1) for n in range(NT)], 1)
    dq, dk, dg = G.bwd_dqkg_torch(q, k, v, h, g, do, dh, dq_in, dk_in, scale, BT, dtype=torch.float64)
    torch.testing.assert_close(dq, want_dq, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dk, want_dk, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dg * math.log(2), want_da, rtol=1e-10, atol=1e-10)


SCRIPT = r"""
import fla.ops.gla.chunk as c
from mixzoo.kernels import RAN, gla_steps as G
os.environ["MIXZOO_GLA_DQKG"] = os.environ["MIXZOO_GLA_O"] = "triton"
shapes = ((16, 16, 64), (32, 64, 64), (16, 24, 32))
out = {"usable": [G.usable(s, 16, 16, 64, -1) for s in G.STEPS],
       "errors": {f"{s} {K}x{V}@{BT}": G.errors_here(s, K, V, BT, -1) for s in G.STEPS for K, V, BT in shapes}}
gen = torch.Generator().manual_seed(3)
B, T, H, K, V, BT = 2, 150, 3, 16, 16, 64
NT = -(-T // BT)
x = G._inputs("dqkg", K, V, BT, torch.bfloat16, gen)     # T = 2 BT + 7
A = torch.randn(*x["k"].shape[:3], BT, generator=gen) * 0.1
T = x["k"].shape[1]
NT = -(-T // BT)
# fla's own kernels (their autotuner needs a GPU): the jitted functions at tiles of 16
fla_dv = torch.empty_like(x["do"])
c.chunk_gla_bwd_kernel_dv.fn.fn[(NT, B * H)](x["k"], x["g"], A, x["do"], x["dh"], fla_dv, None, None, T, H=H, K=K,
                                              V=V, BT=BT, BK=16, BV=16, IS_VARLEN=False, STATE_V_FIRST=False)
fla_q, fla_k, fla_g = torch.empty_like(x["dq"]), torch.empty_like(x["dk"]), torch.empty_like(x["g"])
c.chunk_gla_bwd_kernel_inter.fn.fn[(NT, B * H)](x["q"], x["k"], x["v"], x["g"], x["h"], x["do"], x["dh"], x["dq"],
                                                 x["dk"], fla_q, fla_k, fla_g, None, None, 0.25, T, H=H, K=K, V=V,
                                                 BT=BT, BK=16, BV=16, IS_VARLEN=False, STATE_V_FIRST=False)
hb = x["h"].bfloat16()
fla_o = torch.zeros_like(x["v"])
c.chunk_gla_fwd_kernel_o.fn.fn[(NT, B * H)](x["q"], x["v"], x["g"], hb, fla_o, A, None, None, 0.25, T, H=H, HV=H, K=K,
                                             V=V, BT=BT, BK=16, BV=16, STATE_V_FIRST=False, IS_VARLEN=False)
o = G.fwd_o(x["q"], x["v"], x["g"], A, hb, 0.25, chunk_size=BT)
dv = G.bwd_dv(x["k"], x["g"], A, x["do"], x["dh"], chunk_size=BT)
dqkg = G.bwd_dqkg(**x, scale=0.25, chunk_size=BT)
out["equal to fla's kernels"] = ([torch.equal(o, fla_o), torch.equal(dv, fla_dv)]
                                 + [torch.equal(a, b) for a, b in zip(dqkg, (fla_q, fla_k, fla_g))])
out["installed"] = G.install()
RAN.clear()
via_dv = c.chunk_gla_bwd_dv(k=x["k"], g=x["g"], A=A, do=x["do"], dh=x["dh"], chunk_size=BT)
via = c.chunk_gla_bwd_dqkg(**x, scale=0.25, chunk_size=BT)
via_o = c.chunk_gla_fwd_o_gk(q=x["q"], v=x["v"], g=x["g"], A=A, h=hb, scale=0.25, chunk_size=BT)
out["dispatched"] = [sorted(RAN), torch.equal(via_dv, dv), all(torch.equal(a, b) for a, b in zip(via, dqkg)),
                     torch.equal(via_o, o)]
out["refused"] = [G.takes_dv(x["k"], x["g"], A, x["do"], x["dh"], cu_seqlens=torch.tensor([0, T])),
                  G.takes_dv(x["k"], x["g"], A, x["do"].transpose(1, 2), x["dh"]),
                  G.takes_dqkg(**x, scale=None)]
out["refused"].append(G.takes_o(x["q"], x["v"], x["g"], A, hb, 0.25, use_graph=True))
os.environ.pop("MIXZOO_GLA_DQKG")
os.environ.pop("MIXZOO_GLA_O")
out["by default"] = [G.takes_dqkg(**x, scale=0.25), G.takes_o(x["q"], x["v"], x["g"], A, hb, 0.25),
                     G.takes_dv(x["k"], x["g"], A, x["do"], x["dh"])]
os.environ["MIXZOO_GLA_DQKG"] = os.environ["MIXZOO_GLA_O"] = "fla"
out["dqkg switched off"] = G.takes_dqkg(**x, scale=0.25)
out["o switched off"] = G.takes_o(x["q"], x["v"], x["g"], A, hb, 0.25)
os.environ["MIXZOO_GLA_DV"] = "fla"
out["dv switched off"] = G.takes_dv(x["k"], x["g"], A, x["do"], x["dh"])
print("RESULT", json.dumps(out))
"""


def test_the_kernels_in_the_interpreter():
    pytest.importorskip("fla")
    r = run_interpreted(SCRIPT, drop=("MIXZOO_GLA_DV", "MIXZOO_GLA_DQKG", "MIXZOO_GLA_O"))
    assert r["usable"] == [True, True, True]
    for case, errs in r["errors"].items():
        half = len(errs) // 2
        bf16, f32 = errs[:half], errs[half:]
        assert max(bf16) < 4e-3, (case, bf16)     # bfloat16 outputs (dv) and bfloat16-rounded operands (fla's precision)
        assert max(f32) < 2e-3, (case, f32)       # float32 inputs: the tensor-core products in TF32
    assert r["equal to fla's kernels"] == [True] * 5, r
    assert r["installed"] is True and r["dispatched"] == [["gla_dqkg", "gla_dv", "gla_o"], True, True, True], r
    assert r["refused"][0].startswith("fixed-length") and r["refused"][1].startswith("non-contiguous"), r
    assert r["refused"][2].startswith("g not float32, or no scale"), r
    assert r["refused"][3].startswith("g not float32, no scale, a graph"), r
    assert r["by default"] == [None, None, None], r
    assert r["dqkg switched off"] == "MIXZOO_GLA_DQKG=fla" and r["o switched off"] == "MIXZOO_GLA_O=fla"
    assert r["dv switched off"] == "MIXZOO_GLA_DV=fla"


@pytest.mark.parametrize("var,allowed", [("MIXZOO_GLA_DV", "triton, fla"), ("MIXZOO_GLA_DQKG", "triton, fla"),
                                         ("MIXZOO_GLA_O", "triton, fla")])
def test_a_wrong_switch_is_refused_at_the_command_line(tmp_path, capsys, monkeypatch, var, allowed):
    from mixzoo.cli import main
    monkeypatch.setenv(var, "cuda")
    assert main(["--results", str(tmp_path / "res"), "run", "mqar", "--preset", "demo", "--model", "gla"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{var}='cuda'; allowed: {allowed}" in err, err
    assert not (tmp_path / "res").exists()
