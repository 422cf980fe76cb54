"""The short convolution's backward (``mixzoo.kernels.causal_conv_triton``) timed on this GPU, each way checked against
float64 on the first 16 sequences, at gdn's ConvAct of the mad recipe (3 x 128 channels, width 4, SiLU, bias;
bfloat16 input and output gradient): one model (batch 128) and six stacked (batch 768) at lengths 128 and 1024.
Side by side at each shape: the two passes (``backward_two_pass``) at the tilings of ``--tiles`` (default: the
module's), the one-pass backward a row at a time (``backward_seq``) at the tilings of ``--seq-tiles``, and the
forward both ways (``forward_tiles``; ``forward_seq`` at ``--fwd-seq-tiles``); beside another version of the
kernels' file (the one before a change: ``--old PATH``, its ``backward``). Prints one line per (shape, version,
tiling) and writes JSON: the two passes' rows as before (version "this" / "old", ``tiles``, ``ms``, ``errors``,
``same_as_two_passes``); the one-row backward's with version "this, seq", ``seq_tiles`` and ``vs_two_passes``
(the norm-relative differences of dx, dw, db from the two passes at the full shape); the forward's with ``pass``
"forward"; and a ``summary``: at each shape the two passes' time at the default tiling and the fastest one-row
tiling's.

    python benchmarks/conv_tiles.py --out conv_tiles.json
    python benchmarks/conv_tiles.py --old .gpu/old/causal_conv_triton.py --out conv_tiles.json
    python benchmarks/conv_tiles.py --smoke      # the CPU, Triton's interpreter, tiny shapes: the script runs through
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the one-row backward's tilings, CHANNELSxWARPSxTBxSTAGESxUNROLL (22): around the default (128 x 1 x 128 x 2 x 4):
# pipelining off, 2 and 3 stages, unrolled once, W - 1 = 3, 4 and 8 times, spans of 64 to 512; 1, 2, 4 and 8 channels
# a thread (64 x 2 is not pipelined: a bf16 channel a thread is under cp.async's 4 bytes)
SEQ_TILES = ("128x1x128x1x1,128x1x128x1x4,128x1x128x2x4,128x1x128x3x4,128x1x128x2x3,128x1x128x2x8,128x1x64x2x4,"
             "128x1x256x2x4,128x1x256x3x4,128x1x512x2x4,128x2x128x1x1,128x2x128x1x4,128x2x128x2x4,128x2x128x3x4,"
             "128x2x256x2x4,64x1x128x2x4,64x1x128x3x4,64x1x256x2x4,256x2x128x2x4,256x2x128x3x4,256x4x128x2x4,"
             "256x1x128x2x4")
FWD_SEQ_TILES = ("128x1x128x2x4,128x1x128x3x4,128x1x256x2x4,128x2x128x1x1,128x2x128x2x4,128x2x128x3x4,64x1x128x2x4,"
                 "64x1x128x3x4,256x2x128x2x4")


def _load(path: str, name: str):
    """Another kernels' file as a module of mixzoo.kernels (``from . import ...`` inside it resolves there)."""
    import mixzoo.kernels  # noqa: F401  the package the file's relative imports resolve in
    spec = importlib.util.spec_from_file_location(f"mixzoo.kernels.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ms(fn, smoke: bool) -> float:
    """Median milliseconds of ``fn()`` on the device (triton.testing.do_bench: warm-up, then timed repeats); under
    ``--smoke`` one call's wall time in the interpreter (no timing: the script running through)."""
    if smoke:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _tilings(spec: str, n: int) -> list[tuple[int, ...]]:
    out = [tuple(map(int, t.split("x"))) for t in spec.split(",") if t]
    for t in out:
        if len(t) != n:
            raise SystemExit(f"conv_tiles: tiling {'x'.join(map(str, t))} has {len(t)} numbers, not {n}")
    return out


def _rel(got, ref) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="another causal_conv_triton.py to time beside this one (its backward)")
    ap.add_argument("--tiles", help="the two passes' BTxBCxWARPSxTB tilings to time: the weight-gradient pass's "
                                    "positions per block, channels per block (both passes), its warps, positions per "
                                    "program (both passes; a multiple of 32). Default: the module's, "
                                    "e.g. 8x64x2x128,16x64x4x128 for two")
    ap.add_argument("--seq-tiles", default=SEQ_TILES,
                    help="the one-row backward's CHANNELSxWARPSxTBxSTAGESxUNROLL tilings (channels per program, "
                         "warps, positions per program, tl.range's num_stages and loop_unroll_factor); '' for none")
    ap.add_argument("--fwd-seq-tiles", default=FWD_SEQ_TILES, help="the one-row forward's, likewise; '' for none")
    ap.add_argument("--smoke", action="store_true", help="on the CPU in Triton's interpreter at tiny shapes (the "
                                                         "script's code paths, not timings)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.smoke:                      # the interpreter with the H200's numerics, as the CPU tests run the kernels
        os.environ["TRITON_INTERPRET"] = "1"                 # before triton is imported
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import lla_small_ridge
        lla_small_ridge.emulate_gpu_numerics()
    import torch

    from mixzoo.kernels import causal_conv as CC
    from mixzoo.kernels import causal_conv_triton as new
    dev = "cpu" if a.smoke else "cuda"
    mods = {"this": new} | ({"old": _load(a.old, "_conv_tiles_old")} if a.old else {})
    default = (new.DZ_BT, new.BC, new.DZ_WARPS, new.TB)
    two_tiles = _tilings(a.tiles, 4) if a.tiles else [default]
    seq_tiles, fwd_tiles = _tilings(a.seq_tiles, 5), _tilings(a.fwd_seq_tiles, 5)
    if a.smoke:                                              # a few of each: the interpreter walks rows slowly
        seq_tiles, fwd_tiles = seq_tiles[:3], fwd_tiles[:2]
    shapes = ((2, 45), (2, 7)) if a.smoke else ((128, 128), (128, 1024), (768, 1024))
    C, W = (6, 4) if a.smoke else (384, 4)
    rows, summary = [], []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    for B, T in shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(B, T, C, device=dev, generator=g).bfloat16()
        w = torch.randn(C, W, device=dev, generator=g) * 0.5
        b = torch.randn(C, device=dev, generator=g) * 0.1
        dy = torch.randn(B, T, C, device=dev, generator=g).bfloat16()
        n = min(16, B)                           # the float64 reference on the first sequences
        ins = [x[:n].double().requires_grad_(), w.double().requires_grad_(), b.double().requires_grad_()]
        want = CC.causal_conv_torch(*ins, True)
        wants = torch.autograd.grad(want, ins, dy[:n].double())
        want = want.detach()
        x16, dy16 = x[:n].contiguous(), dy[:n].contiguous()
        two_ref = None                           # this file's two passes at its default tiling, at the full shape
        shape_ms = {}
        for label, mod in mods.items():
            # the two passes: backward_two_pass where the file has it (its backward may be the one-row pass), else
            # its backward (the files up to 2026-12-04)
            two = getattr(mod, "backward_two_pass", mod.backward)
            tilings = two_tiles if label == "this" else [None]
            for tiles in tilings:
                if tiles is not None:
                    mod.DZ_BT, mod.BC, mod.DZ_WARPS, mod.TB = tiles
                    assert mod.TB % 32 == 0 and mod.TB % mod.DZ_BT == 0, tiles
                # a file's one-pass backward too where it has one (as up to 2026-12-03), which must give the two
                # passes' numbers
                fns = {label: two} | ({f"{label}, one pass": mod.backward_fused}
                                      if hasattr(mod, "backward_fused") else {})
                for name, fn in fns.items():
                    try:
                        errs = [_rel(got, ref) for got, ref in zip(fn(x16, w, b, True, dy16), wants)]
                        full = fn(x, w, b, True, dy)
                        same = [bool(torch.equal(p, q)) for p, q in zip(full, two(x, w, b, True, dy))]
                        t = _ms(lambda fn=fn, x=x, w=w, b=b, dy=dy: fn(x, w, b, True, dy), a.smoke)
                        r = dict(B=B, T=T, C=C, version=name, tiles=tiles, ms=t, errors=errs, same_as_two_passes=same)
                        if label == "this" and tiles == default and name == label:
                            two_ref, shape_ms["two-pass"] = full, (t, list(tiles))
                    except Exception as e:        # a tiling this GPU cannot run: named, the others still timed
                        r = dict(B=B, T=T, C=C, version=name, tiles=tiles, error=f"{type(e).__name__}: {e}"[:300])
                    emit(r)
            if label == "this":
                mod.DZ_BT, mod.BC, mod.DZ_WARPS, mod.TB = default
        if two_ref is None:                      # the default tiling not among --tiles: this file's at its default
            two_ref = new.backward_two_pass(x, w, b, True, dy)
        # the one-row backward at each tiling: against float64 and against the two passes at the full shape
        best = None
        for tiles in seq_tiles:
            try:
                def fn(x_, dy_, tiles=tiles, w=w, b=b):
                    return new.backward_seq(x_, w, b, True, dy_, tiles)
                errs = [_rel(got, ref) for got, ref in zip(fn(x16, dy16), wants)]
                full = fn(x, dy)
                t = _ms(lambda fn=fn, x=x, dy=dy: fn(x, dy), a.smoke)
                r = dict(B=B, T=T, C=C, version="this, seq", seq_tiles=list(tiles), ms=t, errors=errs,
                         vs_two_passes=[_rel(p, q) for p, q in zip(full, two_ref)],
                         same_as_two_passes=[bool(torch.equal(p, q)) for p, q in zip(full, two_ref)])
                if best is None or r["ms"] < best[0]:
                    best = (r["ms"], list(tiles))
            except Exception as e:
                r = dict(B=B, T=T, C=C, version="this, seq", seq_tiles=list(tiles),
                         error=f"{type(e).__name__}: {e}"[:300])
            emit(r)
        if best:
            shape_ms["seq"] = best
        # the forward both ways
        y_ref = new.forward_tiles(x, w, b, True, torch.bfloat16)
        fwd_best = None
        for tiles in [None, *fwd_tiles]:
            version = "this, forward tiles" if tiles is None else "this, forward seq"
            try:
                def fn(x_, tiles=tiles, w=w, b=b):
                    if tiles is None:
                        return new.forward_tiles(x_, w, b, True, torch.bfloat16)
                    return new.forward_seq(x_, w, b, True, torch.bfloat16, tiles)
                full = fn(x)
                t = _ms(lambda fn=fn, x=x: fn(x), a.smoke)
                r = dict(B=B, T=T, C=C, version=version, **({} if tiles is None else {"seq_tiles": list(tiles)}),
                         ms=t, errors=[_rel(fn(x16), want)], same_as_tiles=bool(torch.equal(full, y_ref)))
                if tiles is None:
                    shape_ms["forward tiles"] = (r["ms"], [new.BT, new.BC, new.TB])
                elif fwd_best is None or r["ms"] < fwd_best[0]:
                    fwd_best = (r["ms"], list(tiles))
            except Exception as e:
                r = dict(B=B, T=T, C=C, version=version, **({} if tiles is None else {"seq_tiles": list(tiles)}),
                         error=f"{type(e).__name__}: {e}"[:300])
            emit({**r, "pass": "forward"})
        if fwd_best:
            shape_ms["forward seq"] = fwd_best
        summary.append(dict(B=B, T=T, C=C, **{k: dict(ms=v[0], tiles=v[1]) for k, v in shape_ms.items()}))
        print("summary", json.dumps(summary[-1]), flush=True)
    if a.out:
        device = "cpu (Triton's interpreter, --smoke)" if a.smoke else torch.cuda.get_device_name()
        Path(a.out).write_text(json.dumps(dict(device=device, rows=rows, summary=summary), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
