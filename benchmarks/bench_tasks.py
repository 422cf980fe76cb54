"""Generation speed of the task generators (CPU), and the peak memory of the vector ones.

    .venv/bin/python benchmarks/bench_tasks.py [--quick] [--no-hard] [--repeat N] [--mad-repeat N]
                                               [--memory] [--device cpu|cuda]

Times MQAR (V=8192, L=512, kv=64, 100,000 train sequences; goal <= 2 s wall on 2 cores),
every one of MAD's 66 settings at its training size (goal <= 5 s each) with the slowest
setting per task, and the harder MAD range (vocabulary up to 512, context 2048). Each line
gives wall and CPU seconds (time.process_time: all threads of this process). Wall time
depends on what else runs on the machine, so the load average is printed before and after;
CPU time is the process's own. The best of the repeats (by wall time) is reported.

Memory (last, or alone with ``--memory``): icl-regression at the paper's size (100,000
sequences, L=256, S=64, d_x=d_y=32, 16 queries) and ttr (100,000 sequences, L=256, S=128,
d=32), each in a fresh process: the bytes of the Batch returned, the peak bytes of the
generation (the growth of the process's peak RSS, VmHWM, over its value after the imports
and a warm-up generate of 4 sequences; on ``--device cuda`` also the device's peak allocated
bytes over those before) and their ratio (goal <= 2), and the generation's wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from mixzoo.registry import tasks  # noqa: E402
from mixzoo.tasks.mad import mad_settings  # noqa: E402


def timed(fn, repeat: int = 1):
    """(best wall, its cpu) over ``repeat`` calls of fn."""
    best = None
    for _ in range(max(1, repeat)):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - w0, time.process_time() - c0
        best = (w, c) if best is None or w < best[0] else best
    return best


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def bench_mad(settings, repeat: int, goal: float | None) -> dict[str, tuple[float, float, str]]:
    worst: dict[str, tuple[float, float, str]] = {}
    for name, knobs in settings:
        t = tasks()[name].from_knobs(knobs)
        n = t.sizes()["train"]
        w, c = timed(lambda t=t, n=n: t.generate("train", n, 0), repeat)
        desc = " ".join(f"{k}={v}" for k, v in knobs.items())
        flag = "" if goal is None or w <= goal else f"  OVER {goal:g} s"
        print(f"{name:<20} {desc:<56} n={n:<6} wall {w:6.2f} s  cpu {c:6.2f} s{flag}", flush=True)
        if name not in worst or w > worst[name][0]:
            worst[name] = (w, c, desc)
    return worst


# Run in a fresh interpreter: argv = task name, JSON knobs, n, device; prints one JSON line.
_PEAK = r"""
import json, sys, time
sys.path.insert(0, sys.argv[5])

def hwm():   # this image's resident high-water mark (ru_maxrss would carry the parent's over fork + exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

import torch
from mixzoo.registry import tasks
name, knobs, n, device = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cuda = device.startswith("cuda")
t = tasks()[name](**knobs)
t.generate("train", 4, 0, device)
if cuda:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    dev0 = torch.cuda.memory_allocated()
rss0 = hwm()
w = time.perf_counter()
b = t.generate("train", n, 0, device)
if cuda:
    torch.cuda.synchronize()
w = time.perf_counter() - w
out = sum(x.numel() * x.element_size() for x in (b.inputs, b.targets, b.mask, *b.slices.values()))
r = {"version": t.version, "out": out, "wall": w,
     "host": hwm() - rss0}
if cuda:
    r["device"] = torch.cuda.max_memory_allocated() - dev0
print(json.dumps(r))
"""

MEMORY_CASES = (("icl-regression", {"L": 256, "S": 64, "d_x": 32, "d_y": 32, "n_queries": 16}, 100_000),
                ("ttr", {"L": 256, "S": 128, "d": 32}, 100_000))


def peak_memory(name: str, knobs: dict, n: int, device: str = "cpu") -> dict:
    """One generate of ``n`` training sequences in a fresh process: output bytes, peak bytes
    (``host``: growth of VmHWM; ``device``: CUDA peak allocated, on cuda), wall seconds."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    p = subprocess.run([sys.executable, "-c", _PEAK, name, json.dumps(knobs), str(n), device, root],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{name} n={n}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def bench_memory(device: str) -> None:
    print(f"\ngenerator memory on {device} (fresh process each; goal: peak <= 2x the output)", flush=True)
    for name, knobs, n in MEMORY_CASES:
        r = peak_memory(name, knobs, n, device)
        desc = " ".join(f"{k}={v}" for k, v in knobs.items())
        peak = r["device"] if "device" in r else r["host"]
        extra = f", host peak {r['host']:,} B" if "device" in r else ""
        print(f"{name} {desc} n={n} (v{r['version']}): output {r['out']:,} B, peak {peak:,} B, "
              f"ratio {peak / r['out']:.3f} ({'ok' if peak <= 2 * r['out'] else 'over'} the 2x goal){extra}, "
              f"wall {r['wall']:.2f} s", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="MQAR only")
    p.add_argument("--no-hard", action="store_true", help="skip the harder MAD range")
    p.add_argument("--repeat", type=int, default=3, help="MQAR repetitions (best is reported)")
    p.add_argument("--mad-repeat", type=int, default=1, help="repetitions of each MAD setting")
    p.add_argument("--memory", action="store_true", help="only the generator-memory lines")
    p.add_argument("--device", default="cpu", help="device of the generator-memory lines (default cpu)")
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
          f"load average {load()} (1/5/15 min)")
    if args.memory:
        bench_memory(args.device)
        print(f"load average after: {load()}")
        return 0
    mq = tasks()["mqar"](V=8192, L=512, kv=64)
    w, c = timed(lambda: mq.generate("train", 100_000, 0), args.repeat)
    print(f"mqar V=8192 L=512 kv=64 n=100000 (v{mq.version}): wall {w:.2f} s, cpu {c:.2f} s, best of {args.repeat} "
          f"({'ok' if w <= 2 else 'over'} the 2 s goal)", flush=True)
    if args.quick:
        print(f"load average after: {load()}")
        return 0
    settings = mad_settings()
    print(f"\nMAD: {len(settings)} settings at their train size (goal <= 5 s wall each)")
    worst = bench_mad(settings, args.mad_repeat, 5.0)
    print("\nslowest setting per MAD task:")
    for name, (w, c, desc) in worst.items():
        print(f"  {name:<20} wall {w:6.2f} s  cpu {c:6.2f} s  ({desc})")
    top = max(v[0] for v in worst.values())
    print(f"slowest MAD setting: {top:.2f} s wall ({'ok' if top <= 5 else 'over'} the 5 s goal)")
    if not args.no_hard:
        hard = mad_settings(hard=True)
        print(f"\nharder MAD range: {len(hard)} settings")
        hw = bench_mad(hard, args.mad_repeat, None)
        name, (w, c, desc) = max(hw.items(), key=lambda kv: kv[1][0])
        print(f"slowest harder setting: {name} {desc}: wall {w:.2f} s, cpu {c:.2f} s")
    bench_memory(args.device)
    print(f"\nload average after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
