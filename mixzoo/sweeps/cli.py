"""``mixzoo sweep`` and ``mixzoo compare``."""
from __future__ import annotations

from ..errors import UsageError


def configure(name: str, p) -> None:
    if name == "sweep":
        p.add_argument("spec")
    else:
        p.add_argument("task")


def main(args) -> int:
    raise UsageError(f"{args.command} is not available yet")
