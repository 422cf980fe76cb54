"""``mixzoo bench mixers``: forward+backward time and peak memory of every mechanism, side by side.

Default shape: batch 8, length 1024, width 128, 2 heads, one mixer layer, bf16 autocast on a
GPU (float32 on a CPU); the time is the median of timed steps after warm-up (a mechanism's
first GPU call may autotune Triton kernels for minutes). ``--quick``: batch 2, length 64,
width 32, for a smoke run on a CPU in seconds. ``--shape mad``: the mad recipe's layer (width 128
in 16 heads of 8) at MAD's baseline shape (batch 128, length 128). The table gives each time as a
multiple of softmax's when softmax is among the rows. On a GPU each mechanism is also timed as
one captured CUDA graph of the same forward+backward (``graphed ms``: back-to-back replays, so the
device's time without the host's launch overhead; the mode sweeps train in on a GPU), or the
reason its capture failed.

Mechanisms: all registered, or those named (``MIXZOO_BENCH_MIXERS=a,b`` or on the command line);
``NAME:KEY=V[,KEY=V]`` times a variant, e.g. ``mamba:allow_neg_eigval=true``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

FULL = dict(batch=8, seq_len=1024, d_model=128, num_heads=2, warmup=3, iters=20)
QUICK = dict(batch=2, seq_len=64, d_model=32, num_heads=2, warmup=1, iters=3)
# the mad recipe's layer at MAD's baseline training shape: width 128 in 16 heads of 8, batch 128, length 128
MAD = dict(batch=128, seq_len=128, d_model=128, num_heads=16, warmup=3, iters=20)
SHAPES = {"default": FULL, "quick": QUICK, "mad": MAD}


def bench_mixers(names=None, *, batch: int = 8, seq_len: int = 1024, d_model: int = 128, num_heads: int = 2,
                 device: str | None = None, warmup: int = 3, iters: int = 20, knobs: dict | None = None,
                 log=None) -> list[dict]:
    """One row per mechanism: backend, params, median fwd+bwd milliseconds, peak memory bytes
    (CUDA only) or an error. ``names``: mechanism names or (name, knobs) pairs; ``knobs``:
    {name: knobs} for names given bare."""
    import torch

    from ..registry import build_mixer, mixers
    reg = mixers()
    names = list(names or reg)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for entry in names:
        name, kn = (entry, (knobs or {}).get(entry, {})) if isinstance(entry, str) else entry
        row = {"mechanism": name, **({"knobs": dict(kn)} if kn else {}), "batch": batch, "seq_len": seq_len, "d_model": d_model,
               "num_heads": num_heads, "device": str(dev), "dtype": "bf16-autocast" if cuda else "float32"}
        try:
            torch.manual_seed(0)
            m = build_mixer(reg[name], d_model, num_heads=num_heads, l_max=seq_len, **kn).to(dev)
            row["params"] = sum(p.numel() for p in m.parameters())
            x = torch.randn(batch, seq_len, d_model, device=dev, requires_grad=True)
            gy = torch.randn(batch, seq_len, d_model, device=dev)

            def step(m=m, x=x, gy=gy):
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                    y = m(x)
                y.backward(gy.to(y.dtype))
                m.zero_grad(set_to_none=True)
                x.grad = None

            t0 = time.perf_counter()
            for _ in range(warmup):
                step()
            sync()
            row["warmup_s"] = round(time.perf_counter() - t0, 2)
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
                base = torch.cuda.memory_allocated(dev)
            times = []
            for _ in range(iters):
                sync()
                t = time.perf_counter()
                step()
                sync()
                times.append(time.perf_counter() - t)
            row["ms"] = round(1e3 * statistics.median(times), 3)
            row["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(dev) - base) if cuda else None
            row["backend"] = getattr(m, "backend", "torch")
            if cuda:
                try:
                    row["graphed_ms"] = round(graphed_ms(step, dev, iters), 3)
                except Exception as e:        # a mechanism that cannot be captured keeps its eager time
                    row["graphed_error"] = f"{type(e).__name__}: {e}"[:200]
            del m, x, gy, step
            if cuda:
                torch.cuda.empty_cache()
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        if log:
            log(row)
        rows.append(row)
    return rows


def graphed_ms(step, dev, iters: int) -> float:
    """Milliseconds a replay of ``step`` captured as one CUDA graph (two eager warm-up calls on a
    side stream first, as capture requires), timed over ``iters`` back-to-back replays."""
    import torch
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    from ..train.graphed import capture
    g = capture(step, dev)
    g.replay()
    torch.cuda.synchronize(dev)
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(iters):
        g.replay()
    t1.record()
    torch.cuda.synchronize(dev)
    ms = t0.elapsed_time(t1) / iters
    del g
    return ms


def label(row: dict) -> str:
    """The mechanism's name with its knobs, if any: ``mamba allow_neg_eigval=True``."""
    kn = row.get("knobs") or {}
    return " ".join([row["mechanism"], *(f"{k}={v}" for k, v in kn.items())])


