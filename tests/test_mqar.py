import pytest
import torch

from mixzoo.errors import UsageError
from mixzoo.tasks import IGNORE, leakage
from mixzoo.tasks.mqar import MQAR


def _check_invariants(task: MQAR, b):
    V, kv = task.V, task.kv
    ctx = 2 * kv * task.num_passes
    inp, tgt = b.inputs, b.targets
    keys, vals = inp[:, 0:2 * kv:2], inp[:, 1:2 * kv:2]
    # keys and values come from their halves, distinct within a sequence
    assert ((keys >= 1) & (keys < V // 2)).all()
    assert ((vals >= V // 2) & (vals < V)).all()
    for row in range(inp.shape[0]):
        assert len(set(keys[row].tolist())) == kv
        assert len(set(vals[row].tolist())) == kv
    # supervision only at query positions; exactly kv per sequence
    assert (b.mask == (tgt != IGNORE)).all()
    assert (b.mask.sum(1) == kv).all()
    assert not b.mask[:, :ctx].any()
    for row in range(inp.shape[0]):
        pairs = dict(zip(keys[row].tolist(), vals[row].tolist()))
        qpos = b.mask[row].nonzero().flatten().tolist()
        queried = [inp[row, p].item() for p in qpos]
        # every key is queried exactly once, at an even offset of the query region
        assert sorted(queried) == sorted(pairs)
        assert all((p - ctx) % 2 == 0 for p in qpos)
        # each label is the value paired with that key earlier in the sequence
        for p in qpos:
            assert tgt[row, p].item() == pairs[inp[row, p].item()]


@pytest.mark.parametrize("knobs", [dict(V=64, L=64, kv=4), dict(V=8192, L=128, kv=8),
                                   dict(V=32, L=64, kv=8, filler="zero"),
                                   dict(V=64, L=64, kv=4, num_passes=2)])
def test_mqar_invariants(knobs):
    t = MQAR(**knobs)
    b = t.generate("train", 200, seed=3)
    _check_invariants(t, b)
    assert b.slices["num_kv_pairs"].eq(t.kv).all()


def test_mqar_deterministic_and_splits_disjoint():
    t = MQAR(V=64, L=64, kv=4)
    a, b = t.generate("test", 300, seed=1), t.generate("test", 300, seed=1)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    c = t.generate("test", 300, seed=2)
    assert not torch.equal(a.inputs, c.inputs)
    tr, va = t.generate("train", 2000, seed=1), t.generate("val", 300, seed=1)
    assert leakage(tr, a) == 0.0 and leakage(tr, va) == 0.0 and leakage(va, a) == 0.0
    assert leakage(a, a) == 1.0


def test_mqar_query_placement_follows_power_law():
    # a=1 gives uniform slots; a=0.01 puts far more queries in the first slot
    n = 4000
    uni = MQAR(V=256, L=64, kv=4, power_a=1.0).generate("train", n, 0)
    skew = MQAR(V=256, L=64, kv=4, power_a=0.01).generate("train", n, 0)
    first = 2 * 4
    share_uni = uni.mask[:, first].float().mean().item()
    share_skew = skew.mask[:, first].float().mean().item()
    # uniform: P(slot 0 chosen among 4 of 28) = 4/28
    assert abs(share_uni - 4 / 28) < 0.03
    assert share_skew > 2 * share_uni


def test_mqar_noise_filler_is_disjoint():
    t = MQAR(V=80, L=64, kv=4, filler="noise", noise_vocab=16)
    b = t.generate("train", 100, 0)
    ctx = 8
    filler = b.inputs[:, ctx:][~b.mask[:, ctx:]]
    assert ((filler >= 64) & (filler < 80)).all()
    assert (b.inputs[:, :ctx] < 64).all()


@pytest.mark.parametrize("knobs,msg", [(dict(L=63), "L=63"), (dict(L=64, kv=17), "kv=17"),
                                       (dict(V=8, L=64, kv=4), "kv=4"),
                                       (dict(filler="bogus"), "filler")])
def test_mqar_bad_knobs(knobs, msg):
    with pytest.raises(UsageError, match=msg):
        MQAR(**knobs)
