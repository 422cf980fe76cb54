"""``mixzoo check-mixer``: check a mechanism against the mixer contract."""
from __future__ import annotations

from .errors import UsageError


def configure(name: str, p) -> None:
    p.add_argument("names", nargs="*", help="mechanisms to check (default: all)")


def main(args) -> int:
    raise UsageError("check-mixer is not available yet")
