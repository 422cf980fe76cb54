"""In-context piecewise linear regression (LLA paper, App. E; the format is our
reconstruction, named "LLA-ICR (ours)" until the paper's appendix can be checked).

Each sequence has C = L/S regions of x-space (cones around random unit directions mu_c) with
their own linear maps A_c (i.i.d. N(0, 1/d_x) entries). S inputs are drawn from each cone
(x = sqrt(d_x) * normalize(mu_c + cone_width * g)), y = A_c x + noise, and the L pairs are
shuffled. Then ``n_queries`` inputs x' follow, each from a uniformly chosen region; the target
is A_c x' (noisy in training when ``noisy_train_queries``; never noisy in val/test, where the
context is noiseless too).

``token_format``: ``pair`` -- one token [x; y] per pair and [x'; 0] per query (T = L + Q);
``interleaved`` -- Garg-style [x; 0] then [0; y] tokens, queries [x'; 0] (T = 2L + Q).
The loss and metrics cover the query positions only. Metrics: mse (per coordinate, lower is
better) and nmse (mse / mean squared target).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import UsageError
from ..registry import register_task
from .base import Batch, Metric, Task, generator, knob


def cone_sample(mu: torch.Tensor, width: float, g: torch.Generator) -> torch.Tensor:
    """Unit vectors around the unit directions ``mu`` (..., d): normalize(mu + width * N(0, I))."""
    x = mu + width * torch.randn(mu.shape, generator=g)
    return x / x.norm(dim=-1, keepdim=True)


def unit_directions(shape, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=g)
    return x / x.norm(dim=-1, keepdim=True)


@register_task("icl-regression")
@dataclass
class ICLRegression(Task):
    """In-context piecewise linear regression: shuffled (x, y) pairs from L/S regions, queries."""

    L: int = knob(64, lo=1, hi=1 << 14, help="context pairs")
    S: int = knob(16, lo=1, hi=1 << 14, help="segment length: pairs per region (L/S regions)")
    d_x: int = knob(32, lo=1, hi=1024, help="input dimension")
    d_y: int = knob(32, lo=1, hi=1024, help="output dimension")
    n_queries: int = knob(16, lo=1, hi=1024, help="queries after the context")
    noise: float = knob(0.1, lo=0.0, hi=10.0, help="label noise std in training (val/test noiseless)")
    noisy_train_queries: bool = knob(True, help="training query targets carry the noise too")
    cone_width: float = knob(0.15, lo=0.0, hi=100.0, help="spread of a region around its direction")
    token_format: str = knob("pair", choices=("pair", "interleaved"),
                             help="pair: one [x;y] token per pair; interleaved: x token then y token")

    suite: ClassVar[str] = "icl"
    version: ClassVar[int] = 1
    kind: ClassVar[str] = "regression"
    backbone: ClassVar[str] = "vector"
    metrics: ClassVar[tuple[Metric, ...]] = (Metric("mse", False), Metric("nmse", False))
    default_sizes: ClassVar[dict[str, int]] = {"train": 100_000, "val": 1_000, "test": 1_000}
    presets: ClassVar[dict] = {"demo": dict(L=32, S=8, d_x=8, d_y=8, n_queries=8),
                               "S64": dict(L=64, S=64), "S16": dict(L=64, S=16), "S4": dict(L=64, S=4)}

    def validate(self) -> None:
        if self.L % self.S:
            raise UsageError(f"icl-regression: S={self.S} must divide L={self.L}; allowed: divisors of L")

    @property
    def seq_len(self) -> int:
        return (self.L if self.token_format == "pair" else 2 * self.L) + self.n_queries

    @property
    def vocab_size(self) -> int:
        return 0

    @property
    def d_in(self) -> int:
        return self.d_x + self.d_y

    @property
    def d_out(self) -> int:
        return self.d_y

    def sample(self, split: str, n: int, seed: int) -> dict[str, torch.Tensor]:
        """Raw draws: x, y (noisy as the split says), region of each pair, A, queries."""
        g = generator(self.name, seed, split)
        C, S, dx, dy, Q = self.L // self.S, self.S, self.d_x, self.d_y, self.n_queries
        mu = unit_directions((n, C, dx), g)
        A = torch.randn(n, C, dy, dx, generator=g) / dx ** 0.5
        seg = torch.arange(C).repeat_interleave(S).expand(n, -1)
        perm = torch.rand(n, C * S, generator=g).argsort(dim=1)
        seg = seg.gather(1, perm)                                      # shuffled region labels
        qseg = torch.randint(0, C, (n, Q), generator=g)
        allseg = torch.cat([seg, qseg], dim=1)
        x = dx ** 0.5 * cone_sample(mu.gather(1, allseg[..., None].expand(-1, -1, dx)), self.cone_width, g)
        Ag = A.gather(1, allseg[..., None, None].expand(-1, -1, dy, dx))
        clean = (Ag @ x[..., None])[..., 0]
        sigma = self.noise if split == "train" else 0.0
        eps = sigma * torch.randn(clean.shape, generator=g)
        y = clean + eps
        if not (split == "train" and self.noisy_train_queries):
            y[:, self.L:] = clean[:, self.L:]
        return {"x": x, "y": y, "clean": clean, "segment": allseg, "A": A, "mu": mu}

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        d = self.sample(split, n, seed)
        L, Q, dx, dy = self.L, self.n_queries, self.d_x, self.d_y
        x, y = d["x"], d["y"]
        T = self.seq_len
        inputs = torch.zeros(n, T, dx + dy)
        if self.token_format == "pair":
            inputs[:, :L, :dx] = x[:, :L]
            inputs[:, :L, dx:] = y[:, :L]
        else:
            inputs[:, 0:2 * L:2, :dx] = x[:, :L]
            inputs[:, 1:2 * L:2, dx:] = y[:, :L]
        inputs[:, T - Q:, :dx] = x[:, L:]
        targets = torch.zeros(n, T, dy)
        targets[:, T - Q:] = y[:, L:]
        mask = torch.zeros(n, T, dtype=torch.bool)
        mask[:, T - Q:] = True
        slices = {"num_segments": torch.full((n,), L // self.S, dtype=torch.long)}
        return Batch(inputs, targets, mask, slices).to(device)
