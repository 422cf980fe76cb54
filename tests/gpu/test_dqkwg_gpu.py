"""mixzoo's Triton dqkwg kernel on the GPU (the default; ``MIXZOO_DQKWG=torch`` asks for the stand-in): it
matches the PyTorch step there at the zoo's head sizes (the self-check that enables it), and gdn /
Mamba-2 layers give the same gradients with either."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("K,V", [(16, 16), (16, 32), (64, 64), (32, 32)])
def test_kernel_matches_the_pytorch_step_here(K, V):
    from mixzoo.kernels import fla_dqkwg_triton as tri
    assert tri.usable(K, V, 64, torch.cuda.current_device())


# gdn at the mad recipe's 16 heads of 8; Mamba-2 at 4 heads (value heads of 64 in width 128), where
# backend="auto" takes fla's kernel (narrower value heads go to torch-chunk, which has no dqkwg step).
@pytest.mark.parametrize("name,heads", [("gdn", 16), ("mamba", 4)])
def test_layer_gradients_are_those_of_the_pytorch_step(name, heads, monkeypatch):
    from mixzoo.kernels.fla_dqkwg import triton_refused
    from mixzoo.registry import build_mixer, get_mixer
    if not triton_refused():
        pytest.skip("fla runs its own dqkwg kernel here")
    grads = {}
    monkeypatch.setenv("MIXZOO_GDN", "fla")        # gdn's heads of 8 otherwise take the recurrent scan (no dqkwg step)
    for path in ("torch", "triton"):
        monkeypatch.setenv("MIXZOO_DQKWG", path)
        torch.manual_seed(0)
        m = build_mixer(get_mixer(name), 128, num_heads=heads, layer_idx=0, l_max=128).cuda()
        x = torch.randn(4, 128, 128, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        y.float().square().mean().backward()
        assert m.backend.endswith(f"+{path}-dqkwg"), m.backend
        grads[path] = {n: p.grad.detach().float().clone() for n, p in m.named_parameters() if p.grad is not None}
    for n, g in grads["torch"].items():
        err = float((grads["triton"][n] - g).norm() / g.norm().clamp_min(1e-30))
        print(name, n, f"{err:.1e}")
        assert err < 1e-2, (name, n, err)
