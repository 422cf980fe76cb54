"""The MAD suite (mechanistic architecture design): six token tasks, as mad-lab defines them.

Every task reports, in this order:

* ``class_accuracy`` -- accuracy averaged over target classes (mean per-class recall), what
  MAD reports (torchmetrics' default macro average); the primary metric;
* ``token_accuracy`` -- micro accuracy over all supervised positions;
* ``accuracy`` -- mean over examples of their per-example accuracy (zoology's definition).

The knobs keep MAD's meaning: ``V`` is the whole vocabulary (special tokens included), ``L``
MAD's ``seq_len``, ``n_train`` the training-set size (1,280 validation and test examples).
Recall tasks train on full next-token targets and score values of keys seen before
(``train_targets="values"`` supervises training like test); validation uses test targets.

:data:`MAD_SETTINGS` lists MAD's 66 settings (baseline, then one axis at a time);
:data:`MAD_HARD_SETTINGS` the harder range (vocabulary up to 512, context up to 2048; our
reading of the Parallax paper's extension). Both are also presets of each task.

Generation is vectorized: draws that MAD makes one token at a time are made for all
examples at once with the same distributions (e.g. fuzzy recall's keys are uniform ordered
tuples of distinct tokens, which is what MAD's shuffled permutation lists give).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import UsageError
from ..registry import register_task
from .base import IGNORE, Batch, Metric, Task, knob, seed_for
from .mqar import np_generator, single_torch_thread, small_int_dtype

MAD_METRICS = (Metric("class_accuracy", True), Metric("token_accuracy", True), Metric("accuracy", True))
TRAIN_SIZES = (6400, 3200, 1600, 800)


def _settings(baseline: dict[str, Any], changes: dict[str, list]) -> list[dict[str, Any]]:
    """MAD's protocol: the baseline, then each axis changed alone."""
    out = [dict(baseline)]
    for k, values in changes.items():
        out += [{**baseline, k: v} for v in values]
    return out


_BASE = {
    "mad-recall": dict(V=16, L=128, n_train=12800),
    "mad-fuzzy-recall": dict(V=16, L=128, n_train=12800, k_motif=3, v_motif=3),
    "mad-noisy-recall": dict(V=32, L=128, n_train=12800, noise_vocab=16, frac_noise=0.2),
    "mad-selective-copy": dict(V=16, L=256, n_train=12800, n_copy=16),
    "mad-compression": dict(V=16, L=32, n_train=12800),
    "mad-memorization": dict(V=256, L=32, n_train=256),
}
_CHANGES = {
    "mad-recall": dict(V=[32, 64, 128], L=[256, 512, 1024], n_train=list(TRAIN_SIZES)),
    "mad-fuzzy-recall": dict(V=[32, 64, 128], L=[256, 512, 1024], n_train=list(TRAIN_SIZES)),
    "mad-noisy-recall": dict(V=[48, 80, 144], L=[256, 512, 1024], n_train=list(TRAIN_SIZES),
                             frac_noise=[0.4, 0.6, 0.8]),
    "mad-selective-copy": dict(V=[32, 64, 128], L=[512, 1024], n_train=list(TRAIN_SIZES),
                               n_copy=[32, 64, 96]),
    "mad-compression": dict(V=[32, 64, 128], L=[64, 128, 256], n_train=list(TRAIN_SIZES)),
    "mad-memorization": dict(V=[512, 1024, 2048, 4096, 8192]),
}
# The harder range (our reconstruction of the Parallax extension): vocabulary 256 and 512
# (plus the 16 noise tokens for noisy recall), context 2048; memorization has no such axis.
_HARD = {
    "mad-recall": dict(V=[256, 512], L=[2048]),
    "mad-fuzzy-recall": dict(V=[256, 512], L=[2048]),
    "mad-noisy-recall": dict(V=[272, 528], L=[2048]),
    "mad-selective-copy": dict(V=[256, 512], L=[2048]),
    "mad-compression": dict(V=[256, 512], L=[512, 1024, 2048]),
    "mad-memorization": {},
}

