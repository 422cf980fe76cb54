"""MQAR: zoology's layout, and the noise filler that cannot form spurious pairs."""
import torch

from mixzoo.registry import tasks


def _check_layout(b, kv, L):
    x, y, m = b.inputs, b.targets, b.mask
    assert m.sum(1).eq(kv).all()
    for i in range(x.shape[0]):
        keys, vals = x[i, 0:2 * kv:2], x[i, 1:2 * kv:2]
        assert len(set(keys.tolist())) == kv and len(set(vals.tolist())) == kv
        pos = m[i].nonzero()[:, 0]
        assert ((pos - 2 * kv) % 2 == 0).all()
        q = x[i, pos]
        assert sorted(q.tolist()) == sorted(keys.tolist()), "every key is queried once"
        pair = dict(zip(keys.tolist(), vals.tolist()))
        assert [pair[int(k)] for k in q] == y[i, pos].tolist()


def test_noise_filler_is_disjoint_from_keys_and_values():
    t = tasks()["mqar"](V=64, L=64, kv=4, filler="noise", noise_vocab=16)
    b = t.generate("train", 64, 0)
    _check_layout(b, 4, 64)
    x = b.inputs
    region = x[:, 8:]
    filler = region[~b.mask[:, 8:]]
    assert (filler >= 48).all(), "filler only from the noise vocabulary"
    assert (x[:, :8] < 48).all() and (x[b.mask] < 24).all()
    # no spurious key -> value bigram in the query region
    big = (region[:, :-1] < 24) & (region[:, 1:] >= 24) & (region[:, 1:] < 48)
    assert not big.any()
    v = tasks()["mqar"](V=64, L=64, kv=4).generate("train", 64, 0)
    _check_layout(v, 4, 64)
    assert (v.inputs[:, 8:][~v.mask[:, 8:]] < 48).any(), "zoology's filler uses the whole vocabulary"


def test_query_placement_is_power_law_biased():
    t = tasks()["mqar"](V=256, L=128, kv=8, filler="zero")
    b = t.generate("test", 2000, 0)
    _check_layout(b.index(slice(0, 50)), 8, 128)
    slot = (b.mask[:, 16:].nonzero()[:, 1] // 2)
    hist = torch.bincount(slot, minlength=56).float() / b.mask.shape[0]
    assert hist[0] > 0.8 and hist[0] > 3 * hist[-1]
    # the first context key tends to be queried earlier than the last one
    pos = b.mask[:, 16:].float()
    first_key = b.inputs[:, 0:1]
    last_key = b.inputs[:, 14:15]
    at_first = ((b.inputs[:, 16:] == first_key) & b.mask[:, 16:]).float().argmax(1).float().mean()
    at_last = ((b.inputs[:, 16:] == last_key) & b.mask[:, 16:]).float().argmax(1).float().mean()
    assert pos.sum() == 8 * 2000 and at_first < at_last
