"""The short convolution's backward (``mixzoo.kernels.causal_conv_triton.backward``: the weight-gradient
pass and the input's) timed at several tilings on this GPU, each checked against float64, beside another
version of the kernels' file (the one before a change: ``--old PATH``), at gdn's ConvAct of the mad recipe
(3 x 128 channels, width 4, SiLU, bias; bfloat16 input and output gradient): one model (batch 128) and six
stacked (batch 768) at lengths 128 and 1024. Prints one line per (shape, tiling) and writes JSON.

    python benchmarks/conv_tiles.py --old .gpu/old/causal_conv_triton.py --out conv_tiles.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ms(fn) -> float:
    """Median milliseconds of ``fn()`` on the device (triton.testing.do_bench: warm-up, then timed repeats)."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="another causal_conv_triton.py to time beside this one")
    ap.add_argument("--tiles", default="8x64x2x128,16x64x4x128,16x64x4x64,16x64x4x256,16x64x4x1024,16x32x2x128",
                    help="BTxBCxWARPSxTB tilings to time: the weight-gradient pass's positions per block, channels per "
                         "block (every pass), its warps, positions per program (every pass; a multiple of 32)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    from mixzoo.kernels import causal_conv as CC
    from mixzoo.kernels import causal_conv_triton as new
    mods = {"this": new} | ({"old": _load(a.old, "old_causal_conv_triton")} if a.old else {})
    rows = []
    default = (new.DZ_BT, new.BC, new.DZ_WARPS, new.TB)
    for B, T in ((128, 128), (128, 1024), (768, 1024)):
        C, W = 384, 4
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(B, T, C, device="cuda", generator=g).bfloat16()
        w = torch.randn(C, W, device="cuda", generator=g) * 0.5
        b = torch.randn(C, device="cuda", generator=g) * 0.1
        dy = torch.randn(B, T, C, device="cuda", generator=g).bfloat16()
        n = 16                                   # the float64 reference on the first sequences
        ins = [x[:n].double().requires_grad_(), w.double().requires_grad_(), b.double().requires_grad_()]
        want = CC.causal_conv_torch(*ins, True)
        wants = torch.autograd.grad(want, ins, dy[:n].double())
        for label, mod in mods.items():
            tilings = [tuple(map(int, t.split("x"))) for t in a.tiles.split(",")] if label == "this" else [None]
            for tiles in tilings:
                if tiles is not None:
                    mod.DZ_BT, mod.BC, mod.DZ_WARPS, mod.TB = tiles
                    assert mod.TB % 32 == 0 and mod.TB % mod.DZ_BT == 0, tiles
                # the two passes; a file's one-pass backward too where it has one (as up to 2026-12-03), which must
                # give the two passes' numbers
                fns = {label: mod.backward} | ({f"{label}, one pass": mod.backward_fused}
                                               if hasattr(mod, "backward_fused") else {})
                for name, fn in fns.items():
                    try:
                        dx1, dw1, db1 = fn(x[:n].contiguous(), w, b, True, dy[:n].contiguous())
                        errs = [float((got.double() - ref).norm() / ref.norm())
                                for got, ref in zip((dx1, dw1, db1), wants)]
                        same = [bool(torch.equal(p, q)) for p, q in zip(fn(x, w, b, True, dy), mod.backward(x, w, b, True, dy))]
                        t = _ms(lambda fn=fn, x=x, w=w, b=b, dy=dy: fn(x, w, b, True, dy))
                        r = dict(B=B, T=T, C=C, version=name, tiles=tiles, ms=t, errors=errs, same_as_two_passes=same)
                    except Exception as e:        # a tiling this GPU cannot run: named, the others still timed
                        r = dict(B=B, T=T, C=C, version=name, tiles=tiles, error=f"{type(e).__name__}: {e}"[:300])
                    rows.append(r)
                    print(json.dumps(r), flush=True)
        new.DZ_BT, new.BC, new.DZ_WARPS, new.TB = default
    if a.out:
        Path(a.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
