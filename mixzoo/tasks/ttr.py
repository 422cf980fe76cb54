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
from .icl_regression import NormalStream, chunks, cone_points_, replay, unit_directions


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

    def _fill(self, split: str, n: int, seed: int, device, k: torch.Tensor, v: torch.Tensor,
              clean: tuple[torch.Tensor, ...], A_out: torch.Tensor | None = None) -> torch.Tensor:
        """Draw ``n`` sequences into (n, L, d) views on ``device``: keys ``k``, noisy values
        ``v`` and every view in ``clean`` (the noiseless A_c k), chunk by chunk of sequences,
        and the maps into ``A_out`` (n, C, d, d) when given.

        The numbers are those of the whole draws from the split's CPU generator, in the same
        order (mu, A, the cone noise, the value noise), taken piece by piece
        (:class:`~mixzoo.tasks.icl_regression.NormalStream`; A is replayed from a copy of the
        generator), so no draw is held whole and none depends on the chunking or the device.
        The arithmetic runs on ``device``: a segment's S keys meet its A_c in one batched
        matmul, so no (n, L, d, d) tensor is built. Returns mu, on ``device``.
        """
        g = generator(self.name, seed, split)
        C, S, L, d = self.L // self.S, self.S, self.L, self.d
        dev = torch.device(device)
        mu = unit_directions((n, C, d), g).to(dev)
        A = replay(g, n * C * d * d)
        z = NormalStream(g, n * L * d)
        for s, e in chunks(n, C * d * d + 4 * L * d, 3 * L * d):
            m = e - s
            Ac = A.take(m * C * d * d).view(m, C, d, d).to(dev)
            if A_out is not None:
                A_out[s:e] = Ac
            zc = z.take(m * L * d).view(m, L, d).to(dev)
            kc = cone_points_(zc, mu[s:e].repeat_interleave(S, dim=1), self.cone_width)
            k[s:e] = kc
            cc = torch.bmm(kc.view(m * C, S, d), Ac.view(m * C, d, d).transpose(1, 2)).view(m, L, d)
            v[s:e] = cc
            for c in clean:
                c[s:e] = cc
        eps = NormalStream(g, n * L * d)
        for s, e in chunks(n, 2 * L * d, 3 * L * d):
            v[s:e].add_(eps.take((e - s) * L * d).view(e - s, L, d).to(dev).mul_(self.noise))
        return mu

    def sample(self, split: str, n: int, seed: int, device="cpu") -> dict[str, torch.Tensor]:
        """keys (n, L, d), noisy values, clean targets, segment of each position, A, mu."""
        dev = torch.device(device)
        k, v, clean = (torch.empty(n, self.L, self.d, device=dev) for _ in range(3))
        A = torch.empty(n, self.L // self.S, self.d, self.d, device=dev)
        mu = self._fill(split, n, seed, dev, k, v, (clean,), A)
        seg = torch.arange(self.L // self.S, device=dev).repeat_interleave(self.S)
        return {"k": k, "v": v, "clean": clean, "segment": seg.expand(n, -1), "A": A, "mu": mu}

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        """Written straight into the Batch's tensors on ``device``. Peak memory is the output
        plus mu (held whole) and one chunk's temporaries (under 1/16 of the output)."""
        dev = torch.device(device)
        # zeros, though every element is written: on the 2-core CPU machines here one contiguous
        # fill faults the pages in at a fraction of the cost of faulting them chunk by chunk.
        inputs = torch.zeros(n, self.L, 2 * self.d, device=dev)
        targets = torch.zeros(n, self.L, self.d, device=dev)
        self._fill(split, n, seed, dev, inputs[..., :self.d], inputs[..., self.d:], (targets,))
        mask = torch.ones(n, self.L, dtype=torch.bool, device=dev)
        slices = {"segment_len": torch.full((n,), self.S, dtype=torch.long, device=dev)}
        return Batch(inputs, targets, mask, slices)
