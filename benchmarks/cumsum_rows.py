"""torch.cumsum over many short rows, as mamba-ssm's SSD backward calls it (float32 (batch, heads, nchunks, 64),
``torch.cumsum(x, -1, out=x)``, ``torch.cumsum(x[..., 1:], -1, out=x[..., 1:])`` and ``x.flip(-1).cumsum(-1).flip(-1)``)
at one model's rows (batch 128, 16 heads, length 1024) and at six models' (K = 6 folded into the heads or the
batch). A graphed profile of the stacked Mamba-2 step put 4.6 ms of 85 in these calls, ~1.1 ms each, where the
one-model step's took ~10 us: this measures whether that is the op at that row count.

    python benchmarks/cumsum_rows.py [--reps 50] [--out FILE.json]

Prints one line per case (microseconds a call, CUDA events, median of ``--reps``, and the bytes read and written
over that time) and writes them as JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch

CASES = {
    "one model (128, 16, 16, 64)": (128, 16, 16, 64),
    "K=6 in heads (128, 96, 16, 64)": (128, 96, 16, 64),
    "K=6 in batch (768, 16, 16, 64)": (768, 16, 16, 64),
}


def _forms(x: torch.Tensor):
    return {
        "out=x": lambda: torch.cumsum(x, dim=-1, out=x),
        "out=x[...,1:]": lambda: torch.cumsum(x[..., 1:], dim=-1, out=x[..., 1:]),
        "flip-cumsum-flip": lambda: x.flip([-1]).cumsum(dim=-1).flip([-1]),
        "cumsum (new tensor)": lambda: x.cumsum(dim=-1),
    }


def time_call(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cumsum_rows: needs a CUDA device")
        return 2
    rows = []
    for name, shape in CASES.items():
        x = torch.randn(*shape, device="cuda") * 1e-3
        for form, fn in _forms(x).items():
            us = time_call(fn, a.reps)
            gbs = 2 * x.numel() * 4 / (us * 1e-6) / 1e9
            rows.append(dict(case=name, shape=list(shape), form=form, us=us, gb_per_s=gbs))
            print(f"{name:34s} {form:22s} {us:9.1f} us  {gbs:7.1f} GB/s", flush=True)
    if a.out:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(a.out)) or ".")
        with os.fdopen(fd, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, reps=a.reps, rows=rows), f,
                      indent=1)
        os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
