"""mixzoo.kernels.gla_steps on the GPU: steps of fla's chunked GLA (the output; dv; the state's parts of dq, dk
and dg) against fla's own kernels and the float64 references, timed side by side at the mad recipe's GLA heads
(16 heads; keys of 4 and values of 8 zero-padded to 16), one model (batch 128) and six stacked (batch 768) at
length 1024 and one model at 128; and a GLA layer's output and gradients with them against without."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _inputs(step, B, T, H=16, K=16, V=16, BT=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    NT = -(-T // BT)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)          # noqa: E731
    glog = -torch.rand(B, NT * BT, H, K, device="cuda", generator=g) * 0.1
    gc = glog.view(B, NT, BT, H, K).cumsum(2).view(B, NT * BT, H, K)[:, :T].contiguous()
    if step == "dv":
        return dict(k=r(B, T, H, K).bfloat16(), g=gc, A=r(B, T, H, BT) * BT ** -0.5, do=r(B, T, H, V).bfloat16(),
                    dh=r(B, NT, H, K, V), chunk_size=BT)
    if step == "o":
        return dict(q=r(B, T, H, K).bfloat16(), v=r(B, T, H, V).bfloat16(), g=gc, A=r(B, T, H, BT) * BT ** -0.5,
                    h=r(B, NT, H, K, V).bfloat16(), scale=0.25, chunk_size=BT)
    return dict(q=r(B, T, H, K).bfloat16(), k=r(B, T, H, K).bfloat16(), v=r(B, T, H, V).bfloat16(),
                h=r(B, NT, H, K, V), g=gc, do=r(B, T, H, V).bfloat16(), dh=r(B, NT, H, K, V), dq=r(B, T, H, K),
                dk=r(B, T, H, K), scale=0.25, chunk_size=BT)


def _ms(fn) -> float:
    """Median milliseconds of ``fn()`` on the device (triton.testing.do_bench: warm-up, then timed repeats)."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


@pytest.mark.parametrize("step", ["o", "dv", "dqkg"])
def test_gla_step_against_fla_and_float64_and_timed(monkeypatch, step):
    import fla.ops.gla.chunk as c

    from mixzoo.kernels import GLA_SWITCHES, RAN
    from mixzoo.kernels import gla_steps as G
    var = f"MIXZOO_GLA_{step.upper()}"
    fn = {"o": c.chunk_gla_fwd_o_gk, "dv": c.chunk_gla_bwd_dv, "dqkg": c.chunk_gla_bwd_dqkg}[step]
    ref = {"o": G.fwd_o_torch, "dv": G.bwd_dv_torch, "dqkg": G.bwd_dqkg_torch}[step]
    assert G.install() and G.usable(step, 16, 16, 64, torch.cuda.current_device())
    print()
    for B, T in ((128, 1024), (768, 1024), (128, 128)):
        x = _inputs(step, B, T)
        monkeypatch.setenv(var, "fla")
        fla = fn(**x)
        t_fla = _ms(lambda x=x: fn(**x))
        monkeypatch.setenv(var, "triton")
        RAN.clear()
        ours = fn(**x)
        assert RAN == {f"gla_{step}"}
        t_ours = _ms(lambda x=x: fn(**x))
        fla, ours = ((t,) if torch.is_tensor(t) else t for t in (fla, ours))
        # against float64 on the first 16 sequences (the references' einsums in float64 are large)
        s = {n: (t[:16] if torch.is_tensor(t) else t) for n, t in x.items()}
        wants = ref(**s, dtype=torch.float64)
        wants = (wants,) if torch.is_tensor(wants) else wants
        rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())     # noqa: E731
        e_ours = [rel(a[:16], w) for a, w in zip(ours, wants)]
        e_fla = [rel(a[:16], w) for a, w in zip(fla, wants)]
        diff = [rel(a, b) for a, b in zip(ours, fla)]
        print(f"gla {step} B={B} T={T}: fla {t_fla:.3f} ms, mixzoo {t_ours:.3f} ms ({t_fla / t_ours:.2f}x); against "
              f"float64 fla {max(e_fla):.2e} mixzoo {max(e_ours):.2e}; mixzoo against fla {max(diff):.2e}")
        assert all(a <= 1.1 * b + 1e-5 for a, b in zip(e_ours, e_fla)) and max(e_ours) < 4e-3
        assert max(diff) < 2e-3
        if T == 1024 and GLA_SWITCHES[var][0] == "triton":      # a default kernel must be the faster one
            assert t_ours < t_fla
        if step == "dv":                 # its warps: 8 (the default, no register spills) against 4
            from mixzoo.kernels import gla_steps_triton as Kt
            assert Kt.DV_WARPS == 8
            monkeypatch.setattr(Kt, "DV_WARPS", 4)
            t4 = _ms(lambda x=x: fn(**x))
            assert rel(fn(**x), ours[0]) < 1e-3          # the same sums (bfloat16 output)
            monkeypatch.setattr(Kt, "DV_WARPS", 8)
            print(f"gla dv B={B} T={T}: 8 warps {t_ours:.3f} ms, 4 warps {t4:.3f} ms")
            if T == 1024:
                assert t_ours < t4


def test_gla_layer_with_the_kernels(monkeypatch):
    """A GLA layer at the mad recipe (width 128, 16 heads), bf16 autocast, forward and backward with fla's
    kernels, with mixzoo's dv, and with all three of mixzoo's: the same output, gradients within bfloat16's rounding
    (bit for bit where the kernels are); the backend and the run's kernels say which ran."""
    from mixzoo.kernels import RAN
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    torch.manual_seed(0)
    m = build_mixer(get_mixer("gla"), 128, num_heads=16, layer_idx=0, l_max=1024).cuda()
    x = torch.randn(16, 1024, 128, device="cuda")
    res = {}
    monkeypatch.setenv("MIXZOO_GLA_CORE", "fla")      # GLA's narrow heads otherwise take the recurrent scan
    for dv, dqkg, o in (("fla", "fla", "fla"), ("triton", "fla", "fla"), ("triton", "triton", "triton")):
        monkeypatch.setenv("MIXZOO_GLA_DV", dv)
        monkeypatch.setenv("MIXZOO_GLA_DQKG", dqkg)
        monkeypatch.setenv("MIXZOO_GLA_O", o)
        RAN.clear()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        res[(dv, dqkg, o)] = (m.backend, sorted(r for r in RAN if r.startswith("gla_")), y.detach().float(),
                           [xi.grad.float()] + [p.grad.float().clone() for p in m.parameters()])
        m.zero_grad()
    base = res[("fla", "fla", "fla")]
    assert [r[0] for r in res.values()] == ["fla-chunk", "fla-chunk+triton-dv", "fla-chunk+triton-dv-dqkg-o"]
    assert [r[1] for r in res.values()] == [[], ["gla_dv"], ["gla_dqkg", "gla_dv", "gla_o"]]
    rel = lambda a, b: float((a - b).norm() / b.norm())           # noqa: E731
    for key, (_, _, y, grads) in res.items():
        assert torch.equal(y, base[2])
        errs = [rel(a, b) for a, b in zip(grads, base[3])]
        print(f"\ngla layer, {key}: gradients against fla's kernels, input {errs[0]:.2e}, parameters max {max(errs[1:]):.2e}")
        assert max(errs) < 1e-2
