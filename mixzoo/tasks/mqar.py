"""MQAR: multi-query associative recall, as zoology's generator builds it.

Keys come from [1, V/2), values from [V/2, V); ``kv`` distinct keys and values are paired
and laid out as ``k1 v1 k2 v2 ...`` (tiled ``num_passes`` times). Every key is queried once,
in slots of the query region chosen without replacement with power-law weights
p(g) ∝ a·(g+1)^(a-1) (Gumbel top-k, the same law as numpy's sequential weighted choice).
The label at a query position is the value paired with that key; only query positions are
supervised. Filler: ``vocab`` fills unused slots with uniform tokens from the whole
vocabulary (zoology's default), ``zero`` leaves token 0, ``noise`` draws them from a noise
vocabulary disjoint from keys and values (the top ``noise_vocab`` tokens), so no spurious
key-value bigram can appear.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UsageError
from ..registry import register_task
from .base import IGNORE, Batch, Metric, Task, generator, knob


def distinct_draws(n: int, k: int, lo: int, hi: int, g: torch.Generator) -> torch.Tensor:
    """(n, k) int64, each row k distinct integers uniform over [lo, hi), in uniform order.

    Small pools: argsort of uniforms. Large pools: draw with replacement and redraw the
    later duplicates until none are left; the procedure is equivariant under relabeling
    of the pool, so every ordered k-tuple of distinct values is equally likely.
    """
    pool = hi - lo
    if k > pool:
        raise ValueError(f"cannot draw {k} distinct values from {pool}")
    if pool <= 1024 or k * 4 > pool:
        out = torch.empty(n, k, dtype=torch.long)
        step = max(1, (1 << 24) // pool)
        for s in range(0, n, step):
            e = min(n, s + step)
            out[s:e] = torch.rand(e - s, pool, generator=g).argsort(dim=1)[:, :k]
        return out + lo
    x = torch.randint(lo, hi, (n, k), generator=g)
    while True:
        srt, order = x.sort(dim=1, stable=True)   # equal values keep column order
        later = torch.zeros_like(srt, dtype=torch.bool)
        later[:, 1:] = srt[:, 1:] == srt[:, :-1]
        dup = torch.zeros_like(later).scatter_(1, order, later)
        r, c = dup.nonzero(as_tuple=True)
        if r.numel() == 0:
            return x
        x[r, c] = torch.randint(lo, hi, (r.numel(),), generator=g)


@register_task("mqar")
@dataclass
class MQAR(Task):
    V: int = knob(8192, lo=4, hi=1 << 20, help="vocabulary size (keys [1,V/2), values [V/2,V))")
    L: int = knob(64, lo=4, hi=1 << 16, help="sequence length (even)")
    kv: int = knob(4, lo=1, hi=1 << 14, help="number of key-value pairs; every key is queried once")
    power_a: float = knob(0.01, lo=1e-4, hi=1.0, help="power-law exponent of query placement (1 = uniform)")
    num_passes: int = knob(1, lo=1, hi=8, help="times the key-value block is repeated")
    filler: str = knob("vocab", choices=("vocab", "zero", "noise"),
                       help="what fills unused slots: whole vocabulary (zoology), 0, or a disjoint noise vocabulary")
    noise_vocab: int = knob(16, lo=1, hi=1 << 16, help="size of the noise vocabulary when filler=noise")

    suite = "mqar"
    version = 1
    kind = "classification"
    backbone = "lm"
    metrics = (Metric("accuracy", True), Metric("token_accuracy", True))
    default_sizes = {"train": 100_000, "val": 1_000, "test": 3_000}
    presets = {
        "demo": dict(V=64, L=64, kv=4),
        "zoology-basic": dict(V=256, L=64, kv=4),
        "zoology-64": dict(V=8192, L=64, kv=4, filler="zero"),
        "zoology-128": dict(V=8192, L=128, kv=8, filler="zero"),
        "zoology-256": dict(V=8192, L=256, kv=16, filler="zero"),
        "zoology-512": dict(V=8192, L=512, kv=64, filler="zero"),
    }

    def _key_value_range(self) -> tuple[int, int, int]:
        top = self.V - self.noise_vocab if self.filler == "noise" else self.V
        return 1, top // 2, top

    def validate(self) -> None:
        if self.L % 2:
            raise UsageError(f"mqar: L={self.L} must be even; allowed: even lengths >= 4")
        need = 2 * self.kv * self.num_passes + 2 * self.kv
        if need > self.L:
            most = self.L // (2 * self.num_passes + 2)
            raise UsageError(f"mqar: kv={self.kv} pairs do not fit in L={self.L} "
                             f"(needs 2*kv*num_passes + 2*kv <= L); allowed: kv <= {most}")
        if self.filler == "noise" and self.noise_vocab > self.V - 4:
            raise UsageError(f"mqar: noise_vocab={self.noise_vocab} leaves too few tokens; "
                             f"allowed: noise_vocab <= {self.V - 4}")
        lo, mid, top = self._key_value_range()
        if self.kv > min(mid - lo, top - mid):
            raise UsageError(f"mqar: kv={self.kv} exceeds the {min(mid - lo, top - mid)} "
                             f"distinct keys available at V={self.V}; allowed: kv <= {min(mid - lo, top - mid)}")

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        g = generator(self.name, seed, split)
        lo, mid, top = self._key_value_range()
        kv, L = self.kv, self.L
        keys = distinct_draws(n, kv, lo, mid, g)
        values = distinct_draws(n, kv, mid, top, g)
        ctx = torch.stack([keys, values], dim=2).reshape(n, 2 * kv).repeat(1, self.num_passes)
        ctx_len = ctx.shape[1]
        space = (L - ctx_len) // 2
        a = self.power_a
        logp = torch.log(a * torch.arange(1, space + 1, dtype=torch.float64) ** (a - 1))
        gumbel = -torch.log(-torch.log(torch.rand(n, space, generator=g, dtype=torch.float64)
                                       .clamp_min(1e-300)))
        slots = (logp + gumbel).topk(kv, dim=1).indices          # i-th key -> i-th drawn slot
        pos = ctx_len + 2 * slots
        inputs = torch.zeros(n, L, dtype=torch.long)
        inputs[:, :ctx_len] = ctx
        targets = torch.full((n, L), IGNORE, dtype=torch.long)
        inputs.scatter_(1, pos, keys)
        targets.scatter_(1, pos, values)
        mask = targets != IGNORE
        if self.filler != "zero":
            fill = (torch.randint(0, self.V, (n, L), generator=g) if self.filler == "vocab"
                    else torch.randint(top, self.V, (n, L), generator=g))
            empty = torch.zeros(n, L, dtype=torch.bool)
            empty[:, ctx_len:] = True
            empty.scatter_(1, pos, False)
            inputs = torch.where(empty, fill, inputs)
        slices = {"num_kv_pairs": torch.full((n,), kv, dtype=torch.long),
                  "seq_len": torch.full((n,), L, dtype=torch.long)}
        return Batch(inputs, targets, mask, slices).to(device)
