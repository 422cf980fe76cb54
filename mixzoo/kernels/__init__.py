"""Our own kernels, each with a plain-PyTorch reference beside it. Imports nothing of mixzoo.

``RAN`` names the backbone kernels (swiglu, rmsnorm, rope, causal_conv) that ran since the last
``reset()``: the trainer resets it when a run starts and records ``ran()`` in the run's result (the
leaderboard's ``kernels`` column), since they change a run's numbers at the input dtype's rounding."""

RAN: set[str] = set()


def reset() -> None:
    RAN.clear()


def ran() -> str | None:
    """The kernels that ran, comma-separated and sorted, or None."""
    return ",".join(sorted(RAN)) or None
