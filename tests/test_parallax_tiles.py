"""mixzoo.kernels.parallax_tiles off the GPU: fla's Parallax kernels do not run in Triton's interpreter (their loops
call ``.to`` on block indices), so numbers are checked on the GPU (tests/gpu/test_parallax_tiles_gpu.py); here the
switch, the tiles' check and the mechanism keeping its paths."""
import pytest
import torch


def test_off_the_gpu_the_mechanism_keeps_its_path(monkeypatch):
    from mixzoo.kernels import parallax_tiles as X
    monkeypatch.setenv("MIXZOO_PARALLAX_TILES", "mixzoo")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not X.runs_on(torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16))
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    m = build_mixer(get_mixer("parallax"), 32, num_heads=4, layer_idx=0, l_max=16)
    m(torch.randn(2, 9, 32))
    assert m.backend == "torch"


def test_switch_and_tiles_are_checked(monkeypatch):
    from mixzoo import kernels
    from mixzoo.kernels import parallax_tiles as X
    monkeypatch.setenv("MIXZOO_PARALLAX_TILES", "triton")
    assert "MIXZOO_PARALLAX_TILES" in kernels.switch_error()
    monkeypatch.setenv("MIXZOO_PARALLAX_TILES", "fla")
    assert kernels.switch_error() is None and X.switch() == "fla"
    with pytest.raises(ValueError, match="multiple"):
        X._check_tiles({"fwd": (96, 64, 4, 2)})
    with pytest.raises(ValueError, match="equal"):
        X.parallax(*(torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16),) * 3, torch.zeros(1, 4, 1, 16, dtype=torch.bfloat16))


def test_block_of_head_columns():
    from mixzoo.kernels import parallax_tiles as X
    assert [X.block_k(k) for k in (4, 8, 16, 20, 64)] == [16, 16, 16, 32, 64]


@pytest.mark.parametrize("env,tiles,width,backend", [
    ("none", True, 8, "fla-parallel+tiles+unpadded"),     # MIXZOO_FLA_PAD=none: heads of 8 handed over as they are
    ("16", True, 16, "fla-parallel+tiles"),               # MIXZOO_FLA_PAD=16: padded in memory
    (None, True, 8, "fla-parallel+tiles+unpadded"),       # the default (PARALLAX_PAD)
    ("none", False, 16, "fla-parallel"),                  # fla's own launcher needs 16 whatever the switch says
])
def test_the_layer_hands_the_kernels_unpadded_heads(monkeypatch, env, tiles, width, backend):
    """The plumbing off the GPU: the kernels' entry replaced by the reference on what the layer hands it (fla's
    layout, (B, T, H, width)); the layer's output must be the torch path's, and the width the switch's."""
    from mixzoo.kernels import parallax_tiles as X
    from mixzoo.models import _fla
    from mixzoo.models import parallax as P
    from mixzoo.registry import build_mixer, get_mixer, load_builtins
    load_builtins()
    if env is None:
        monkeypatch.delenv("MIXZOO_FLA_PAD", raising=False)
    else:
        monkeypatch.setenv("MIXZOO_FLA_PAD", env)
    seen = []

    def kernel(q, r, k, v, scale):
        seen.append((tuple(q.shape), q.is_contiguous() and r.is_contiguous() and k.is_contiguous()
                     and v.is_contiguous()))
        tt = lambda t: t.transpose(1, 2)                                   # noqa: E731
        return tt(P.parallax_reference(tt(q), tt(r), tt(k), tt(v), scale=scale))
    real_op = _fla._op
    monkeypatch.setattr(_fla, "_op", lambda mod, fn: kernel if mod == "mixzoo.kernels.parallax_tiles" else real_op(mod, fn))
    monkeypatch.setattr(X, "runs_on", lambda q: tiles)
    torch.manual_seed(0)
    m = build_mixer(get_mixer("parallax"), 32, num_heads=4, layer_idx=0, l_max=16).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    want = m(x)
    assert m.backend == "torch"
    monkeypatch.setattr(P.Parallax, "_fast", lambda self, q: kernel)
    got = m(x)
    assert m.backend == backend
    assert seen == [((2, 9, 4, width), True)]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