def progress_line(row: dict) -> str:
    """One row as it is measured: ``  gdn: 6.20 ms (fla-chunk+torch-dqkwg)`` or its error."""
    if row.get("error"):
        return f"  {label(row)}: {row['error']}"
    g = (f", graphed {row['graphed_ms']:.2f} ms" if "graphed_ms" in row
         else f", capture failed: {row['graphed_error']}" if "graphed_error" in row else "")
    return f"  {label(row)}: {row['ms']:.2f} ms ({row['backend']}){g}"


def format_table(rows: list[dict]) -> str:
    wm = max([len("mechanism")] + [len(label(r)) for r in rows])
    wb = max([len("backend")] + [len(r.get("backend", "")) for r in rows])
    base = next((r["ms"] for r in rows if r["mechanism"] == "softmax" and not r.get("knobs") and "ms" in r), None)
    gbase = next((r.get("graphed_ms") for r in rows if r["mechanism"] == "softmax" and not r.get("knobs")), None)
    graphed = any("graphed_ms" in r or "graphed_error" in r for r in rows)
    lines = [f"{'mechanism':<{wm}} {'backend':<{wb}} {'params':>9} {'fwd+bwd ms':>11} {'x softmax':>9} "
             f"{'peak MiB':>9} {'warm-up s':>9}" + (f" {'graphed ms':>10} {'x softmax':>9}" if graphed else "")]
    for r in rows:
        if "error" in r:
            lines.append(f"{label(r):<{wm}} error: {r['error']}")
            continue
        mem = f"{r['peak_mem_bytes'] / 2**20:.1f}" if r.get("peak_mem_bytes") is not None else "-"
        ratio = f"{r['ms'] / base:.2f}" if base else "-"
        line = (f"{label(r):<{wm}} {r['backend']:<{wb}} {r['params']:>9} {r['ms']:>11.2f} {ratio:>9} {mem:>9} "
                f"{r['warmup_s']:>9}")
        if "graphed_ms" in r:
            gr = f"{r['graphed_ms'] / gbase:.2f}" if gbase else "-"
            line += f" {r['graphed_ms']:>10.2f} {gr:>9}"
        elif "graphed_error" in r:
            line += f" capture failed: {r['graphed_error']}"
        lines.append(line)
    return "\n".join(lines)


def parse_names(items: list[str]) -> list:
    """``NAME`` or ``NAME:KEY=V[,KEY=V]`` -> name or (name, knobs); unknown names are usage errors."""
    from ..api import check_mixer_knobs
    from ..commands import literal, parse_pairs
    from ..registry import get_mixer
    out = []
    for it in items:
        name, _, rest = it.partition(":")
        get_mixer(name)
        knobs = {k: literal(v) for k, v in parse_pairs(rest.split(","), it).items()} if rest else {}
        check_mixer_knobs(name, knobs)
        out.append((name, knobs) if rest else name)
    return out


def main(args) -> int:
    import torch
    shape = QUICK if getattr(args, "quick", False) else SHAPES[getattr(args, "shape", None) or "default"]
    dev = getattr(args, "device", "auto")
    dev = None if dev in (None, "", "auto") else dev
    device = dev or ("cuda" if torch.cuda.is_available() else "cpu")
    where = torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU"
    names = parse_names(list(getattr(args, "names", None) or [])
                        or [n for n in os.environ.get("MIXZOO_BENCH_MIXERS", "").split(",") if n]) or None
    print(f"bench mixers: batch {shape['batch']}, length {shape['seq_len']}, width {shape['d_model']}, "
          f"{shape['num_heads']} heads, one layer, forward+backward; "
          f"{'bf16 autocast' if device.startswith('cuda') else 'float32'} on {where}, torch {torch.__version__}; "
          f"median of {shape['iters']} steps after {shape['warmup']} warm-up", flush=True)
    log = lambda r: print(progress_line(r), file=sys.stderr, flush=True)
    rows = bench_mixers(names, device=device, log=log, **shape)
    print(format_table(rows))
    if getattr(args, "out", None):
        from ..leaderboard.export import write_atomic
        write_atomic(args.out, json.dumps({"rows": rows, "torch": torch.__version__, "device_name": where}, indent=1))
        print(f"written {args.out}")
    return 1 if any("error" in r for r in rows) else 0
