"""gdn's recurrent scan (mixzoo.kernels.recurrent, backend ``triton-rec``) on the GPU: its device self-check, and the
mad recipe's layer (16 heads of 8) under bf16 autocast against the float64 torch-chunk path beside fla's chunk path
(``MIXZOO_GDN=fla``): the scan's errors must be no worse than fla's, at lengths 256 and 2048 (MAD's hardest)."""
from __future__ import annotations

import copy

import pytest
import torch
from layer_check import layer_grads, rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_self_check_on_the_device():
    from mixzoo.kernels import recurrent
    assert recurrent.usable(torch.cuda.current_device())


SWITCH = {"gdn": "MIXZOO_GDN", "gla": "MIXZOO_GLA_CORE"}


@pytest.mark.parametrize("name,T,neg", [("gdn", 256, False), ("gdn", 256, True), ("gdn", 2048, False),
                                        ("gla", 256, False), ("gla", 2048, False)])
def test_mad_layer_against_float64_beside_fla(name, T, neg, monkeypatch):
    from mixzoo.registry import build_mixer, get_mixer
    torch.manual_seed(0)
    knobs = {"allow_neg_eigval": True} if neg else {}
    m = build_mixer(get_mixer(name), 128, num_heads=16, layer_idx=0, l_max=T, **knobs).cuda()
    ref = copy.deepcopy(m).double()
    ref.requested = "torch"
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(4, T, 128, device="cuda", generator=g)
    dy = torch.randn(4, T, 128, device="cuda", generator=g)

    def run(mod, xx, amp):
        grads = layer_grads(mod, xx, dy, amp)
        return mod.backend, grads

    _, want = run(ref, x.double(), False)
    errs = {}
    for path in ("rec", "fla"):
        monkeypatch.setenv(SWITCH[name], path)
        backend, got = run(m, x, True)
        errs[path] = (backend, [rel(a, b) for a, b in zip(got, [w.to(dy.dtype) for w in want])])
    print(name, T, neg, errs)
    assert errs["rec"][0] == "triton-rec" and errs["fla"][0].startswith("fla-chunk"), errs
    for e_rec, e_fla in zip(errs["rec"][1], errs["fla"][1]):
        assert e_rec <= 1.5 * e_fla + 2e-3, errs
