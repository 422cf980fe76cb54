"""``mixzoo ttr``: training-free piecewise test-time regression."""
from __future__ import annotations

from ..errors import UsageError


def configure(name: str, p) -> None:
    pass


def main(args) -> int:
    raise UsageError("ttr is not available yet")
