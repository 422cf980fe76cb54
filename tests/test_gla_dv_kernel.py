"""mixzoo.kernels.gla_dv: the value gradient of fla's chunked GLA backward as one Triton kernel, on the
CPU in Triton's interpreter with the H200's numerics: its reference against autograd, the kernel against
the reference in float64, bit for bit against fla's own kernel at the same tiles, and taking fla's
dispatched calls once installed."""
import pytest
import torch
from interp import run_interpreted

from mixzoo.kernels import gla_dv as G


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


SCRIPT = r"""
import fla.ops.gla.chunk as c
from mixzoo.kernels import RAN, gla_dv as G
out = {"usable": G.usable(16, 16, 64, -1),
       "errors": {f"{K}x{V}@{BT}": G.errors_here(K, V, BT, -1) for K, V, BT in ((16, 16, 64), (32, 64, 64), (16, 24, 32))}}
gen = torch.Generator().manual_seed(3)
B, T, H, K, V, BT = 2, 150, 3, 16, 16, 64
NT = -(-T // BT)
k = torch.randn(B, T, H, K, generator=gen).bfloat16()
g = (-torch.rand(B, NT * BT, H, K, generator=gen) * 0.2).view(B, NT, BT, H, K).cumsum(2)
g = g.view(B, NT * BT, H, K)[:, :T].contiguous()
A = torch.randn(B, T, H, BT, generator=gen) * 0.1
do = torch.randn(B, T, H, V, generator=gen).bfloat16()
dh = torch.randn(B, NT, H, K, V, generator=gen)
fla = torch.empty_like(do)     # fla's own kernel (its autotuner needs a GPU): the jitted function at tiles of 16
c.chunk_gla_bwd_kernel_dv.fn.fn[(NT, B * H)](k, g, A, do, dh, fla, None, None, T, H=H, K=K, V=V, BT=BT, BK=16, BV=16,
                                              IS_VARLEN=False, STATE_V_FIRST=False)
ours = G.bwd_dv(k, g, A, do, dh, chunk_size=BT)
out["equal to fla's kernel"] = torch.equal(ours, fla)
out["installed"] = G.install()
RAN.clear()
via = c.chunk_gla_bwd_dv(k=k, g=g, A=A, do=do, dh=dh, chunk_size=BT)
out["dispatched"] = [sorted(RAN), torch.equal(via, ours)]
out["refused"] = [G.takes(k, g, A, do, dh, cu_seqlens=torch.tensor([0, T])), G.takes(k, g, A, do.transpose(1, 2), dh)]
os.environ["MIXZOO_GLA_DV"] = "fla"
out["switched off"] = G.takes(k, g, A, do, dh)
print("RESULT", json.dumps(out))
"""


def test_the_kernel_in_the_interpreter():
    pytest.importorskip("fla")
    r = run_interpreted(SCRIPT, drop=("MIXZOO_GLA_DV",))
    assert r["usable"] is True
    for case, (bf16, f32) in r["errors"].items():
        assert 1e-4 < bf16 < 4e-3, (case, bf16)       # bfloat16 output and state-term operands (fla's precision)
        assert f32 < 2e-3, (case, f32)                 # float32 inputs: the state term in TF32 on the tensor cores
    assert r["equal to fla's kernel"] is True
    assert r["installed"] is True and r["dispatched"] == [["gla_dv"], True], r
    assert r["refused"][0].startswith("fixed-length") and r["refused"][1].startswith("non-contiguous"), r
    assert r["switched off"] == "MIXZOO_GLA_DV=fla"


def test_a_wrong_switch_is_refused_at_the_command_line(tmp_path, capsys, monkeypatch):
    from mixzoo.cli import main
    monkeypatch.setenv("MIXZOO_GLA_DV", "cuda")
    assert main(["--results", str(tmp_path / "res"), "run", "mqar", "--preset", "demo", "--model", "gla"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MIXZOO_GLA_DV='cuda'; allowed: triton, fla" in err, err
    assert not (tmp_path / "res").exists()
