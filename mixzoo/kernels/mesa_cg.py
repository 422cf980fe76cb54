"""fla's MesaNet conjugate-gradient kernels at other launch settings (warps, stages).

fla launches both of its CG kernels (the forward's solve in ``fla.ops.mesa_net.chunk_cg_solver_fwd`` and the
backward's dq solve in ``chunk_cg_solver_bwd``, each named ``chunk_fwd_mesa_cg_dim64_kernel``) at 4 warps and 1 stage
whatever the head width; at the mesa recipe's heads (8, padded to 16) they are 30 % of a stacked MesaNet step at
length 1024 (benchmarks/h200-2026-12-03e, profile). ``MIXZOO_MESA_CG=W,S`` (one of ``MESA_CG``; ``4,1``, fla's, is
the default until another is timed faster on the H200 by benchmarks/mesa_cg_launch.py) relaunches both at W warps
and S stages: same kernels, same arguments, same grid.

fla's launchers take no launch settings and call no dispatcher for these kernels (unlike GLA's steps, which
``gla_steps`` registers with fla's backend registry), so ``install()`` replaces the kernel object each launcher looks
up in its module by a proxy that forwards every argument and sets the two launch settings from the switch at each
launch. With the switch at fla's setting the proxy launches exactly as fla does. Imports nothing of mixzoo.
"""
from __future__ import annotations

import os

from . import MESA_CG

SWITCH = "MIXZOO_MESA_CG"
FLA = (4, 1)                    # fla's own launch settings
_MODULES = ("fla.ops.mesa_net.chunk_cg_solver_fwd", "fla.ops.mesa_net.chunk_cg_solver_bwd")
_NAME = "chunk_fwd_mesa_cg_dim64_kernel"


def setting() -> tuple[int, int]:
    """(warps, stages) the switch asks for (fla's 4, 1 when unset)."""
    w, s = (os.environ.get(SWITCH) or MESA_CG[0]).split(",")
    return int(w), int(s)


class _Relaunch:
    """A Triton kernel launched at the switch's warps and stages, every other argument as given."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kw):
            kw["num_warps"], kw["num_stages"] = setting()
            return launch(*args, **kw)
        return run


def install() -> bool:
    """Put the proxy in front of both CG kernels (once). Returns whether they are behind it."""
    import importlib
    try:
        mods = [importlib.import_module(m) for m in _MODULES]
    except Exception:
        return False
    for m in mods:
        k = getattr(m, _NAME, None)
        if k is None:
            return False
        if not isinstance(k, _Relaunch):
            setattr(m, _NAME, _Relaunch(k))
    return True


def label() -> str:
    """The backend-name suffix for the switch: "" at fla's setting, else "+cg<W>w<S>s"."""
    w, s = setting()
    return "" if (w, s) == FLA else f"+cg{w}w{s}s"
