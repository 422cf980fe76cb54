"""mixzoo.kernels.mesa_cg off the GPU: the switch is checked at the edge, the proxy launches a kernel at the switch's
warps and stages with every other argument as given, and at fla's setting the backend name is fla's."""
from mixzoo import kernels
from mixzoo.kernels import mesa_cg


class _Kernel:
    """A stand-in for a Triton kernel: records the grid and the launch's arguments."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *a, **kw: self.calls.append((grid, a, kw))


def test_the_proxy_sets_only_the_launch_settings(monkeypatch):
    k = _Kernel()
    p = mesa_cg._Relaunch(k)
    monkeypatch.delenv(mesa_cg.SWITCH, raising=False)
    p[(4, 2)](1, x=2, num_warps=4, num_stages=1)
    monkeypatch.setenv(mesa_cg.SWITCH, "8,2")
    p[(3,)](5, y=None, num_warps=4, num_stages=1)
    assert k.calls == [((4, 2), (1,), dict(x=2, num_warps=4, num_stages=1)),
                       ((3,), (5,), dict(y=None, num_warps=8, num_stages=2))]
    assert mesa_cg.label() == "+cg8w2s"
    monkeypatch.setenv(mesa_cg.SWITCH, "4,1")
    assert mesa_cg.label() == "" and mesa_cg.setting() == mesa_cg.FLA


def test_the_switch_is_checked(monkeypatch):
    monkeypatch.setenv(mesa_cg.SWITCH, "3,1")
    assert "MIXZOO_MESA_CG" in kernels.switch_error()
    monkeypatch.setenv(mesa_cg.SWITCH, "2,2")
    assert kernels.switch_error() is None
