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

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..errors import UsageError
from ..registry import register_task
from .base import IGNORE, Batch, Metric, Task, knob, seed_for


def np_generator(task: str, seed: int, split: str) -> np.random.Generator:
    """A numpy PCG64 stream for (task, seed, split), seeded like :func:`generator` (disjoint
    per split). Bulk draws come from it: it is several times faster than torch's CPU RNG."""
    return np.random.Generator(np.random.PCG64(seed_for(task, seed, split)))


def chunk_generator(task: str, seed: int, split: str, chunk: int) -> np.random.Generator:
    """The PCG64 stream of row chunk ``chunk`` of (task, seed, split): child ``chunk`` of the
    split's seed sequence, so chunks are independent and can be generated in any order (or
    concurrently) with the same result."""
    ss = np.random.SeedSequence(seed_for(task, seed, split), spawn_key=(int(chunk),))
    return np.random.Generator(np.random.PCG64(ss))


@contextmanager
def single_torch_thread():
    """Torch intra-op parallelism off for the block (restored after). Generation is a chain of
    short tensor ops: on a busy machine every parallel region waits for a descheduled worker
    (measured 2-70x slower with 2 threads under load), so chunks are spread over Python
    threads instead (:func:`run_chunks`)."""
    old = torch.get_num_threads()
    if old > 1:
        torch.set_num_threads(1)
    try:
        yield old
    finally:
        if old > 1:
            torch.set_num_threads(old)


def run_chunks(fn, n_chunks: int) -> None:
    """Call ``fn(i)`` for every chunk index, on up to ``torch.get_num_threads()`` Python threads,
    torch's own threading off meanwhile. The numpy and torch work inside releases the GIL;
    results must not depend on the order."""
    with single_torch_thread() as threads:
        workers = min(n_chunks, max(1, threads))
        if workers <= 1:
            for i in range(n_chunks):
                fn(i)
            return
        with ThreadPoolExecutor(workers) as pool:
            for f in [pool.submit(fn, i) for i in range(n_chunks)]:
                f.result()


def small_int_dtype(hi: int):
    """The narrowest numpy integer type holding values below ``hi`` (draws are cheaper there)."""
    return np.int16 if hi <= (1 << 15) else (np.int32 if hi <= (1 << 31) else np.int64)


