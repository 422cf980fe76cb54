"""``mixzoo bench kernels|mixers|throughput``."""
from __future__ import annotations

import importlib

WHAT = {"kernels": "mixzoo.bench.kernels", "mixers": "mixzoo.bench.mixers",
        "throughput": "mixzoo.bench.throughput"}


def configure(name: str, p) -> None:
    p.add_argument("what", choices=sorted(WHAT))
    p.add_argument("--quick", action="store_true", help="small shapes, for a smoke check")
    p.add_argument("--out", help="also write the table as JSON here")


def main(args) -> int:
    from ..errors import UsageError
    try:
        mod = importlib.import_module(WHAT[args.what])
    except ModuleNotFoundError:
        raise UsageError(f"bench {args.what} is not available yet") from None
    return int(mod.main(args) or 0)
