"""``mixzoo bench kernels|mixers|throughput``."""
from __future__ import annotations

import importlib
from pathlib import Path

TRAILING = "names"         # names after the options are mechanism names too

WHAT = {"kernels": "mixzoo.bench.kernels", "mixers": "mixzoo.bench.mixers",
        "throughput": "mixzoo.bench.throughput"}
MIXER_SHAPES = ("default", "mad")


def configure(name: str, p) -> None:
    p.add_argument("what", choices=sorted(WHAT))
    p.add_argument("names", nargs="*", metavar="NAME[:KEY=V,...]",
                   help="mixers: the mechanisms to time (default: all), optionally with knobs; throughput: the "
                        "mechanisms of the step-mode matrix (default: MIXZOO_BENCH_MIXERS or softmax,gdn)")
    p.add_argument("--quick", action="store_true", help="small shapes, for a smoke check")
    p.add_argument("--shape", default=None,
                   help="mixers: default (batch 8, length 1024, 2 heads) or mad (batch 128, length 128, 16 heads "
                        "of width 8); throughput: the step-mode matrix at these shapes, comma-separated, of "
                        "tiny (CPU smoke), mad (MAD's baseline), mad32, mad64, mad256, mad512, mad1024 (the baseline at "
                        "MAD's other lengths), mqar512 (V 8192, L 512)")
    p.add_argument("--out", help="also write the table as JSON here")
    t = p.add_argument_group("throughput: the step-mode matrix (with --shape or mechanism names)")
    t.add_argument("--modes", default="eager,graphed,stacked,stacked+graphed",
                   help="one-process step modes to measure (eager is always measured: the baseline)")
    t.add_argument("--K", default="4,8,16", help="models per stacked step, for the stacked modes")
    t.add_argument("--procs", default="4,8", help="processes per device for the packed cells ('' for none)")
    t.add_argument("--pack", default="eager,graphed,stacked+graphed:8",
                   help="the cells run packed, MODE[:K] each, at every --procs")
    t.add_argument("--steps", type=int, default=100, help="timed steps per cell")
    t.add_argument("--warmup", type=int, default=20, help="steps before timing (autotuning, capture)")
    t.add_argument("--budget-s", type=float, default=0.0, help="start no cell after this many seconds (0: no limit)")
    t.add_argument("--md", help="also write the Markdown tables here")
    t.add_argument("--project", metavar="JSON", nargs="+",
                   help="no measuring: the MAD-protocol projection from these JSON files (their rows together; "
                        "with --protocol settings, rows at mad32, mad64, mad256, mad512, mad1024 give those lengths' step "
                        "times)")
    t.add_argument("--protocol", choices=("readme", "settings"), default="readme",
                   help="the projection's work model: readme (66 x 9 runs x 20k steps at 2.3x the baseline "
                        "length, as the README's) or settings (each setting's own length and training-set size)")
    t.add_argument("--validation", metavar="JSON",
                   help="--project --protocol settings: benchmarks/validation_time.py's rows (same card as the rates); "
                        "the hours of the runs' validation and test passes, shown beside the projection")
    t.add_argument("--trials", type=int, default=None,
                   help="--project: runs of each setting's search (default 6, MAD's grid: 3 learning rates x 2 weight decays)")
    t.add_argument("--seeds", type=int, default=None,
                   help="--project: runs of each setting's best configuration after the search (default mixzoo's 3; "
                        "0 for MAD's own protocol, which reports the best of its search runs)")


def main(args) -> int:
    from ..errors import UsageError
    if args.shape and args.what == "mixers" and args.shape not in MIXER_SHAPES:
        raise UsageError(f"bench mixers: --shape {args.shape!r}; allowed: {', '.join(MIXER_SHAPES)}")
    if args.shape and args.what not in ("mixers", "throughput"):
        raise UsageError(f"bench {args.what} takes no --shape (mixers and throughput only)")
    if args.names and args.what not in ("mixers", "throughput"):
        raise UsageError(f"bench {args.what} takes no mechanism names")
    if args.names and args.what == "throughput" and not args.shape:
        raise UsageError("bench throughput takes mechanism names with --shape only (the step-mode matrix); "
                         "MIXZOO_BENCH_MIXERS=a,b sets them for the harness comparison")
    for flag in ("steps", "warmup"):
        if getattr(args, flag) < 1:
            raise UsageError(f"bench: --{flag} must be >= 1")
    given = [f"--{k}" for k in ("trials", "seeds") if getattr(args, k, None) is not None]
    if given and not getattr(args, "project", None):
        raise UsageError(f"bench: {' and '.join(given)} count the MAD projection's runs: with throughput --project only")
    if getattr(args, "validation", None):
        if not (getattr(args, "project", None) and args.protocol == "settings"):
            raise UsageError("bench throughput: --validation goes with --project and --protocol settings")
        if not Path(args.validation).is_file():
            raise UsageError(f"bench throughput --validation: no file {args.validation}")
    args.trials = 6 if getattr(args, "trials", None) is None else args.trials
    args.seeds = 3 if getattr(args, "seeds", None) is None else args.seeds
    if args.trials < 1 or args.seeds < 0:
        raise UsageError(f"bench throughput: --trials {args.trials}, --seeds {args.seeds}; --trials must be >= 1 and "
                         "--seeds >= 0")
    try:
        mod = importlib.import_module(WHAT[args.what])
    except ModuleNotFoundError:
        raise UsageError(f"bench {args.what} is not available yet") from None
    return int(mod.main(args) or 0)
