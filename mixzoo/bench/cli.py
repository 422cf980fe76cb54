"""``mixzoo bench kernels|mixers|throughput``."""
from __future__ import annotations

import importlib

TRAILING = "names"         # names after the options are mechanism names too

WHAT = {"kernels": "mixzoo.bench.kernels", "mixers": "mixzoo.bench.mixers",
        "throughput": "mixzoo.bench.throughput"}


def configure(name: str, p) -> None:
    p.add_argument("what", choices=sorted(WHAT))
    p.add_argument("names", nargs="*", metavar="NAME[:KEY=V,...]",
                   help="mixers only: the mechanisms to time (default: all), optionally with knobs")
    p.add_argument("--quick", action="store_true", help="small shapes, for a smoke check")
    p.add_argument("--shape", choices=("default", "mad"), default=None,
                   help="mixers only: default (batch 8, length 1024, 2 heads) or mad (batch 128, length 128, "
                        "16 heads of width 8)")
    p.add_argument("--out", help="also write the table as JSON here")


def main(args) -> int:
    from ..errors import UsageError
    if args.shape and args.what != "mixers":
        raise UsageError(f"bench {args.what} takes no --shape (mixers only)")
    if args.names and args.what != "mixers":
        raise UsageError(f"bench {args.what} takes no mechanism names (MIXZOO_BENCH_MIXERS=a,b sets them)")
    try:
        mod = importlib.import_module(WHAT[args.what])
    except ModuleNotFoundError:
        raise UsageError(f"bench {args.what} is not available yet") from None
    return int(mod.main(args) or 0)
