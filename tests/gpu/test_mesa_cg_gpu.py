"""mixzoo.kernels.mesa_cg on the GPU: the mesa layer with fla's CG kernels relaunched at each of MESA_CG's settings
gives fla's settings' output and gradients (the same kernels; only the warps' split of the work differs)."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_mesa_layer_at_every_cg_setting(monkeypatch):
    from mixzoo.kernels import MESA_CG, mesa_cg
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    torch.manual_seed(0)
    m = build_mixer(get_mixer("mesa"), 128, num_heads=16, layer_idx=0, l_max=512).cuda()
    x = torch.randn(8, 512, 128, device="cuda")
    res = {}
    for setting in MESA_CG:
        monkeypatch.setenv(mesa_cg.SWITCH, setting)
        m.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().mean().backward()
        res[setting] = (m.backend, [y.detach().float(), xi.grad.float()] +
                        [p.grad.float().clone() for p in m.parameters() if p.grad is not None])
    base = res[MESA_CG[0]]
    assert base[0].startswith("fla-chunk") and "+cg" not in base[0]
    for setting, (backend, outs) in res.items():
        w, s = setting.split(",")
        if setting != "4,1":
            assert backend.endswith(f"+cg{w}w{s}s"), backend
        errs = [_rel(a, b) for a, b in zip(outs, base[1])]
        print(f"\nmesa layer, CG at {setting} against 4,1: output {errs[0]:.2e}, gradients max {max(errs[1:]):.2e}")
        assert max(errs) < 1e-2, (setting, errs)
