"""mixzoo.kernels.gla_dv on the GPU: the value gradient of fla's chunked GLA backward against fla's own
kernel and the float64 reference, timed side by side at the mad recipe's GLA heads (16 heads; keys of 4
and values of 8 zero-padded to 16), one model (batch 128) and six stacked (batch 768) at length 1024;
and a GLA layer's gradients with it against without."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _inputs(B, T, H=16, K=16, V=16, BT=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    NT = -(-T // BT)
    k = torch.randn(B, T, H, K, device="cuda", generator=g).bfloat16()
    glog = -torch.rand(B, NT * BT, H, K, device="cuda", generator=g) * 0.1
    gc = glog.view(B, NT, BT, H, K).cumsum(2).view(B, NT * BT, H, K)[:, :T].contiguous()
    A = torch.randn(B, T, H, BT, device="cuda", generator=g) * BT ** -0.5
    do = torch.randn(B, T, H, V, device="cuda", generator=g).bfloat16()
    dh = torch.randn(B, NT, H, K, V, device="cuda", generator=g)
    return dict(k=k, g=gc, A=A, do=do, dh=dh, chunk_size=BT)


def _ms(fn, iters=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def test_gla_dv_against_fla_and_float64_and_timed(monkeypatch):
    import fla.ops.gla.chunk as c

    from mixzoo.kernels import RAN
    from mixzoo.kernels import gla_dv as G
    assert G.install() and G.usable(16, 16, 64, torch.cuda.current_device())
    print()
    for B, T in ((128, 1024), (768, 1024), (128, 128)):
        x = _inputs(B, T)
        monkeypatch.setenv("MIXZOO_GLA_DV", "fla")
        fla = c.chunk_gla_bwd_dv(**x)
        t_fla = _ms(lambda x=x: c.chunk_gla_bwd_dv(**x))
        monkeypatch.delenv("MIXZOO_GLA_DV")
        RAN.clear()
        ours = c.chunk_gla_bwd_dv(**x)
        assert RAN == {"gla_dv"}
        t_ours = _ms(lambda x=x: c.chunk_gla_bwd_dv(**x))
        # against float64 on the first 16 sequences (the reference's einsums in float64 are large)
        s = {n: (t[:16] if n != "chunk_size" else t) for n, t in x.items()}
        want = G.bwd_dv_torch(s["k"], s["g"], s["A"], s["do"], s["dh"], 64, dtype=torch.float64)
        e_ours = float((ours[:16].double() - want).norm() / want.norm())
        e_fla = float((fla[:16].double() - want).norm() / want.norm())
        diff = float((ours.float() - fla.float()).norm() / fla.float().norm())
        print(f"gla dv B={B} T={T}: fla {t_fla:.3f} ms, mixzoo {t_ours:.3f} ms ({t_fla / t_ours:.2f}x); "
              f"against float64 fla {e_fla:.2e} mixzoo {e_ours:.2e}; mixzoo against fla {diff:.2e}")
        assert e_ours <= 1.1 * e_fla + 1e-5 and e_ours < 4e-3
        assert diff < 2e-3
        if T == 1024:
            assert t_ours < t_fla


def test_gla_layer_gradients_with_the_kernel(monkeypatch):
    """A GLA layer at the mad recipe (width 128, 16 heads), bf16 autocast, forward and backward with the
    kernel and with fla's: the same output, gradients within bfloat16's rounding; the backend says which."""
    from mixzoo.kernels import RAN
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    torch.manual_seed(0)
    m = build_mixer(get_mixer("gla"), 128, num_heads=16, layer_idx=0, l_max=1024).cuda()
    x = torch.randn(16, 1024, 128, device="cuda")
    res = {}
    for impl in ("fla", "triton"):
        monkeypatch.setenv("MIXZOO_GLA_DV", impl)
        RAN.clear()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        res[impl] = (m.backend, sorted(RAN), y.detach().float(), xi.grad.float(),
                     [p.grad.float().clone() for p in m.parameters()])
        m.zero_grad()
    (b_f, r_f, y_f, gx_f, gp_f), (b_t, r_t, y_t, gx_t, gp_t) = res["fla"], res["triton"]
    assert (b_f, b_t) == ("fla-chunk", "fla-chunk+triton-dv")
    assert "gla_dv" not in r_f and "gla_dv" in r_t
    assert torch.equal(y_f, y_t)
    rel = lambda a, b: float((a - b).norm() / b.norm())           # noqa: E731
    errs = [rel(gx_t, gx_f)] + [rel(a, b) for a, b in zip(gp_t, gp_f)]
    print(f"\ngla layer, gradients with mixzoo's dv against fla's: input {errs[0]:.2e}, parameters max {max(errs[1:]):.2e}")
    assert max(errs) < 1e-2
