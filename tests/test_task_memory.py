"""The vector generators (icl-regression, ttr) without (n, T, d_y, d_x) intermediates: the same
data as the old gather-based formulas, and a peak memory within 2x of what they return."""
import json
import subprocess
import sys

import pytest
import torch

from mixzoo.registry import tasks
from mixzoo.tasks import icl_regression
from mixzoo.tasks.base import generator
from mixzoo.tasks.icl_regression import NormalStream, replay


# -- the old generators, kept as the oracle (one gathered (d_y, d_x) map per position) ----------
def _old_unit(shape, g):
    x = torch.randn(shape, generator=g)
    return x / x.norm(dim=-1, keepdim=True)


def _old_cone(mu, width, g):
    x = mu + width * torch.randn(mu.shape, generator=g)
    return x / x.norm(dim=-1, keepdim=True)


def _old_icl_sample(t, split, n, seed):
    g = generator(t.name, seed, split)
    C, S, dx, dy, Q = t.L // t.S, t.S, t.d_x, t.d_y, t.n_queries
    mu = _old_unit((n, C, dx), g)
    A = torch.randn(n, C, dy, dx, generator=g) / dx ** 0.5
    seg = torch.arange(C).repeat_interleave(S).expand(n, -1)
    perm = torch.rand(n, C * S, generator=g).argsort(dim=1)
    seg = seg.gather(1, perm)
    qseg = torch.randint(0, C, (n, Q), generator=g)
    allseg = torch.cat([seg, qseg], dim=1)
    x = dx ** 0.5 * _old_cone(mu.gather(1, allseg[..., None].expand(-1, -1, dx)), t.cone_width, g)
    Ag = A.gather(1, allseg[..., None, None].expand(-1, -1, dy, dx))
    clean = (Ag @ x[..., None])[..., 0]
    sigma = t.noise if split == "train" else 0.0
    eps = sigma * torch.randn(clean.shape, generator=g)
    y = clean + eps
    if not (split == "train" and t.noisy_train_queries):
        y[:, t.L:] = clean[:, t.L:]
    return {"x": x, "y": y, "clean": clean, "segment": allseg, "A": A, "mu": mu}


def _old_icl_generate(t, split, n, seed):
    d = _old_icl_sample(t, split, n, seed)
    L, Q, dx, dy, T = t.L, t.n_queries, t.d_x, t.d_y, t.seq_len
    x, y = d["x"], d["y"]
    inputs = torch.zeros(n, T, dx + dy)
    if t.token_format == "pair":
        inputs[:, :L, :dx] = x[:, :L]
        inputs[:, :L, dx:] = y[:, :L]
    else:
        inputs[:, 0:2 * L:2, :dx] = x[:, :L]
        inputs[:, 1:2 * L:2, dx:] = y[:, :L]
    inputs[:, T - Q:, :dx] = x[:, L:]
    targets = torch.zeros(n, T, dy)
    targets[:, T - Q:] = y[:, L:]
    mask = torch.zeros(n, T, dtype=torch.bool)
    mask[:, T - Q:] = True
    return inputs, targets, mask


def _old_ttr_sample(t, split, n, seed):
    g = generator(t.name, seed, split)
    C, d = t.L // t.S, t.d
    mu = _old_unit((n, C, d), g)
    A = torch.randn(n, C, d, d, generator=g)
    seg = torch.arange(C).repeat_interleave(t.S)
    k = _old_cone(mu[:, seg], t.cone_width, g)
    clean = (A[:, seg] @ k[..., None])[..., 0]
    v = clean + t.noise * torch.randn(clean.shape, generator=g)
    return {"k": k, "v": v, "clean": clean, "segment": seg.expand(n, -1), "A": A, "mu": mu}


# One matmul per region (or segment) instead of one per position reorders the float sums: the
# values y / v / clean agree to float rounding, everything else is bit for bit the same.
CLOSE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(params=["default", "small-pieces"])
def pieces(request, monkeypatch):
    """Default sizes, or draws taken 48 numbers at a time and chunks of one sequence."""
    if request.param == "small-pieces":
        monkeypatch.setattr(NormalStream, "piece", 48)
        monkeypatch.setattr(icl_regression, "CHUNK_FLOATS", 1)
    return request.param


def test_normal_stream_gives_the_whole_draws_numbers():
    for numel in (5, 16, 17, 40, 1000, 4099):
        for piece, take in ((16, 1), (48, 7), (64, 100), (1 << 20, 33)):
            g = torch.Generator().manual_seed(numel)
            whole, after = torch.randn(numel, generator=g), torch.rand(4, generator=g)
            g = torch.Generator().manual_seed(numel)
            s = NormalStream(g, numel)
            s.piece = piece
            got = torch.cat([s.take(min(take, numel - i)).clone() for i in range(0, numel, take)])
            assert torch.equal(got, whole), (numel, piece, take)
            assert torch.equal(torch.rand(4, generator=g), after), "the generator ends where the whole draw left it"
            g = torch.Generator().manual_seed(numel)
            later = replay(g, numel)
            assert torch.equal(torch.rand(4, generator=g), after), "replay moves the generator past the draw"
            assert torch.equal(later.take(numel), whole)


ICL = [dict(L=16, S=4, d_x=6, d_y=5, n_queries=3),
       dict(L=64, S=16, d_x=32, d_y=32, n_queries=16),
       dict(L=8, S=4, d_x=4, d_y=4, n_queries=2, noise=0.5, token_format="interleaved"),
       dict(L=8, S=4, d_x=4, d_y=4, n_queries=2, noise=0.5, noisy_train_queries=False),
       dict(L=32, S=32, d_x=3, d_y=7, n_queries=5, cone_width=0.0),
       dict(L=24, S=1, d_x=9, d_y=2, n_queries=4)]


