"""Exact laws of the fast sampling paths (MQAR draws, fuzzy-recall candidate truncation)."""
import itertools

import numpy as np
import pytest
import torch

from mixzoo.registry import tasks
from mixzoo.tasks.mqar import distinct_rows, race_slots, race_weights


def _chi2_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    n = counts.sum()
    exp = n * probs
    stat = ((counts - exp) ** 2 / exp).sum()
    dof = len(probs) - 1
    return stat < dof + 6 * np.sqrt(2 * dof)          # far in the tail of chi2(dof)


@pytest.mark.parametrize("k,lo,hi", [(3, 0, 7), (2, 1, 6), (3, 5, 9)])
def test_distinct_rows_uniform_over_ordered_tuples(k, lo, hi):
    rng = np.random.default_rng(0)
    x = distinct_rows(rng, 200_000, k, lo, hi)
    assert x.dtype == np.int64 and ((x >= lo) & (x < hi)).all()
    tuples = list(itertools.permutations(range(lo, hi), k))
    index = {t: i for i, t in enumerate(tuples)}
    counts = np.bincount([index[tuple(r)] for r in x.tolist()], minlength=len(tuples))
    assert _chi2_ok(counts, np.full(len(tuples), 1 / len(tuples)))


def test_race_slots_follow_sequential_weighted_choice():
    p = np.array([0.5, 0.25, 0.15, 0.1])
    rng = np.random.default_rng(1)
    s = race_slots(race_weights(p), 200_000, 2, rng)
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    probs = np.array([p[i] * p[j] / (1 - p[i]) for i, j in pairs])
    index = {t: n for n, t in enumerate(pairs)}
    counts = np.bincount([index[tuple(r)] for r in s.tolist()], minlength=len(pairs))
    assert _chi2_ok(counts, probs)


def test_mqar_same_rows_whatever_the_threads_and_chunks():
    t = tasks()["mqar"](V=256, L=64, kv=8)
    t.chunk_tokens = 64 * 37                           # several chunks, the last one partial
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = t.generate("train", 500, 5)
        torch.set_num_threads(2)
        b = t.generate("train", 500, 5)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and torch.equal(a.mask, b.mask)
    c = t.generate("train", 37, 5)                     # a prefix of rows is the same prefix
    assert torch.equal(c.inputs, a.inputs[:37])


@pytest.mark.parametrize("split", ["train", "test"])
def test_fuzzy_recall_extension_path_keeps_the_law(split):
    # with no margin most rows run out of candidates and take the extension path
    base = tasks()["mad-fuzzy-recall"](V=16, L=128)
    ext = tasks()["mad-fuzzy-recall"](V=16, L=128)
    ext.cand_sigmas = -3.0
    a, b = base.generate(split, 4000, 0), ext.generate(split, 4000, 1)
    pad = 15
    for f in (lambda x: (x.inputs == pad).sum(1).float(), lambda x: x.mask.sum(1).float()):
        fa, fb = f(a), f(b)
        se = (fa.var() / len(fa) + fb.var() / len(fb)).sqrt()
        assert abs(fa.mean() - fb.mean()) < 5 * se + 1e-9
    small = ext.generate(split, 64, 0)
    assert small.inputs.shape == (64, 128) and small.mask.any(1).all()
    assert ((small.inputs >= 0) & (small.inputs <= pad)).all()


@pytest.mark.parametrize("knobs", [dict(V=100, L=64, kv=4), dict(V=90, L=64, kv=4, filler="noise", noise_vocab=10),
                                   dict(V=70000, L=128, kv=16)])
def test_mqar_non_power_of_two_ranges(knobs):
    t = tasks()["mqar"](**knobs)
    b = t.generate("train", 300, 0)
    lo, mid, top = t._key_value_range()
    kv = t.kv
    keys, vals = b.inputs[:, 0:2 * kv:2], b.inputs[:, 1:2 * kv:2]
    assert ((keys >= lo) & (keys < mid)).all() and ((vals >= mid) & (vals < top)).all()
    assert all(len(set(r)) == kv for r in keys.tolist()) and all(len(set(r)) == kv for r in vals.tolist())
    filler = b.inputs[:, 2 * kv:][~b.mask[:, 2 * kv:]]
    flo = top if t.filler == "noise" else 0
    assert ((filler >= flo) & (filler < t.V)).all()
    if t.V - flo <= 128:                                                 # the whole range is reached
        assert int(filler.max()) == t.V - 1 and int(filler.min()) == flo
    q = b.inputs[b.mask].reshape(-1, kv)
    assert torch.equal(q.sort(1).values, keys.sort(1).values), "every key is queried once"


def test_fuzzy_recall_extension_path_rows_are_well_formed():
    t = tasks()["mad-fuzzy-recall"](V=16, L=128)
    t.cand_sigmas = -3.0
    b = t.generate("test", 64, 0)
    nk, pad = 7, 15
    full = torch.cat([b.inputs, b.targets[:, -1:]], dim=1)
    for i in range(64):
        toks = [v for v in full[i].tolist() if v != pad]
        assert full[i, :128 + 1 - len(toks)].eq(pad).all(), "left padding only"
        runs, cur = [], []
        for v in toks:
            if cur and (v < nk) != (cur[-1] < nk):
                runs.append(cur)
                cur = []
            cur.append(v)
        runs.append(cur)
        seen = {}
        for k, v in zip(runs[0::2], runs[1::2]):
            assert len(k) == 3 and len(set(k)) == 3 and 1 <= len(v) <= 3
            assert seen.setdefault(tuple(k), v) == v, "a key keeps its value"
        assert tuple(runs[-2]) in seen or len(runs) == 2, "the final probe repeats a shown key"


@pytest.mark.parametrize("n,k,lo,hi", [(20, 5000, 3, (1 << 19) + 3), (50, 40, 0, 60), (30, 1, 2, 3)])
def test_distinct_rows_wide_packing_and_dense_paths(n, k, lo, hi):
    x = distinct_rows(np.random.default_rng(2), n, k, lo, hi)       # int64 packing / argsort / k=1
    assert x.shape == (n, k) and ((x >= lo) & (x < hi)).all()
    assert all(len(set(r)) == k for r in x.tolist())