#: task -> MAD's settings (66 in all), each a dict of knob values.
MAD_SETTINGS: dict[str, list[dict[str, Any]]] = {t: _settings(_BASE[t], _CHANGES[t]) for t in _BASE}
#: task -> the harder settings (one axis at a time from MAD's baseline).
MAD_HARD_SETTINGS: dict[str, list[dict[str, Any]]] = {
    t: [{**_BASE[t], k: v} for k, vals in _HARD[t].items() for v in vals] for t in _BASE}

_SHORT = {"V": "V", "L": "L", "n_train": "n", "frac_noise": "noise", "n_copy": "copy"}


def _presets(task: str) -> dict[str, dict[str, Any]]:
    base = _BASE[task]
    out = {"baseline": dict(base)}
    for group, prefix in ((MAD_SETTINGS[task][1:], ""), (MAD_HARD_SETTINGS[task], "hard-")):
        for s in group:
            (k, v), = [(k, v) for k, v in s.items() if base.get(k) != v]
            out[f"{prefix}{_SHORT.get(k, k)}{v}"] = dict(s)
    return out


def mad_settings(hard: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(task, knobs) for every MAD setting (or the harder range), in MAD's order."""
    src = MAD_HARD_SETTINGS if hard else MAD_SETTINGS
    return [(t, dict(s)) for t, ss in src.items() for s in ss]


@dataclass
class MADTask(Task):
    """Shared machinery of the MAD tasks (not registered)."""

    V: int = knob(16, lo=4, hi=1 << 16, help="vocabulary size, special tokens included")
    L: int = knob(128, lo=8, hi=1 << 15, help="MAD's seq_len")
    n_train: int = knob(12800, lo=1, hi=10_000_000, help="training examples (MAD's num_train_examples)")

    suite: ClassVar[str] = "mad"
    kind: ClassVar[str] = "classification"
    backbone: ClassVar[str] = "lm"
    metrics: ClassVar[tuple[Metric, ...]] = MAD_METRICS
    n_eval: ClassVar[int] = 1280
    chunk_tokens: ClassVar[int] = 1 << 22      # rows are generated in chunks of about this many tokens

    def sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_eval, "test": self.n_eval}

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        rng = np_generator(self.name, seed, split)
        test_style = split != "train" or getattr(self, "train_targets", "values") == "values"
        step = max(1, self.chunk_tokens // max(1, self.seq_len))
        inputs = targets = None
        with single_torch_thread():                 # see there: faster on a busy machine
            for s in range(0, max(n, 1), step):     # chunks copied into fresh contiguous outputs
                x, y = self._make(min(step, n - s), rng, test_style, seed)
                if inputs is None:
                    inputs = torch.empty((n,) + x.shape[1:], dtype=x.dtype)
                    targets = torch.empty((n,) + y.shape[1:], dtype=y.dtype)
                inputs[s:s + len(x)], targets[s:s + len(y)] = x, y
        slices = {"vocab_size": torch.full((n,), self.V, dtype=torch.long),
                  "seq_len": torch.full((n,), self.L, dtype=torch.long)}
        return Batch(inputs, targets, targets != IGNORE, slices).to(device)

    def _make(self, n: int, rng: np.random.Generator, test_style: bool, seed: int):
        """(inputs, targets) int64 tensors for n examples."""
        raise NotImplementedError


def _first_occurrence(ids: torch.Tensor) -> torch.Tensor:
    """For each row of ids (n, P): the column index of the first entry equal to each entry."""
    n, P = ids.shape
    srt, order = ids.sort(dim=1, stable=True)
    start = torch.ones_like(srt, dtype=torch.bool)
    start[:, 1:] = srt[:, 1:] != srt[:, :-1]
    col = torch.arange(P).expand(n, P)
    first_sorted = torch.where(start, col, torch.zeros_like(col)).cummax(dim=1).values
    first = order.gather(1, first_sorted)                     # original column of the group head
    return torch.empty_like(first).scatter_(1, order, first)


def _ints(rng: np.random.Generator, lo: int, hi: int, shape, dtype=torch.long) -> torch.Tensor:
    return torch.from_numpy(rng.integers(lo, hi, shape, dtype=small_int_dtype(hi))).to(dtype)


def _distinct_tuples(rng: np.random.Generator, shape, k: int, pool: int, offset: int,
                     dtype=torch.long) -> torch.Tensor:
    """shape + (k,) tokens: uniform ordered k-tuples of distinct tokens from [offset, offset+pool)."""
    m = int(np.prod(shape)) if shape else 1
    if k <= 4:
        # sequentially: the j-th token is the r-th unused one, r uniform over pool - j
        dt = small_int_dtype(pool)
        chosen, srt = [], []                  # srt: the chosen tokens so far, sorted per row
        for j in range(k):
            x = rng.integers(0, pool - j, m, dtype=dt)
            for c in range(j):
                x += x >= srt[c]
            chosen.append(x)
            carry = x
            for c in range(j):                # insert x into the sorted columns (min/max network)
                srt[c], carry = np.minimum(srt[c], carry), np.maximum(srt[c], carry)
            srt.append(carry)
        out = torch.from_numpy(np.stack(chosen, 1)).to(dtype)
    elif k * k > 2 * pool:
        r = rng.random((m, pool), dtype=np.float32).argsort(axis=1)[:, :k]
        out = torch.from_numpy(r).to(dtype)
    else:
        from .mqar import distinct_draws
        out = distinct_draws(m, k, 0, pool, rng).to(dtype)
    return (out + offset).reshape(*shape, k)


# ----------------------------------------------------------------------------------------
# in-context recall and noisy in-context recall
# ----------------------------------------------------------------------------------------

@dataclass
class _Recall(MADTask):
    train_targets: str = knob("full_lm", choices=("full_lm", "values"),
                              help="training targets: MAD's next-token LM, or test-style values only")

    @property
    def seq_len(self) -> int:
        return self.L - 1

    def _noise(self) -> tuple[int, float]:
        return 0, 0.0

    def validate(self) -> None:
        nv, _ = self._noise()
        if self.L % 2:
            raise UsageError(f"{self.name}: L={self.L} must be even; allowed: even lengths")
        if self.V - nv < 4:
            raise UsageError(f"{self.name}: V={self.V} leaves fewer than 4 key/value tokens; allowed: V >= {nv + 4}")

    def _make(self, n, rng, test_style, seed):
        nv, frac = self._noise()
        ns = self.V - nv
        nk = ns // 2
        P = self.L // 2                                            # pairs, the final probe included
        kvmap = _ints(rng, nk, ns, (n, nk))                         # each key's value, per example
        keys = _ints(rng, 0, nk, (n, P - 1))
        vals = kvmap.gather(1, keys)
        real = torch.ones(n, P - 1, dtype=torch.bool)
        if frac > 0:
            # every pair slot but one guaranteed real slot is noise with probability frac
            real = torch.from_numpy(rng.random((n, P - 1)) >= frac)
            real[torch.arange(n), _ints(rng, 0, P - 1, (n,))] = True
            noise = _ints(rng, ns, self.V, (n, P - 1, 2))
            keys = torch.where(real, keys, noise[..., 0])
            vals = torch.where(real, vals, noise[..., 1])
        # a value is supervised when its key was shown in an earlier real pair
        ids = torch.where(real, keys, nk + torch.arange(P - 1).expand(n, P - 1))
        seen_before = _first_occurrence(ids) != torch.arange(P - 1)
        # probe: a key shown before, uniform over the distinct keys shown
        shown = torch.zeros(n, nk + 1, dtype=torch.bool).scatter_(
            1, torch.where(real, keys, nk), True)[:, :nk]
        prio = torch.from_numpy(rng.random((n, nk), dtype=np.float32)).masked_fill(~shown, -1.0)
        kp = prio.argmax(dim=1, keepdim=True)
        vp = kvmap.gather(1, kp)
        tokens = torch.cat([torch.stack([keys, vals], dim=2).reshape(n, -1), kp, vp], dim=1)
        if not test_style:
            return tokens[:, :-1], tokens[:, 1:].clone()
        tgt = torch.full((n, 2 * P), IGNORE, dtype=torch.long)
        tgt[:, 1:2 * P - 2:2] = torch.where(real & seen_before, vals, IGNORE)
        tgt[:, -1] = vp[:, 0]
        return tokens[:, :-1], tgt[:, 1:]


@register_task("mad-recall")
@dataclass
class MADRecall(_Recall):
    """MAD in-context recall (multi-query): keys [0, V/2), values [V/2, V), L/2 pairs.

    Keys are drawn with replacement and each key keeps one value per example; the last pair
    repeats a key shown before. Inputs are the first L-1 tokens. Test targets: the value of
    every pair whose key was shown before, at the key's position, and the final probe value.
    Metrics: class_accuracy (MAD's number), token_accuracy (micro), accuracy (per example).
    """
    version: ClassVar[int] = 1
    presets: ClassVar[dict] = _presets("mad-recall")


@register_task("mad-noisy-recall")
@dataclass
class MADNoisyRecall(_Recall):
    """MAD noisy in-context recall: recall with a noise vocabulary [V - noise_vocab, V).

    Each pair slot except one guaranteed real one is, with probability ``frac_noise``, two
    noise tokens. Test targets never fall on noise. (MAD draws the guaranteed slot among
    L/2 slots of which L/2 - 1 exist, so one time in L/2 it guarantees nothing; here it is
    always a real slot, so every example has a key to probe.)
    Metrics: class_accuracy (MAD's number), token_accuracy (micro), accuracy (per example).
    """
    V: int = knob(32, lo=8, hi=1 << 16, help="vocabulary size, the noise tokens included")
    noise_vocab: int = knob(16, lo=1, hi=1 << 15, help="noise tokens, the top of the vocabulary")
    frac_noise: float = knob(0.2, lo=0.0, hi=0.95, help="probability that a pair slot is noise")

    version: ClassVar[int] = 1
    presets: ClassVar[dict] = _presets("mad-noisy-recall")

    def _noise(self):
        return self.noise_vocab, self.frac_noise


# ----------------------------------------------------------------------------------------
# fuzzy in-context recall
# ----------------------------------------------------------------------------------------

@register_task("mad-fuzzy-recall")
@dataclass
class MADFuzzyRecall(MADTask):
    """MAD fuzzy in-context recall: keys and values are motifs of several tokens.

    Pad token V-1; keys from [0, (V-1)/2), values from [(V-1)/2, V-1). A key (value) is an
    ordered tuple of 1..k_motif (1..v_motif) distinct tokens, sizes uniform; at test every
    key has k_motif tokens. One probe pair is inserted at a uniform offset and repeated at
    the end; the sequence is left-padded to L+1 tokens and shifted (L inputs).
    Test targets: the value tokens of every pair whose key was shown before, and the final
    probe value. Metrics: class_accuracy (MAD's number), token_accuracy, accuracy.
    """
    k_motif: int = knob(3, lo=1, hi=4, help="largest key motif (test keys always have this size)")
    v_motif: int = knob(3, lo=1, hi=4, help="largest value motif")
    train_targets: str = knob("full_lm", choices=("full_lm", "values"),
                              help="training targets: MAD's next-token LM, or test-style values only")

    # 2: candidate pairs drawn about as many as fit (same law, different samples per seed)
    version: ClassVar[int] = 2
    presets: ClassVar[dict] = _presets("mad-fuzzy-recall")

    def validate(self) -> None:
        nk = (self.V - 1) // 2
        nv = (self.V - 1) - nk
        if self.k_motif > nk or self.v_motif > nv:
            raise UsageError(f"mad-fuzzy-recall: motifs ({self.k_motif}, {self.v_motif}) need more distinct "
                             f"tokens than V={self.V} gives ({nk} keys, {nv} values); allowed: k_motif <= {nk}")
        if self.L < 4 * (self.k_motif + self.v_motif):
            raise UsageError(f"mad-fuzzy-recall: L={self.L} too short for motifs; allowed: "
                             f"L >= {4 * (self.k_motif + self.v_motif)}")

    def _n_candidates(self, train: bool) -> int:
        """Candidate pairs drawn per row: enough to fill L tokens unless the row's pairs are
        ``cand_sigmas`` standard deviations shorter than average (at most MAD's L/2 + 1)."""
        K, Vm = self.k_motif, self.v_motif
        mu = (K + 1) / 2 + (Vm + 1) / 2 if train else K + (Vm + 1) / 2
        var = (Vm * Vm - 1) / 12 + ((K * K - 1) / 12 if train else 0.0)
        m = self.L / mu
        return min(self.L // 2 + 1, int(m + self.cand_sigmas * (var * m) ** 0.5 / mu) + 2)

    cand_sigmas: ClassVar[float] = 7.0

    def _make(self, n, rng, test_style, seed):
        K, Vm, L = self.k_motif, self.v_motif, self.L
        train = not test_style
        nk = (self.V - 1) // 2
        nv = (self.V - 1) - nk

        i32 = torch.int32                            # sizes and tokens; widened once at the end

        def ksize(shape):
            return _ints(rng, 1, K + 1, shape, i32) if train else torch.full(shape, K, dtype=i32)

        def candidates(m, P):
            return (ksize((m, P)), _ints(rng, 1, Vm + 1, (m, P), i32),
                    _distinct_tuples(rng, (m, P), K, nk, 0, i32), _distinct_tuples(rng, (m, P), Vm, nv, nk, i32))

        # probe
        kps, vps = ksize((n,)), _ints(rng, 1, Vm + 1, (n,), i32)
        kpt = _distinct_tuples(rng, (n,), K, nk, 0, i32)
        vpt = _distinct_tuples(rng, (n,), Vm, nv, nk, i32)
        kvp = kps + vps
        probe_idx = (torch.from_numpy(rng.random(n)) * (L - 2 * kvp)).to(i32)
        bound = L - kvp - (K + Vm)
        probe = (kps, vps, kpt, vpt, probe_idx, bound)
        # candidate pairs, i.i.d.: about as many as fit, not MAD's L/2 + 1. The result equals
        # that of L/2 + 1 candidates unless the row's last candidate starts before both the
        # bound and the probe offset; such a (rare) row gets the missing candidates appended and
        # is made again, so every row follows the law of L/2 + 1 candidates.
        P_full = L // 2 + 1
        P = self._n_candidates(train)
        cand = candidates(n, P)
        x, y, short = self._assemble(train, probe, cand)
        short = short.nonzero()[:, 0] if P < P_full else short[:0]
        if short.numel():
            more = candidates(short.numel(), P_full - P)
            ext = [torch.cat([c[short], m], dim=1) for c, m in zip(cand, more)]
            x[short], y[short], _ = self._assemble(train, [v[short] for v in probe], ext)
        return x, y

    def _assemble(self, train, probe, cand):
        """(inputs, targets) of rows from their probe and candidate pairs (see the class doc)."""
        K, Vm, L = self.k_motif, self.v_motif, self.L
        pad = self.V - 1
        nk = (self.V - 1) // 2
        kps, vps, kpt, vpt, probe_idx, bound = probe
        ks, vs, kt, vt = cand
        n, P = ks.shape
        ar = torch.arange
        kvp = kps + vps
        B = nk + 1
        idt = torch.int32 if B ** K < (1 << 31) else torch.long
        powers = (B ** ar(K)).to(idt)

        def key_id(tok, size):                       # unique per tuple, sizes included
            live = ar(K) < size.unsqueeze(-1)
            return ((tok.to(idt) + 1) * powers * live).sum(-1, dtype=idt)

        ids = key_id(kt, ks)
        pid = key_id(kpt, kps)
        is_pk = ids == pid[:, None]
        # a repeated key keeps the value of its first occurrence; the probe key keeps the probe value
        first = _first_occurrence(ids)
        seen = first != ar(P)
        vt = vt.gather(1, first[..., None].expand(-1, -1, Vm))
        vs = vs.gather(1, first)
        vt = torch.where(is_pk[..., None], vpt[:, None, :], vt)
        vs = torch.where(is_pk, vps[:, None], vs)
        ln = ks + vs
        start = ln.cumsum(1, dtype=torch.int32) - ln
        short = start[:, -1] < torch.maximum(bound, probe_idx)     # more candidates could matter
        # the probe goes in before the first pair starting at or after probe_idx, unless its
        # key has already appeared (then it counts as added)
        j = (start < probe_idx[:, None]).sum(1)
        jc = j.clamp_max(P - 1)[:, None]                # j == P only in short rows (made again)
        pk_before = (is_pk.cumsum(1, dtype=torch.int32) - is_pk.int()).gather(1, jc)[:, 0] > 0
        ins = (start.gather(1, jc)[:, 0] < bound) & ~pk_before
        # tokens of each candidate and of the probe, key then value (W slots, the tail unused)
        W = K + Vm
        t = ar(W)
        ctok = torch.where(t < ks[..., None], kt.gather(2, t.clamp_max(K - 1).expand(n, P, W)),
                           vt.gather(2, (t - ks[..., None]).clamp(0, Vm - 1)))
        ptok = torch.where(t < kps[:, None], kpt.gather(1, t.clamp_max(K - 1).expand(n, W)),
                           vpt.gather(1, (t - kps[:, None]).clamp(0, Vm - 1)))
        # items: the candidates with the probe inserted at j when ins
        q = ar(P + 1).expand(n, -1)
        after = ins[:, None] & (q > j[:, None])
        is_probe = ins[:, None] & (q == j[:, None])
        src = (q - after.long()).clamp_max(P - 1)
        ks2 = torch.where(is_probe, kps[:, None], ks.gather(1, src))
        ln2 = torch.where(is_probe, kvp[:, None], ln.gather(1, src))
        tok = torch.where(is_probe[..., None], ptok[:, None], ctok.gather(1, src[..., None].expand(-1, -1, W)))
        start2 = ln2.cumsum(1, dtype=torch.int32) - ln2
        valid = (start2 < bound[:, None]) & (q < P + ins.long()[:, None])
        ln2 = ln2 * valid
        total = ln2.sum(1, dtype=torch.int32)
        # supervised: valid items whose key was shown earlier (valid items are a prefix); the
        # inserted probe item itself never is (its key was not shown before it)
        sup = valid & ~is_probe & (seen.gather(1, src) | (is_pk.gather(1, src) & after))
        npad = L + 1 - (total + kvp)
        live = t < ln2[..., None]
        dump = L + 1                                   # an extra column takes the unused slots
        pos = torch.where(live, (npad[:, None] + start2).long()[..., None] + t, dump)
        out = torch.full((n, L + 2), pad, dtype=tok.dtype)
        out.scatter_(1, pos.reshape(n, (P + 1) * W), tok.reshape(n, (P + 1) * W))
        # the final probe
        ppos = torch.where(t < kvp[:, None], (npad + total).long()[:, None] + t, dump)
        out.scatter_(1, ppos, ptok)
        out = out[:, :L + 1].long()
        if train:
            return out[:, :-1], out[:, 1:], short        # views of one buffer; generate copies them
        tgt = torch.full((n, L + 2), IGNORE, dtype=tok.dtype)
        vpos = torch.where((t >= ks2[..., None]) & sup[..., None], pos, dump)
        tgt.scatter_(1, vpos.reshape(n, (P + 1) * W), tok.reshape(n, (P + 1) * W))
        tgt.scatter_(1, torch.where(t >= kps[:, None], ppos, dump), ptok)
        return out[:, :-1], tgt[:, 1:L + 1].long(), short


# ----------------------------------------------------------------------------------------
# selective copying, compression, memorization
# ----------------------------------------------------------------------------------------

@register_task("mad-selective-copy")
@dataclass
class MADSelectiveCopy(MADTask):
    """MAD selective copying: n_copy data tokens from [0, V-2) scattered among blanks (V-2),
    the copy token V-1, then n_copy blanks during which the data tokens are output in order.

    The L - 2*n_copy - 1 blanks are inserted before uniformly chosen data tokens (never
    after the last one). Train and test targets are identical (the last n_copy positions).
    Metrics: class_accuracy (MAD's number), token_accuracy (micro), accuracy (per example).
    """
    L: int = knob(256, lo=8, hi=1 << 15, help="sequence length")
    n_copy: int = knob(16, lo=1, hi=4096, help="data tokens to copy (MAD's num_tokens_to_copy)")

    version: ClassVar[int] = 1
    presets: ClassVar[dict] = _presets("mad-selective-copy")

    def validate(self) -> None:
        if self.L <= 2 * self.n_copy + 1:
            raise UsageError(f"mad-selective-copy: L={self.L} must exceed 2*n_copy+1={2 * self.n_copy + 1}; "
                             f"allowed: n_copy <= {(self.L - 2) // 2}")

    def _make(self, n, rng, test_style, seed):
        M, L = self.n_copy, self.L
        nb = L - 2 * M - 1
        blank, copy = self.V - 2, self.V - 1
        data = _ints(rng, 0, self.V - 2, (n, M))
        before = torch.zeros(n, M, dtype=torch.long).scatter_add_(
            1, _ints(rng, 0, M, (n, nb)), torch.ones(n, nb, dtype=torch.long))
        pos = torch.arange(M) + before.cumsum(1)
        inputs = torch.full((n, L), blank, dtype=torch.long)
        inputs.scatter_(1, pos, data)
        inputs[:, L - M - 1] = copy
        targets = torch.full((n, L), IGNORE, dtype=torch.long)
        targets[:, L - M:] = data
        return inputs, targets


@register_task("mad-compression")
@dataclass
class MADCompression(MADTask):
    """MAD compression: L-1 uniform tokens from [0, V-1) and the compression token V-1; the
    autoencoder backbone reads the last position and must reconstruct every token.
    Metrics: class_accuracy (MAD's number), token_accuracy (micro), accuracy (per example).
    """
    L: int = knob(32, lo=2, hi=1 << 15, help="sequence length")

    backbone: ClassVar[str] = "autoencoder"
    version: ClassVar[int] = 1
    presets: ClassVar[dict] = _presets("mad-compression")

    def _make(self, n, rng, test_style, seed):
        x = torch.empty(n, self.L, dtype=torch.long)
        x[:, :-1] = _ints(rng, 0, self.V - 1, (n, self.L - 1))
        x[:, -1] = self.V - 1
        return x, x.clone()


@register_task("mad-memorization")
@dataclass
class MADMemorization(MADTask):
    """MAD memorization: a fixed bijection from keys [0, (V-1)/2) to values, drawn from the
    seed alone and shared by all splits; each example is L/2 (key, insert token V-1) pairs,
    and the value is the target at each insert token. Measures memorized facts.
    Metrics: class_accuracy (MAD's number), token_accuracy (micro), accuracy (per example).
    """
    V: int = knob(256, lo=8, hi=1 << 16, help="vocabulary size (the insert token included)")
    L: int = knob(32, lo=2, hi=1 << 15, help="sequence length (even)")
    n_train: int = knob(256, lo=1, hi=10_000_000, help="training examples")

    version: ClassVar[int] = 1
    presets: ClassVar[dict] = _presets("mad-memorization")

    def validate(self) -> None:
        if self.L % 2:
            raise UsageError(f"mad-memorization: L={self.L} must be even; allowed: even lengths")

    def fact_map(self, seed: int) -> torch.Tensor:
        """value of each key, (nk,): fixed by (task, seed), independent of the split."""
        nk = (self.V - 1) // 2
        nv = (self.V - 1) - nk
        rng = np.random.Generator(np.random.PCG64(seed_for(self.name + ":facts", seed, "train")))
        return torch.from_numpy(rng.permutation(nv)[:nk].astype(np.int64)) + nk

    def _make(self, n, rng, test_style, seed):
        nk = (self.V - 1) // 2
        facts = self.fact_map(seed)
        keys = _ints(rng, 0, nk, (n, self.L // 2))
        inputs = torch.stack([keys, torch.full_like(keys, self.V - 1)], dim=2).reshape(n, -1)
        targets = torch.stack([torch.full_like(keys, IGNORE), facts[keys]], dim=2).reshape(n, -1)
        return inputs, targets