@pytest.mark.parametrize("knobs", ICL)
def test_icl_regression_equals_the_gather_formula(knobs, pieces):
    t = tasks()["icl-regression"](**knobs)
    dx = t.d_x
    for split, n in (("train", 37), ("test", 5), ("val", 1)):
        inputs, targets, mask = _old_icl_generate(t, split, n, 5)
        b = t.generate(split, n, 5)
        assert torch.equal(b.inputs[..., :dx], inputs[..., :dx]), "x: bit for bit"
        assert torch.equal(b.targets, targets), "query targets: each query meets its map as before, bit for bit"
        assert torch.equal(b.mask, mask)
        torch.testing.assert_close(b.inputs, inputs, **CLOSE)       # the context's y, to rounding
        assert b.slices["num_segments"].tolist() == [t.L // t.S] * n
        old, new = _old_icl_sample(t, split, n, 5), t.sample(split, n, 5)
        assert set(new) == set(old)
        for k in ("x", "segment", "A", "mu"):
            assert torch.equal(new[k], old[k]), k
        for k in ("y", "clean"):
            torch.testing.assert_close(new[k], old[k], **CLOSE)
        assert torch.equal(new["y"][:, t.L:], old["y"][:, t.L:])


TTR = [dict(d=4, L=32, S=8), dict(d=32, L=64, S=16), dict(d=5, L=12, S=1, noise=0.0),
       dict(d=3, L=64, S=64, cone_width=0.0)]


@pytest.mark.parametrize("knobs", TTR)
def test_ttr_equals_the_gather_formula(knobs, pieces):
    t = tasks()["ttr"](**knobs)
    d = t.d
    for split, n in (("test", 23), ("val", 3), ("train", 1)):
        old, new = _old_ttr_sample(t, split, n, 2), t.sample(split, n, 2)
        assert set(new) == set(old)
        for k in ("k", "segment", "A", "mu"):
            assert torch.equal(new[k], old[k]), k
        for k in ("v", "clean"):
            torch.testing.assert_close(new[k], old[k], **CLOSE)
        b = t.generate(split, n, 2)
        assert torch.equal(b.inputs[..., :d], old["k"])
        torch.testing.assert_close(b.inputs[..., d:], old["v"], **CLOSE)
        torch.testing.assert_close(b.targets, old["clean"], **CLOSE)
        assert torch.equal(b.inputs, torch.cat([new["k"], new["v"]], -1)) and torch.equal(b.targets, new["clean"])
        assert b.mask.all() and b.slices["segment_len"].tolist() == [t.S] * n


def test_empty_request():
    for name, knobs in (("icl-regression", ICL[0]), ("ttr", TTR[0])):
        b = tasks()[name](**knobs).generate("train", 0, 0)
        assert b.inputs.shape[0] == b.targets.shape[0] == b.mask.shape[0] == 0


# -- peak memory, measured in a fresh process ------------------------------------------------
# CPU torch tensors live outside tracemalloc's view, so the peak is the growth of the process's
# peak resident set (VmHWM) over its value after the imports and a warm-up generate.
_PEAK = r"""
import json, sys
import torch
from mixzoo.registry import tasks

def hwm():   # this image's resident high-water mark; ru_maxrss would carry the forking parent's over exec
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

t = tasks()[sys.argv[1]](**json.loads(sys.argv[2]))
t.generate("train", 4, 0)
base = hwm()
b = t.generate("train", int(sys.argv[3]), 0)
peak = hwm() - base
out = sum(x.numel() * x.element_size() for x in (b.inputs, b.targets, b.mask, *b.slices.values()))
print(json.dumps({"out": out, "peak": peak}))
"""


@pytest.mark.parametrize("name,knobs", [("icl-regression", dict(L=256, S=64, d_x=32, d_y=32, n_queries=16)),
                                        ("ttr", dict(L=256, S=128, d=32))])
def test_peak_memory_within_twice_the_output(name, knobs):
    p = subprocess.run([sys.executable, "-c", _PEAK, name, json.dumps(knobs), "2000"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["out"] > 150e6                                   # about 200 MB, well above RSS noise
    assert r["peak"] >= 0.5 * r["out"], f"the measurement does not see the output: {r}"
    assert r["peak"] <= 2 * r["out"], f"peak {r['peak']:,} B for an output of {r['out']:,} B"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name,knobs", [("icl-regression", dict(L=256, S=64)), ("ttr", dict(L=256, S=128))])
def test_cuda_generation_peak_and_values(name, knobs):
    t = tasks()[name](**knobs)
    t.generate("train", 4, 0, "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    b = t.generate("train", 2000, 0, "cuda")
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    out = sum(x.numel() * x.element_size() for x in (b.inputs, b.targets, b.mask, *b.slices.values()))
    assert b.inputs.is_cuda and b.targets.is_cuda and b.mask.is_cuda
    assert peak <= 2 * out, f"device peak {peak:,} B for an output of {out:,} B"
    ref = t.generate("train", 2000, 0)
    torch.testing.assert_close(b.inputs.cpu(), ref.inputs, **CLOSE)
    torch.testing.assert_close(b.targets.cpu(), ref.targets, **CLOSE)
    assert torch.equal(b.mask.cpu(), ref.mask)
