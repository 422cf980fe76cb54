"""Permutation state tracking: follow swaps of items over N positions (LLA paper's task;
the token format is our reconstruction).

Tokens: items ``0..N-1``, positions ``N..2N-1``, then SWAP, QUERY, SEP, PAD. A sequence is
``PAD* I_pi(0) .. I_pi(N-1) SEP (SWAP P_a P_b)xS QUERY P_q``: the initial arrangement is stated
explicitly, S ~ Uniform{ceil(N/6) .. floor(N/3)} swaps of two distinct positions follow, and
the one supervised position (the last token) must output the item now at position q.
Shorter swap lists are left-padded so every sequence has the same length and ends on the
query. Metric: exact-match accuracy on that position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import UsageError
from ..registry import register_task
from .base import IGNORE, Batch, Metric, Task, generator, knob


@register_task("state-tracking")
@dataclass
class StateTracking(Task):
    """Permutation swaps over N positions; query the item at a position (exact match)."""

    N: int = knob(12, lo=2, hi=512, help="number of positions (and items)")
    min_swaps: int = knob(0, lo=0, hi=10_000, help="fewest swaps (0: ceil(N/6), at least 1)")
    max_swaps: int = knob(0, lo=0, hi=10_000, help="most swaps (0: max(floor(N/3), fewest))")
    initial: str = knob("random", choices=("random", "identity"),
                        help="initial arrangement (always written out): random or identity")

    suite: ClassVar[str] = "state"
    version: ClassVar[int] = 1
    kind: ClassVar[str] = "classification"
    backbone: ClassVar[str] = "lm"
    metrics: ClassVar[tuple[Metric, ...]] = (Metric("accuracy", True),)
    default_sizes: ClassVar[dict[str, int]] = {"train": 20_000, "val": 1_000, "test": 2_000}
    presets: ClassVar[dict] = {"demo": dict(N=6), "n12": dict(N=12), "n24": dict(N=24),
                               "n48": dict(N=48)}

    def swap_range(self) -> tuple[int, int]:
        lo = self.min_swaps or max(1, math.ceil(self.N / 6))
        hi = self.max_swaps or max(self.N // 3, lo)
        return lo, hi

    def validate(self) -> None:
        lo, hi = self.swap_range()
        if lo > hi:
            raise UsageError(f"state-tracking: min_swaps={lo} exceeds max_swaps={hi}; allowed: min_swaps <= max_swaps")

    # token ids
    @property
    def SWAP(self) -> int:
        return 2 * self.N

    @property
    def QUERY(self) -> int:
        return 2 * self.N + 1

    @property
    def SEP(self) -> int:
        return 2 * self.N + 2

    @property
    def PAD(self) -> int:
        return 2 * self.N + 3

    @property
    def vocab_size(self) -> int:
        return 2 * self.N + 4

    @property
    def seq_len(self) -> int:
        return self.N + 1 + 3 * self.swap_range()[1] + 2

    def sample(self, split: str, n: int, seed: int) -> dict[str, torch.Tensor]:
        """The raw draws: initial arrangement, swaps (with their count), query, final state."""
        g = generator(self.name, seed, split)
        N = self.N
        lo, hi = self.swap_range()
        if self.initial == "random":
            init = torch.rand(n, N, generator=g).argsort(dim=1)
        else:
            init = torch.arange(N).expand(n, N).clone()
        S = torch.randint(lo, hi + 1, (n,), generator=g)
        a = torch.randint(0, N, (n, hi), generator=g)
        b = (a + torch.randint(1, N, (n, hi), generator=g)) % N          # b != a, uniform
        q = torch.randint(0, N, (n,), generator=g)
        state = init.clone()
        rows = torch.arange(n)
        for t in range(hi):
            act = t < S
            r, ia, ib = rows[act], a[act, t], b[act, t]
            xa, xb = state[r, ia], state[r, ib]
            state[r, ia], state[r, ib] = xb, xa
        return {"init": init, "S": S, "a": a, "b": b, "q": q, "final": state}

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        d = self.sample(split, n, seed)
        N, T = self.N, self.seq_len
        hi = self.swap_range()[1]
        swaps = torch.stack([torch.full_like(d["a"], self.SWAP), N + d["a"], N + d["b"]], dim=2)
        body = torch.cat([d["init"], torch.full((n, 1), self.SEP), swaps.reshape(n, -1),
                          torch.full((n, 1), self.QUERY), N + d["q"][:, None]], dim=1)   # (n, T)
        # drop the unused swaps (the last hi - S) by shifting the prefix right: left padding
        t = torch.arange(T)
        keep_from = 3 * (hi - d["S"])                                    # tokens of padding
        prefix_len = N + 1 + 3 * d["S"]
        src = t[None, :] - keep_from[:, None]
        in_prefix = (src >= 0) & (src < prefix_len[:, None])
        tail = t[None, :] >= T - 2
        inputs = torch.where(in_prefix, body.gather(1, src.clamp(0, T - 1)), self.PAD)
        inputs = torch.where(tail, body, inputs)
        targets = torch.full((n, T), IGNORE, dtype=torch.long)
        targets[:, -1] = d["final"].gather(1, d["q"][:, None])[:, 0]
        slices = {"num_swaps": d["S"], "N": torch.full((n,), N, dtype=torch.long)}
        return Batch(inputs, targets, targets != IGNORE, slices).to(device)
