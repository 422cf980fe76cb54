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

import numpy as np
import torch

from ..errors import UsageError
from ..registry import register_task
from .base import IGNORE, Batch, Metric, Task, knob, seed_for


def np_generator(task: str, seed: int, split: str) -> np.random.Generator:
    """A numpy PCG64 stream for (task, seed, split), seeded like :func:`generator` (disjoint
    per split). Bulk draws come from it: it is several times faster than torch's CPU RNG."""
    return np.random.Generator(np.random.PCG64(seed_for(task, seed, split)))


def small_int_dtype(hi: int):
    """The narrowest numpy integer type holding values below ``hi`` (draws are cheaper there)."""
    return np.int16 if hi <= (1 << 15) else (np.int32 if hi <= (1 << 31) else np.int64)


def distinct_draws(n: int, k: int, lo: int, hi: int, rng: np.random.Generator) -> torch.Tensor:
    """(n, k) int64, each row k distinct integers uniform over [lo, hi), in uniform order.

    Small pools: argsort of uniforms. Large pools: draw rows with replacement and redraw
    every row that holds a repeat; a row kept is uniform over ordered k-tuples of distinct
    values (rejection sampling), and more than a third of the rows are kept per round
    whenever k*k <= 2*pool.
    """
    pool = hi - lo
    if k > pool:
        raise ValueError(f"cannot draw {k} distinct values from {pool}")
    if k * k > 2 * pool:
        out = np.empty((n, k), dtype=np.int64)
        step = max(1, (1 << 22) // pool)
        for s in range(0, n, step):
            e = min(n, s + step)
            out[s:e] = rng.random((e - s, pool), dtype=np.float32).argsort(axis=1)[:, :k]
        return torch.from_numpy(out + lo)
    dt = small_int_dtype(hi)
    out = np.empty((n, k), dtype=dt)
    todo = np.arange(n)
    while todo.size:
        x = rng.integers(lo, hi, (todo.size, k), dtype=dt)
        srt = np.sort(x, axis=1, kind="stable")       # radix sort for 16-bit values
        ok = ~(srt[:, 1:] == srt[:, :-1]).any(axis=1)
        out[todo[ok]] = x[ok]
        todo = todo[~ok]
    return torch.from_numpy(out).long()


def weighted_slots(logp: torch.Tensor, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """(n, k) slot indices drawn without replacement with probabilities exp(logp), in draw
    order: Gumbel top-k (the first k arrivals of an exponential race), the same law as
    numpy's sequential weighted choice without replacement."""
    e = torch.from_numpy(rng.standard_exponential((n, logp.numel()), dtype=np.float32))
    score = torch.log_(e).neg_().add_(logp.float())
    return score.topk(k, dim=1).indices


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
    version = 2   # 2: numpy PCG64 draws (same law, different samples per seed than v1)
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
        rng = np_generator(self.name, seed, split)
        lo, mid, top = self._key_value_range()
        kv, L = self.kv, self.L
        keys = distinct_draws(n, kv, lo, mid, rng)
        values = distinct_draws(n, kv, mid, top, rng)
        ctx_len = 2 * kv * self.num_passes
        space = (L - ctx_len) // 2
        a = self.power_a
        logp = torch.log(a * torch.arange(1, space + 1, dtype=torch.float64) ** (a - 1))
        slots = weighted_slots(logp, n, kv, rng)                # i-th key -> i-th drawn slot
        pos = ctx_len + 2 * slots
        inputs = torch.empty(n, L, dtype=torch.long)
        for p in range(self.num_passes):
            inputs[:, 2 * kv * p:2 * kv * (p + 1):2] = keys
            inputs[:, 2 * kv * p + 1:2 * kv * (p + 1):2] = values
        if self.filler == "zero":
            inputs[:, ctx_len:] = 0
        else:   # draw only the query region, in a narrow type, then widen in place
            flo = 0 if self.filler == "vocab" else top
            inputs[:, ctx_len:] = torch.from_numpy(
                rng.integers(flo, self.V, (n, L - ctx_len), dtype=small_int_dtype(self.V)))
        inputs.scatter_(1, pos, keys)
        targets = torch.full((n, L), IGNORE, dtype=torch.long)
        targets.scatter_(1, pos, values)
        mask = torch.zeros(n, L, dtype=torch.bool)
        mask.scatter_(1, pos, True)
        slices = {"num_kv_pairs": torch.full((n,), kv, dtype=torch.long),
                  "seq_len": torch.full((n,), L, dtype=torch.long)}
        return Batch(inputs, targets, mask, slices).to(device)
