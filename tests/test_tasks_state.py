"""State tracking: the label is what replaying the written swaps gives."""
import torch

from mixzoo.registry import tasks


def replay(row, N):
    toks = [int(v) for v in row]
    SWAP, QUERY, SEP, PAD = 2 * N, 2 * N + 1, 2 * N + 2, 2 * N + 3
    toks = [t for t in toks if t != PAD]
    sep = toks.index(SEP)
    state = toks[:sep]
    assert sorted(state) == list(range(N))
    i, swaps = sep + 1, 0
    while toks[i] == SWAP:
        a, b = toks[i + 1] - N, toks[i + 2] - N
        assert a != b and 0 <= a < N and 0 <= b < N
        state[a], state[b] = state[b], state[a]
        i += 3
        swaps += 1
    assert toks[i] == QUERY and i + 2 == len(toks)
    return state[toks[i + 1] - N], swaps


def test_label_equals_replayed_swaps():
    t = tasks()["state-tracking"](N=12)
    lo, hi = t.swap_range()
    assert (lo, hi) == (2, 4)
    b = t.generate("test", 200, 0)
    assert b.inputs.shape == (200, t.seq_len) and b.mask.sum(1).eq(1).all() and b.mask[:, -1].all()
    counts = set()
    for i in range(200):
        label, swaps = replay(b.inputs[i], 12)
        assert int(b.targets[i, -1]) == label
        assert int(b.slices["num_swaps"][i]) == swaps
        counts.add(swaps)
    assert counts == {2, 3, 4}


def test_identity_start_and_custom_swap_range():
    t = tasks()["state-tracking"](N=6, initial="identity", min_swaps=5, max_swaps=5)
    b = t.generate("train", 20, 1)
    assert (b.inputs[:, :6] == torch.arange(6)).all()
    for i in range(20):
        label, swaps = replay(b.inputs[i], 6)
        assert swaps == 5 and int(b.targets[i, -1]) == label
