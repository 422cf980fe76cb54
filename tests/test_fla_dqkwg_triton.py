"""mixzoo's one-launch Triton kernel for fla's gated chunk_bwd_dqkwg step, on the CPU: in the Triton
interpreter with the H200's numerics (benchmarks/lla_small_ridge.py: bf16 products accumulated in
float32, round-to-nearest casts), against the PyTorch stand-in it replaces on a GPU
(mixzoo.kernels.fla_dqkwg), at the head and chunk sizes the zoo produces, with and without w, with a
partial last chunk. The interpreter is switched on before triton is imported: a fresh process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, math, sys
sys.path.insert(0, {bench!r}); sys.path.insert(0, {root!r})
import lla_small_ridge as L            # sets TRITON_INTERPRET=1 before triton is imported
import torch
L.emulate_gpu_numerics()
from mixzoo.kernels.fla_dqkwg import chunk_bwd_dqkwg_torch
from mixzoo.kernels import fla_dqkwg_triton as tri
out = {{"cases": [], "usable": tri.usable(16, 32, 64)}}
g0 = torch.Generator().manual_seed(0)
for (B, T, H, K, V, BT, with_w) in {cases!r}:
    NT = -(-T // BT)
    bf = torch.bfloat16
    r = lambda *s: torch.randn(*s, generator=g0)
    q, k, w = (torch.nn.functional.normalize(r(B, T, H, K), dim=-1).to(bf) for _ in range(3))
    v, do, dv = (r(B, T, H, V).to(bf) for _ in range(3))
    h, dh = r(B, NT, H, K, V).to(bf), r(B, NT, H, K, V)
    g = torch.cat([(-torch.rand(B, BT, H, generator=g0) * 0.3).cumsum(1) for _ in range(NT)], 1)[:, :T] / math.log(2)
    kw = dict(w=w, dv=dv) if with_w else {{}}
    assert tri.supported(q, k, v, h, g=g, **({{"w": w}} if with_w else {{}}))
    want = chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, g=g, chunk_size=BT, **kw)
    got = tri.chunk_bwd_dqkwg_triton(q, k, v, do, h, dh, g=g, chunk_size=BT, **kw)
    res = []
    for a, b in zip(got, want):
        if b is None:
            res.append(None if a is None else "extra")
            continue
        res.append([str(a.dtype) == str(b.dtype), list(a.shape) == list(b.shape), a.is_contiguous(),
                    float((a.float() - b.float()).norm() / b.float().norm())])
    out["cases"].append(res)
print("RESULT", json.dumps(out))
"""

CASES = [(2, 100, 2, 16, 32, 64, True),     # gdn-like, partial last chunk
         (1, 128, 3, 16, 16, 64, True),     # the mad recipe's padded heads
         (2, 128, 2, 64, 64, 64, False),    # Mamba-2 on fla: d_state 64, value heads padded to 64
         (1, 37, 2, 64, 16, 16, True)]      # one partial chunk, a small chunk size


def test_matches_the_pytorch_step_in_the_interpreter():
    code = SCRIPT.format(bench=str(ROOT / "benchmarks"), root=str(ROOT), cases=CASES)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
    assert r["usable"] is True
    for case, res in zip(CASES, r["cases"]):
        for name, x in zip(("dq", "dk", "dw", "dg"), res):
            if name == "dw" and not case[-1]:
                assert x is None, (case, name)
                continue
            same_dtype, same_shape, dense, err = x
            assert same_dtype and same_shape and dense, (case, name, x)
            # the same bf16 products summed in another order: dq, dk, dw round to the same bf16,
            # dg (float32) differs by float32 reordering (observed <= 2e-7)
            assert err < 1e-5, (case, name, err)


def test_routing_on_a_machine_without_cuda(monkeypatch):
    import math

    import torch

    from mixzoo.kernels import fla_dqkwg as f
    monkeypatch.setenv("MIXZOO_DQKWG", "bogus")
    assert f.impl() == f.DEFAULT_IMPL == "triton"
    monkeypatch.setenv("MIXZOO_DQKWG", "torch")
    assert f.impl() == "torch" and not f.triton_ok()
    monkeypatch.delenv("MIXZOO_DQKWG")
    if not torch.cuda.is_available():
        assert not f.triton_ok()
    # CPU tensors always take the PyTorch step, with its numbers
    g0 = torch.Generator().manual_seed(1)
    B, T, H, K, V, BT = 1, 70, 2, 16, 16, 64
    q, k = (torch.randn(B, T, H, K, generator=g0).bfloat16() for _ in range(2))
    v, do = (torch.randn(B, T, H, V, generator=g0).bfloat16() for _ in range(2))
    h, dh = torch.randn(B, 2, H, K, V, generator=g0).bfloat16(), torch.randn(B, 2, H, K, V, generator=g0)
    g = torch.cat([(-torch.rand(B, BT, H, generator=g0) * 0.3).cumsum(1) for _ in range(2)], 1)[:, :T] / math.log(2)
    a = f.chunk_bwd_dqkwg_any(q, k, v, do, h, dh, g=g, chunk_size=BT)
    b = f.chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, g=g, chunk_size=BT)
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))


UNDER_VMAP = r"""
import json, sys
sys.path.insert(0, {bench!r}); sys.path.insert(0, {root!r})
import lla_small_ridge as L
import torch
L.emulate_gpu_numerics()
from mixzoo.kernels import fla_dqkwg_triton as tri
seen = []
def layer(x):                       # a layer's forward asks for the check, as gdn's does, under vmap
    seen.append(tri.usable(16, 16, 64))
    return x * 2
torch.func.vmap(layer, randomness="error")(torch.randn(2, 3))
print("RESULT", json.dumps({{"under_vmap": seen, "after": tri.usable(16, 16, 64)}}))
"""


def test_the_self_check_answers_the_same_under_vmap():
    """Stacked training runs a layer's forward, where the check is asked for, under torch.func.vmap;
    there its random inputs were refused, the check answered False and that answer was kept, so a
    fresh stacked worker on the H200 ran gdn's backward on the PyTorch step (the packed stacked cells
    of bench throughput: fla-chunk+torch-dqkwg)."""
    code = UNDER_VMAP.format(bench=str(ROOT / "benchmarks"), root=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
    assert r == {"under_vmap": [True], "after": True}, r
