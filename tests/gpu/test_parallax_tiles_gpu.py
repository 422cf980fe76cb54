"""mixzoo.kernels.parallax_tiles on the GPU: fla's Parallax kernels at mixzoo's tiles against fla's own launcher
and float64 (output and the four input gradients) at the mad recipe's heads, timed side by side; and the parallax
layer with them against without."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("B,T", [(768, 1024), (128, 128)])
def test_tiles_against_fla_and_float64(B, T):
    import triton.testing
    from fla.ops.parallax import parallel as P
    from fla.ops.parallax.naive import naive_parallax

    from mixzoo.kernels import PARALLAX_TILES
    from mixzoo.kernels import parallax_tiles as X
    g = torch.Generator(device="cuda").manual_seed(0)
    pad = lambda x: torch.nn.functional.pad(x, (0, 8)).bfloat16()          # noqa: E731  heads of 8 -> 16
    q, r, k, v, do = (pad(torch.randn(B, T, 16, 8, device="cuda", generator=g)) for _ in range(5))
    r = r * 0.3
    s = 8 ** -0.5
    ins = [x.clone().requires_grad_() for x in (q, r, k, v)]
    o = X.parallax(*ins, scale=s)
    ours = [o] + list(torch.autograd.grad(o, ins, do))
    fin = [x.clone().requires_grad_() for x in (q, r, k, v)]
    fo = P.parallel_parallax(*fin, scale=s)
    fla = [fo] + list(torch.autograd.grad(fo, fin, do))
    n = 4                                          # float64 on the first sequences
    rin = [x[:n].double().requires_grad_() for x in (q, r, k, v)]
    ro = naive_parallax(*rin, scale=s)
    ref = [ro] + list(torch.autograd.grad(ro, rin, do[:n].double()))
    e_ours = [_rel(a[:n], b) for a, b in zip(ours, ref)]
    e_fla = [_rel(a[:n], b) for a, b in zip(fla, ref)]
    diff = [_rel(a, b) for a, b in zip(ours, fla)]

    def step(fn):
        def run():
            xs = [x.requires_grad_() for x in (q.clone(), r.clone(), k.clone(), v.clone())]
            torch.autograd.grad(fn(*xs, scale=s), xs, do)
        return run
    t_ours = triton.testing.do_bench(step(X.parallax), warmup=10, rep=60, return_mode="median")
    t_fla = triton.testing.do_bench(step(P.parallel_parallax), warmup=10, rep=60, return_mode="median")
    print(f"\nparallax B={B} T={T}: forward+backward mixzoo's tiles {t_ours:.3f} ms, fla's {t_fla:.3f} ms "
          f"({t_fla / t_ours:.2f}x); against float64 (o, dq, dr, dk, dv) mixzoo {max(e_ours):.2e}, fla "
          f"{max(e_fla):.2e}; against fla {max(diff):.2e}")
    assert all(a <= 1.2 * b + 1e-4 for a, b in zip(e_ours, e_fla)), (e_ours, e_fla)
    assert max(diff) < 1e-2, diff
    if PARALLAX_TILES[0] == "mixzoo" and B == 768:       # a default must be the faster one
        assert t_ours < t_fla


def test_parallax_layer_with_the_tiles(monkeypatch):
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    torch.manual_seed(0)
    m = build_mixer(get_mixer("parallax"), 128, num_heads=16, layer_idx=0, l_max=512).cuda()
    x = torch.randn(8, 512, 128, device="cuda")
    res = {}
    for sw in ("mixzoo", "fla"):
        monkeypatch.setenv("MIXZOO_PARALLAX_TILES", sw)
        m.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        res[sw] = (m.backend, y.detach().float(), [xi.grad.float()] + [p.grad.float().clone() for p in m.parameters()
                                                                        if p.grad is not None])
    assert (res["mixzoo"][0], res["fla"][0]) == ("fla-parallel+tiles", "fla-parallel")
    errs = [_rel(a, b) for a, b in zip([res["mixzoo"][1]] + res["mixzoo"][2], [res["fla"][1]] + res["fla"][2])]
    print(f"\nparallax layer, mixzoo's tiles against fla's: output {errs[0]:.2e}, gradients max {max(errs[1:]):.2e}")
    assert max(errs) < 1e-2, errs


@pytest.mark.parametrize("B,T", [(768, 1024), (128, 128)])
def test_unpadded_heads_bit_for_bit_the_padded_call(B, T):
    """Heads of 8 handed to the kernels as they are (blocks of 16, masked) against zero-padded to 16 in memory:
    the output and the four input gradients equal bit for bit; the two timed side by side, padding included."""
    import triton.testing

    from mixzoo.kernels import parallax_tiles as X
    g = torch.Generator(device="cuda").manual_seed(1)
    q, r, k, v, do = (torch.randn(B, T, 16, 8, device="cuda", generator=g).bfloat16() for _ in range(5))
    s = 8 ** -0.5
    pad = lambda x: torch.nn.functional.pad(x, (0, 8))                    # noqa: E731

    def run(padded: bool):
        xs = [x.clone().requires_grad_() for x in (q, r, k, v)]
        o = X.parallax(*(pad(x) for x in xs), scale=s)[..., :8] if padded else X.parallax(*xs, scale=s)
        return [o] + list(torch.autograd.grad(o, xs, do))
    a, b = run(False), run(True)
    for name, x, y in zip(("o", "dq", "dr", "dk", "dv"), a, b):
        assert x.shape == y.shape == q.shape and torch.equal(x, y), name
    t_un = triton.testing.do_bench(lambda: run(False), warmup=10, rep=60, return_mode="median")
    t_pad = triton.testing.do_bench(lambda: run(True), warmup=10, rep=60, return_mode="median")
    print(f"\nparallax B={B} T={T}, forward+backward: unpadded {t_un:.3f} ms, padded {t_pad:.3f} ms "
          f"({t_pad / t_un:.2f}x)")


def test_parallax_layer_unpadded_equals_padded(monkeypatch):
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    monkeypatch.setenv("MIXZOO_PARALLAX_TILES", "mixzoo")
    torch.manual_seed(0)
    m = build_mixer(get_mixer("parallax"), 128, num_heads=16, layer_idx=0, l_max=512).cuda()
    x = torch.randn(8, 512, 128, device="cuda")
    res = {}
    for pad in ("none", "16"):
        monkeypatch.setenv("MIXZOO_FLA_PAD", pad)
        m.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        res[pad] = (m.backend, [y.detach(), xi.grad] + [p.grad.clone() for p in m.parameters() if p.grad is not None])
    assert (res["none"][0], res["16"][0]) == ("fla-parallel+tiles+unpadded", "fla-parallel+tiles")
    assert len(res["none"][1]) == len(res["16"][1]) > 3
    assert all(torch.equal(a, b) for a, b in zip(res["none"][1], res["16"][1]))