def random_bits(rng: np.random.Generator, shape, bits: int) -> np.ndarray:
    """Uniform integers in [0, 2**bits) (bits <= 32), straight from the bit generator's raw
    64-bit output (several times cheaper than ``rng.integers``); uint16 for bits <= 16."""
    if not 0 <= bits <= 32:
        raise ValueError(f"bits={bits} not in [0, 32]")
    m = int(np.prod(shape))
    dt, per = (np.uint16, 4) if bits <= 16 else (np.uint32, 2)
    raw = rng.bit_generator.random_raw(-(-m // per)).view(dt)[:m].reshape(shape)
    if bits < 8 * raw.itemsize:
        raw &= dt((1 << bits) - 1)
    return raw


def uniform_ints(rng: np.random.Generator, lo: int, hi: int, shape) -> np.ndarray:
    """Uniform integers in [lo, hi): masked raw bits when hi - lo is a power of two (as a
    small unsigned type; add ``lo`` when writing), else ``rng.integers`` in a small type."""
    r = hi - lo
    if r & (r - 1) == 0 and r <= (1 << 32):
        x = random_bits(rng, shape, r.bit_length() - 1)
        return x if lo == 0 else x.astype(small_int_dtype(hi)) + lo
    return rng.integers(lo, hi, shape, dtype=small_int_dtype(hi))


def distinct_rows(rng: np.random.Generator, n: int, k: int, lo: int, hi: int) -> np.ndarray:
    """(n, k) int64 numpy array, each row k distinct integers uniform over [lo, hi), in uniform order
    (a uniform ordered k-tuple of distinct values, as sequential draws without replacement).

    Sparse case (2k <= pool): every position draws raw bits below the next power of two, and
    a position whose value is out of range or repeats an *earlier* position of its row is
    redrawn, round after round. A position's value then depends only on the positions before
    it, and is its first draw outside their final values: exactly sequential sampling without
    replacement. Repeats are found by sorting (value, position) packed in one integer.
    Dense case: argsort of uniforms, the first k.
    """
    pool = hi - lo
    if k > pool:
        raise ValueError(f"cannot draw {k} distinct values from {pool}")
    if 2 * k > pool:
        out = np.empty((n, k), dtype=np.int64)
        step = max(1, (1 << 20) // pool)
        for s in range(0, n, step):
            e = min(n, s + step)
            out[s:e] = rng.random((e - s, pool), dtype=np.float32).argsort(axis=1)[:, :k]
        return out + lo
    b = max(1, (pool - 1).bit_length())
    sh = max(1, (k - 1).bit_length())
    # one integer per position: value bits above position bits; sorting a row groups equal
    # values, first occurrence (lowest position) first
    dt, udt = (np.int32, np.uint32) if b + sh <= 31 else (np.int64, np.uint64)
    per = 2 if dt is np.int32 else 1
    pk = rng.bit_generator.random_raw(-(-n * k // per)).view(udt)[:n * k].view(dt).reshape(n, k)
    pk &= dt(((1 << b) - 1) << sh)
    pk |= np.arange(k, dtype=dt)
    low, one, lim = dt((1 << sh) - 1), dt(1 << sh), dt(pool << sh)
    sub, rows = pk, None
    while True:
        sub.sort(axis=1)
        bad = sub >= lim if pool < (1 << b) else np.zeros(sub.shape, dtype=bool)
        bad[:, 1:] |= (sub[:, 1:] ^ sub[:, :-1]) < one
        r, j = np.nonzero(bad)
        if r.size == 0:
            break
        sub[r, j] = (random_bits(rng, r.size, b).astype(dt) << dt(sh)) | (sub[r, j] & low)
        ur = np.unique(r)
        if rows is not None:
            pk[rows] = sub
        rows = ur if rows is None else rows[ur]
        sub = sub[ur]
    if rows is not None:
        pk[rows] = sub
    # back to position order
    pos = torch.from_numpy(pk & low).long()
    val = torch.from_numpy(pk >> dt(sh)).long().add_(lo)
    return torch.empty((n, k), dtype=torch.long).scatter_(1, pos, val).numpy()


def distinct_draws(n: int, k: int, lo: int, hi: int, rng: np.random.Generator) -> torch.Tensor:
    """(n, k) int64 tensor of :func:`distinct_rows`."""
    return torch.from_numpy(distinct_rows(rng, n, k, lo, hi))


def race_weights(p: np.ndarray) -> np.ndarray:
    """float32 inverse weights max(p)/p of slot probabilities p (the exponential race scale)."""
    p = np.asarray(p, dtype=np.float64)
    return (p.max() / p).astype(np.float32)


def race_slots(inv_w: np.ndarray, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(n, k) slot indices drawn without replacement with probabilities ∝ 1/inv_w, in draw
    order: the first k arrivals of an exponential race (arrival E/p, E ~ Exp(1)), the same law
    as numpy's sequential weighted choice without replacement. Arrival times are positive
    float32, whose bit patterns sort like the values: they are packed with the slot index into
    one int64 and sorted (SIMD integer sort), ties broken by index."""
    S = inv_w.size
    e = rng.standard_exponential((n, S), dtype=np.float32)
    e *= inv_w
    sh = max(1, (S - 1).bit_length())
    pk = e.view(np.int32).astype(np.int64)
    pk <<= sh
    pk |= np.arange(S, dtype=np.int64)
    if k < S:
        pk = np.partition(pk, k - 1, axis=1)[:, :k]
    pk.sort(axis=1)
    return pk & ((1 << sh) - 1)


def weighted_slots(logp: torch.Tensor, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """(n, k) int64 tensor of :func:`race_slots` with probabilities exp(logp)."""
    p = np.exp(logp.double().numpy() - float(logp.max()))
    return torch.from_numpy(race_slots(race_weights(p), n, k, rng))


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
    # 2: numpy PCG64 draws (same law, different samples per seed than v1)
    # 3: per-chunk streams, raw-bit draws with per-position redraws (same law, new samples)
    version = 3
    kind = "classification"
    backbone = "lm"
    metrics = (Metric("accuracy", True), Metric("token_accuracy", True))
    default_sizes = {"train": 100_000, "val": 1_000, "test": 3_000}
    presets = {
        "demo": dict(V=32, L=32, kv=4),         # CPU-sized: small enough for `mixzoo demo` on 2 cores
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

    chunk_tokens: ClassVar[int] = 1 << 19    # rows are generated in chunks of about this many tokens

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        """Rows are generated in fixed-size chunks, each from its own stream
        (:func:`chunk_generator`), on up to ``torch.get_num_threads()`` threads, written
        straight into the int64 / bool outputs."""
        lo, mid, top = self._key_value_range()
        kv, L, P = self.kv, self.L, self.num_passes
        ctx = 2 * kv * P
        space = (L - ctx) // 2
        a = self.power_a
        inv_w = race_weights(a * np.arange(1, space + 1, dtype=np.float64) ** (a - 1))
        flo = 0 if self.filler == "vocab" else top
        inputs = torch.empty(n, L, dtype=torch.long)
        targets = torch.empty(n, L, dtype=torch.long)
        mask = torch.empty(n, L, dtype=torch.bool)
        xi = inputs.numpy()
        step = max(1, self.chunk_tokens // L)

        def chunk(i: int) -> None:
            rng = chunk_generator(self.name, seed, split, i)
            s, e = i * step, min(n, (i + 1) * step)
            c = e - s
            keys = distinct_rows(rng, c, kv, lo, mid)
            values = distinct_rows(rng, c, kv, mid, top)
            slots = race_slots(inv_w, c, kv, rng)          # i-th key -> i-th drawn slot
            pos = torch.from_numpy(slots).mul_(2).add_(ctx)
            x = xi[s:e]
            for p in range(P):
                x[:, 2 * kv * p:2 * kv * (p + 1):2] = keys
                x[:, 2 * kv * p + 1:2 * kv * (p + 1):2] = values
            if self.filler == "zero":
                x[:, ctx:] = 0
            else:
                x[:, ctx:] = uniform_ints(rng, flo, self.V, (c, L - ctx))
            inputs[s:e].scatter_(1, pos, torch.from_numpy(keys))
            targets[s:e].fill_(IGNORE).scatter_(1, pos, torch.from_numpy(values))
            mask[s:e].fill_(False).scatter_(1, pos, True)

        run_chunks(chunk, -(-n // step))
        slices = {"num_kv_pairs": torch.full((n,), kv, dtype=torch.long),
                  "seq_len": torch.full((n,), L, dtype=torch.long)}
        return Batch(inputs, targets, mask, slices).to(device)
