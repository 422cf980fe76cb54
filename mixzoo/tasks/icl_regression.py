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

# A chunk of sequences has temporaries of about this many floats at most.
CHUNK_FLOATS = 1 << 22


def chunks(n: int, per_sequence: int, out_per_sequence: int) -> list[tuple[int, int]]:
    """(start, end) of the chunks of sequences that a generator works through. A chunk's
    temporaries (``per_sequence`` floats a sequence) stay under :data:`CHUNK_FLOATS` and under
    1/16 of the output (``out_per_sequence`` floats a sequence), one sequence at least, so peak
    memory is the output plus a small part of it."""
    m = min(CHUNK_FLOATS // max(1, per_sequence), n * out_per_sequence // (16 * max(1, per_sequence)))
    m = max(1, m)
    return [(s, min(n, s + m)) for s in range(0, n, m)]


class NormalStream:
    """The numbers of ``torch.randn(numel, generator=g)``, handed out in order, piece by piece,
    so that a large draw never has to be held whole.

    Torch's CPU ``normal_`` fills a float tensor of 16 or more elements from one uniform per
    element, transformed 16 at a time, and redraws the last 16 when the size is no multiple of
    16. Consecutive pieces whose sizes are multiples of 16, the last one of 16 or more, so give
    the same numbers bit for bit and leave ``g`` in the same state as the whole draw
    (tests/test_task_memory.py checks both against whole draws). The pieces are drawn into one
    reused buffer, so memory once touched is not asked for again.
    """

    piece: ClassVar[int] = 1 << 20       # numbers drawn at a time, at least (a multiple of 16)

    def __init__(self, g: torch.Generator, numel: int):
        self.g, self.left = g, int(numel)
        self.buf, self.pos = torch.empty(0), 0           # the piece drawn last, and how far it is used
        self._store, self._spill = torch.empty(0), torch.empty(0)

    def _refill(self, want: int) -> None:
        k = -(-max(self.piece, want, 16) // 16) * 16
        if self.left - k < 16:
            k = self.left
        if self._store.numel() < k:
            self._store = torch.empty(k)
        self.buf, self.pos = self._store[:k].normal_(generator=self.g), 0
        self.left -= k

    def take(self, k: int) -> torch.Tensor:
        """The next ``k`` numbers, a 1-D CPU tensor that the next ``take`` may overwrite."""
        if self.pos + k <= self.buf.numel():
            self.pos += k
            return self.buf[self.pos - k:self.pos]
        if self._spill.numel() < k:
            self._spill = torch.empty(k)
        out, i = self._spill[:k], 0
        while i < k:
            if self.pos == self.buf.numel():
                if self.left <= 0:
                    raise ValueError("NormalStream: more numbers taken than the draw has")
                self._refill(k - i)
            r = min(k - i, self.buf.numel() - self.pos)
            out[i:i + r] = self.buf[self.pos:self.pos + r]
            self.pos, i = self.pos + r, i + r
        return out

    def skip(self) -> None:
        """Move ``g`` past the rest of the draw (drawing it piece by piece, keeping nothing)."""
        while self.left > 0:
            self._refill(0)
        self.buf, self.pos = torch.empty(0), 0
        self._store = self._spill = torch.empty(0)


def replay(g: torch.Generator, numel: int) -> NormalStream:
    """A stream of the next ``numel`` normals of ``g`` to be taken later, piece by piece, from
    a copy of ``g``; ``g`` itself moves on past them at once (at the cost of drawing them)."""
    copy = torch.Generator()
    copy.set_state(g.get_state())
    NormalStream(g, numel).skip()
    return NormalStream(copy, numel)


def cone_points_(noise: torch.Tensor, mu: torch.Tensor, width: float) -> torch.Tensor:
    """normalize(mu + width * noise) over the last dim, written into ``noise`` and returned:
    unit vectors around the unit directions ``mu`` (the same arithmetic, bit for bit, as the
    out-of-place formula)."""
    x = noise.mul_(width).add_(mu)
    return x.div_(x.norm(dim=-1, keepdim=True))


def unit_directions(shape, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=g)
    return x / x.norm(dim=-1, keepdim=True)


def rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[b, idx[b, j]]`` for (m, K, ...) ``t`` and (m, J) ``idx``: one row gather, (m, J, ...)."""
    m, K = t.shape[:2]
    flat = (idx + K * torch.arange(m, device=idx.device)[:, None]).reshape(-1)
    return t.reshape(m * K, *t.shape[2:]).index_select(0, flat).view(*idx.shape, *t.shape[2:])


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

    def _fill(self, split: str, n: int, seed: int, device, x: tuple, y: tuple,
              clean: tuple | None = None, A_out: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Draw ``n`` sequences and write them, chunk by chunk of sequences, into the given
        views on ``device``: ``x = (context (n, L, d_x), queries (n, Q, d_x))``, ``y`` likewise
        (noisy as the split says), and, when given, ``clean`` (the noiseless A_c x) and ``A_out``
        (n, C, d_y, d_x), the maps.

        The numbers are those of the whole draws from the split's CPU generator, in the same
        order (mu, A, the shuffle, the query regions, the cone noise, the label noise), taken
        piece by piece (:class:`NormalStream`; A is replayed from a copy of the generator), so
        no draw is held whole and none depends on the chunking or the device. The arithmetic
        runs on ``device``: a sequence's context pairs, grouped by region, meet their A_c in one
        batched matmul; each query meets its region's A_c. No (n, T, d_y, d_x) tensor is built.
        Returns mu and the regions of the pairs, on ``device``.
        """
        g = generator(self.name, seed, split)
        C, S, L, Q, dx, dy = self.L // self.S, self.S, self.L, self.n_queries, self.d_x, self.d_y
        dev = torch.device(device)
        mu = unit_directions((n, C, dx), g).to(dev)
        A = replay(g, n * C * dy * dx)
        # Context pair t of a sequence takes slot perm[t] of the region-sorted order: region perm[t] // S.
        perm = torch.rand(n, L, generator=g).argsort(dim=1).to(dev)
        qseg = torch.randint(0, C, (n, Q), generator=g).to(dev)
        z = NormalStream(g, n * (L + Q) * dx)
        out = self.seq_len * (dx + 2 * dy)
        for s, e in chunks(n, C * dy * dx + (L + Q) * (2 * dx + 3 * dy) + Q * dx * dy, out):
            m, p = e - s, perm[s:e]
            Ac = A.take(m * C * dy * dx).view(m, C, dy, dx).div_(dx ** 0.5).to(dev)
            if A_out is not None:
                A_out[s:e] = Ac
            seg = torch.cat([p // S, qseg[s:e]], dim=1)
            zc = z.take(m * (L + Q) * dx).view(m, L + Q, dx).to(dev)
            xc = cone_points_(zc, rows(mu[s:e], seg), self.cone_width).mul_(dx ** 0.5)
            x[0][s:e], x[1][s:e] = xc[:, :L], xc[:, L:]
            slot = (p + L * torch.arange(m, device=dev)[:, None]).view(-1)    # row in region order
            grouped = torch.empty(m * L, dx, device=dev).index_copy_(0, slot, xc[:, :L].reshape(m * L, dx))
            yg = torch.bmm(grouped.view(m * C, S, dx), Ac.view(m * C, dy, dx).transpose(1, 2))
            yc = yg.view(m * L, dy).index_select(0, slot).view(m, L, dy)
            yq = torch.bmm(rows(Ac, qseg[s:e]).view(m * Q, dy, dx), xc[:, L:].reshape(m * Q, dx, 1)).view(m, Q, dy)
            y[0][s:e], y[1][s:e] = yc, yq
            if clean is not None:
                clean[0][s:e], clean[1][s:e] = yc, yq
        sigma = self.noise if split == "train" else 0.0
        eps = NormalStream(g, n * (L + Q) * dy)
        noisy_queries = split == "train" and self.noisy_train_queries
        for s, e in chunks(n, 2 * (L + Q) * dy, out):
            ec = eps.take((e - s) * (L + Q) * dy).view(e - s, L + Q, dy).to(dev).mul_(sigma)
            y[0][s:e].add_(ec[:, :L])
            if noisy_queries:
                y[1][s:e].add_(ec[:, L:])
        return {"mu": mu, "segment": torch.cat([perm // S, qseg], dim=1)}

    def sample(self, split: str, n: int, seed: int, device="cpu") -> dict[str, torch.Tensor]:
        """Raw draws: x, y (noisy as the split says), clean, region of each pair, A, mu."""
        L, T, dev = self.L, self.L + self.n_queries, torch.device(device)
        x = torch.empty(n, T, self.d_x, device=dev)
        y, clean = torch.empty(n, T, self.d_y, device=dev), torch.empty(n, T, self.d_y, device=dev)
        A = torch.empty(n, L // self.S, self.d_y, self.d_x, device=dev)
        d = self._fill(split, n, seed, dev, (x[:, :L], x[:, L:]), (y[:, :L], y[:, L:]),
                       (clean[:, :L], clean[:, L:]), A)
        return {"x": x, "y": y, "clean": clean, "A": A, **d}

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        """Written straight into the Batch's tensors on ``device``. Peak memory is the output
        plus the small draws held whole (mu, the shuffle, the query regions) and one chunk's
        temporaries (under 1/16 of the output): 1.07x the output at the paper's size (measured)."""
        L, Q, dx, dy, T, dev = self.L, self.n_queries, self.d_x, self.d_y, self.seq_len, torch.device(device)
        inputs = torch.zeros(n, T, dx + dy, device=dev)
        targets = torch.zeros(n, T, dy, device=dev)
        if self.token_format == "pair":
            xc, yc = inputs[:, :L, :dx], inputs[:, :L, dx:]
        else:
            xc, yc = inputs[:, 0:2 * L:2, :dx], inputs[:, 1:2 * L:2, dx:]
        self._fill(split, n, seed, dev, (xc, inputs[:, T - Q:, :dx]), (yc, targets[:, T - Q:]))
        mask = torch.zeros(n, T, dtype=torch.bool, device=dev)
        mask[:, T - Q:] = True
        slices = {"num_segments": torch.full((n,), L // self.S, dtype=torch.long, device=dev)}
        return Batch(inputs, targets, mask, slices)
