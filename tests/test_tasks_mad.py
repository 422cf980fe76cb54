"""Invariants of the MAD generators (small sizes)."""
import torch

from mixzoo.registry import tasks
from mixzoo.tasks.base import IGNORE
from mixzoo.tasks.mad import MAD_HARD_SETTINGS, MAD_SETTINGS, mad_settings


def T(name, **kw):
    return tasks()[name](**kw)


def test_settings_are_madss_66_and_valid():
    assert {k: len(v) for k, v in MAD_SETTINGS.items()} == {
        "mad-recall": 11, "mad-fuzzy-recall": 11, "mad-noisy-recall": 14,
        "mad-selective-copy": 13, "mad-compression": 11, "mad-memorization": 6}
    assert len(mad_settings()) == 66
    for task, knobs in mad_settings() + mad_settings(hard=True):
        t = tasks()[task].from_knobs(knobs)
        assert t.sizes()["train"] == knobs["n_train"] and t.sizes()["test"] == 1280
    assert max(s["V"] for s in MAD_HARD_SETTINGS["mad-recall"]) == 512
    assert max(s["L"] for s in MAD_HARD_SETTINGS["mad-selective-copy"]) == 2048
    assert tasks()["mad-recall"].metrics[0].name == "class_accuracy"
    assert tasks()["mad-recall"].metrics[1].name == "token_accuracy"


def _check_recall_test(b, nk, ns, noise_lo=None):
    x, y, m = b.inputs, b.targets, b.mask
    n, T_ = x.shape
    for i in range(n):
        seen = {}
        for t in range(0, T_, 2):               # key positions; the value follows
            k = int(x[i, t])
            v = int(x[i, t + 1]) if t + 1 < T_ else int(y[i, t])
            if noise_lo is not None and k >= noise_lo:
                assert not m[i, t] and not m[i, t + 1]
                continue
            assert 0 <= k < nk and nk <= v < ns
            if k in seen:
                assert seen[k] == v, "a key keeps its value"
                assert m[i, t] and int(y[i, t]) == v
            elif t < T_ - 1:
                assert not m[i, t]
            seen[k] = v
        assert m[i, T_ - 1], "the final probe is supervised"
        assert int(x[i, T_ - 1]) in seen
        assert not m[i, 1::2].any(), "only key positions carry targets"


def test_recall_train_is_next_token_and_test_is_values():
    t = T("mad-recall", V=16, L=64)
    tr = t.generate("train", 16, 0)
    assert tr.inputs.shape == (16, 63) and tr.mask.all()
    assert torch.equal(tr.targets[:, :-1], tr.inputs[:, 1:])
    _check_recall_test(t.generate("test", 16, 0), 8, 16)
    _check_recall_test(t.generate("val", 16, 0), 8, 16)
    v = T("mad-recall", V=16, L=64, train_targets="values").generate("train", 8, 0)
    assert not v.mask.all()


def test_noisy_recall_never_targets_noise():
    t = T("mad-noisy-recall", V=32, L=64, noise_vocab=16, frac_noise=0.6)
    b = t.generate("test", 32, 1)
    sup = b.targets[b.mask]
    assert (sup < 16).all() and (sup >= 8).all()
    _check_recall_test(b, 8, 16, noise_lo=16)
    frac = (b.inputs[:, 0::2] >= 16).float().mean()
    assert 0.45 < frac < 0.7
    tr = t.generate("train", 8, 1)
    assert tr.mask.all() and (tr.targets >= 16).any(), "training (full LM) includes noise tokens"


def _parse_fuzzy(row, nk, pad):
    """Split a fuzzy-recall row (tokens after the pad) into alternating key / value runs."""
    toks = [int(v) for v in row if int(v) != pad]
    runs, cur, is_key = [], [], None
    for v in toks:
        k = v < nk
        if cur and k != is_key:
            runs.append((is_key, cur))
            cur = []
        is_key = k
        cur.append(v)
    runs.append((is_key, cur))
    return runs


def test_fuzzy_recall_test_keys_have_full_motif_size_and_consistent_values():
    t = T("mad-fuzzy-recall", V=16, L=128, k_motif=3, v_motif=3)
    nk, pad = 7, 15
    b = t.generate("test", 32, 0)
    full = torch.cat([b.inputs, b.targets[:, -1:]], dim=1)      # the last token is the probe's last value
    for i in range(32):
        runs = _parse_fuzzy(full[i], nk, pad)
        keys = [r for is_k, r in runs if is_k]
        assert all(len(k) % 3 == 0 for k in keys)
        assert runs[0][0], "the sequence starts with a key"
        # pairs: keys come in triples; split merged key runs is impossible (values separate them)
        pairs, seen = list(zip(runs[0::2], runs[1::2])), {}
        for (_, k), (_, v) in pairs:
            assert len(k) == 3 and len(set(k)) == 3 and 1 <= len(v) <= 3 and len(set(v)) == len(v)
            if tuple(k) in seen:
                assert seen[tuple(k)] == v
            seen[tuple(k)] = v
        assert b.mask[i, -1]
    # supervision covers exactly the values of repeated keys (and the probe)
    sup = b.targets[b.mask]
    assert (sup >= nk).all() and (sup < pad).all()
    tr = t.generate("train", 64, 0)
    assert torch.equal(tr.targets[:, :-1], tr.inputs[:, 1:])
    runs = [r for i in range(64) for is_k, r in _parse_fuzzy(tr.inputs[i], nk, pad) if is_k]
    assert {len(r) for r in runs} & {1, 2}, "training keys have sizes below the motif size"


def test_selective_copy_targets_are_data_tokens_in_order():
    t = T("mad-selective-copy", V=16, L=64, n_copy=8)
    b = t.generate("train", 32, 0)
    blank, copy = 14, 15
    x, y = b.inputs, b.targets
    assert (x[:, 64 - 9] == copy).all() and (x[:, -8:] == blank).all()
    assert b.mask[:, -8:].all() and not b.mask[:, :-8].any()
    for i in range(32):
        pre = x[i, :64 - 9]
        data = pre[pre != blank]
        assert torch.equal(data, y[i, -8:])
        assert pre[-1] != blank, "the last data token sits next to the copy token"
    assert (x[:, :55] == blank).sum() == 32 * (64 - 2 * 8 - 1)


def test_compression_reconstructs_all_and_uses_autoencoder():
    t = T("mad-compression", V=16, L=32)
    assert t.backbone == "autoencoder"
    b = t.generate("test", 8, 0)
    assert torch.equal(b.inputs, b.targets) and b.mask.all() and (b.inputs[:, -1] == 15).all()
    assert (b.inputs[:, :-1] < 15).all()


def test_memorization_map_fixed_by_seed_and_shared_by_splits():
    t = T("mad-memorization", V=256, L=32)
    facts = t.fact_map(0)
    assert len(set(facts.tolist())) == 127 and int(facts.min()) >= 127 and int(facts.max()) < 255
    assert not torch.equal(facts, t.fact_map(1))
    for split in ("train", "val", "test"):
        b = t.generate(split, 16, 0)
        assert (b.inputs[:, 1::2] == 255).all() and (b.targets[:, 0::2] == IGNORE).all()
        assert torch.equal(b.targets[:, 1::2], facts[b.inputs[:, 0::2]])
