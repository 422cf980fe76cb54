"""Generation speed of the task generators (CPU).

    .venv/bin/python benchmarks/bench_tasks.py [--quick] [--hard]

Times MQAR (V=8192, L=512, kv=64, 100,000 train sequences; goal <= 2 s) and every MAD
setting at its training size (goal <= 5 s each), printing wall and CPU seconds. Wall time
depends on what else runs on the machine; CPU time is the process's own.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from mixzoo.registry import tasks  # noqa: E402
from mixzoo.tasks.mad import mad_settings  # noqa: E402


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="MQAR only")
    p.add_argument("--hard", action="store_true", help="also the harder MAD range")
    p.add_argument("--repeat", type=int, default=2, help="MQAR repetitions (best is reported)")
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    mq = tasks()["mqar"](V=8192, L=512, kv=64)
    best = None
    for _ in range(args.repeat):
        _, w, c = timed(lambda: mq.generate("train", 100_000, 0))
        best = (w, c) if best is None or w < best[0] else best
    print(f"mqar V=8192 L=512 kv=64 n=100000: wall {best[0]:.2f} s, cpu {best[1]:.2f} s "
          f"({'ok' if best[0] <= 2 else 'over'} the 2 s goal)")
    if args.quick:
        return 0
    worst = 0.0
    settings = mad_settings() + (mad_settings(hard=True) if args.hard else [])
    for name, knobs in settings:
        t = tasks()[name].from_knobs(knobs)
        n = t.sizes()["train"]
        _, w, c = timed(lambda t=t, n=n: t.generate("train", n, 0))
        worst = max(worst, w)
        desc = " ".join(f"{k}={v}" for k, v in knobs.items())
        print(f"{name:<20} {desc:<48} n={n:<6} wall {w:6.2f} s  cpu {c:6.2f} s"
              f"{'' if w <= 5 else '  OVER 5 s'}")
    print(f"slowest MAD setting: {worst:.2f} s wall ({len(settings)} settings)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
