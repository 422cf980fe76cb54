"""Generation speed of the task generators (CPU).

    .venv/bin/python benchmarks/bench_tasks.py [--quick] [--no-hard] [--repeat N] [--mad-repeat N]

Times MQAR (V=8192, L=512, kv=64, 100,000 train sequences; goal <= 2 s wall on 2 cores),
every one of MAD's 66 settings at its training size (goal <= 5 s each) with the slowest
setting per task, and the harder MAD range (vocabulary up to 512, context 2048). Each line
gives wall and CPU seconds (time.process_time: all threads of this process). Wall time
depends on what else runs on the machine, so the load average is printed before and after;
CPU time is the process's own. The best of the repeats (by wall time) is reported.
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="MQAR only")
    p.add_argument("--no-hard", action="store_true", help="skip the harder MAD range")
    p.add_argument("--repeat", type=int, default=3, help="MQAR repetitions (best is reported)")
    p.add_argument("--mad-repeat", type=int, default=1, help="repetitions of each MAD setting")
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
          f"load average {load()} (1/5/15 min)")
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
    print(f"\nload average after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
