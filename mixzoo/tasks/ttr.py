"""Piecewise test-time regression (LLA paper, Fig. 3; the generator is our reconstruction).

A sequence of L (key, value) pairs in temporal order is cut into L/S segments. Segment c
draws its keys from a cone around a random unit direction mu_c (k = normalize(mu_c +
cone_width * g)) and maps them with its own A_c (i.i.d. N(0, 1) entries, so values have
unit variance per coordinate): v = A_c k + noise. Nothing is trained: a mechanism's
functional core predicts v_i from the pairs before i with q_i = k_i (see
:mod:`mixzoo.train.ttr`), scored by MSE against the noiseless A_c k_i, per position.

``generate`` packs a Batch: inputs (N, L, 2d) = [k; noisy v], targets (N, L, d) = A_c k,
mask = every position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import UsageError
from ..registry import register_task
from .base import Batch, Metric, Task, generator, knob
from .icl_regression import cone_sample, unit_directions


@register_task("ttr")
@dataclass
class TTR(Task):
    """Piecewise test-time regression: keys from one cone per segment, values A_c k + noise."""

    d: int = knob(32, lo=1, hi=1024, help="key and value dimension")
    L: int = knob(1024, lo=2, hi=1 << 16, help="sequence length (pairs)")
    S: int = knob(128, lo=1, hi=1 << 16, help="segment length (L/S segments in temporal order)")
    noise: float = knob(0.1, lo=0.0, hi=10.0, help="value noise std (targets are noiseless)")
    cone_width: float = knob(0.15, lo=0.0, hi=100.0, help="spread of a segment's keys around its direction")

    suite: ClassVar[str] = "ttr"
    version: ClassVar[int] = 1
    kind: ClassVar[str] = "training-free"
    backbone: ClassVar[str] = "none"
    metrics: ClassVar[tuple[Metric, ...]] = (Metric("mse", False),)
    default_sizes: ClassVar[dict[str, int]] = {"train": 0, "val": 8, "test": 32}
    presets: ClassVar[dict] = {"demo": dict(d=16, L=256, S=32)}

    def validate(self) -> None:
        if self.L % self.S:
            raise UsageError(f"ttr: S={self.S} must divide L={self.L}; allowed: divisors of L")

    @property
    def vocab_size(self) -> int:
        return 0

    @property
    def d_in(self) -> int:
        return 2 * self.d

    @property
    def d_out(self) -> int:
        return self.d

    def sample(self, split: str, n: int, seed: int) -> dict[str, torch.Tensor]:
        """keys (n, L, d), noisy values, clean targets, segment of each position, A, mu."""
        g = generator(self.name, seed, split)
        C, d = self.L // self.S, self.d
        mu = unit_directions((n, C, d), g)
        A = torch.randn(n, C, d, d, generator=g)
        seg = torch.arange(C).repeat_interleave(self.S)
        k = cone_sample(mu[:, seg], self.cone_width, g)
        clean = (A[:, seg] @ k[..., None])[..., 0]
        v = clean + self.noise * torch.randn(clean.shape, generator=g)
        return {"k": k, "v": v, "clean": clean, "segment": seg.expand(n, -1), "A": A, "mu": mu}

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        s = self.sample(split, n, seed)
        mask = torch.ones(n, self.L, dtype=torch.bool)
        slices = {"segment_len": torch.full((n,), self.S, dtype=torch.long)}
        return Batch(torch.cat([s["k"], s["v"]], -1), s["clean"], mask, slices).to(device)
