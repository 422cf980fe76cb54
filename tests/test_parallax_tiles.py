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
