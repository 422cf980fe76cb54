"""How the attention and LLA kernels load a head of 8, from their PTX for the H200 (sm_90), compiled on this machine
without a GPU: the load instructions of one kernel, with its integer arguments specialized as Triton's launcher does
(1 becomes a constant, multiples of 16 are marked divisible by 16), for the strides its launcher passes at MAD's shape
(768 sequences, 16 heads of 8, length 1024).

A stride of 8 elements is not known to keep a row of 8 bf16 values 16-byte aligned, and the compiler then reads each
row element by element (ld.global.b16) with no cp.async pipelining; where the strides are known aligned the same rows
load as one 16-byte vector (ld.global.v4.b32) through cp.async. LLA's launchers pass their strides in units of the
rows' alignment since 2026-12-06 (``triton_lla._io_strides``; tests/test_kernels_compile.py holds it); the attention
kernels' launch (``kernels/attn.py``) too, by default (``MIXZOO_ATTN_STRIDES=plain`` passes them as they are).
Usage: python benchmarks/ptx_loads.py"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_kernels_compile import lla_launch, ptx_loads  # noqa: E402  (the tests' own launch arguments)


def attention_forward():
    from mixzoo.kernels import attn as AT
    from mixzoo.kernels import attn_triton as A
    H, T, D = 16, 1024, 8
    consts = dict(D=D, DP=AT.padded_dim(D), BM=AT.TILES["fwd"][0], BN=AT.TILES["fwd"][1])
    names = ["sqb", "sqh", "sqt", "skb", "skh", "skt", "svb", "svh", "svt"]
    cases = {
        # softmax's default: q, k from the rotation kernel, contiguous (B, H, T, 8); v a view of the projection
        "softmax's launch (q, k contiguous per head, v a view of qkv)":
            (H * T * D, T * D, D, H * T * D, T * D, D, T * 3 * H * D, D, 3 * H * D),
        "the same rows with strides in multiples of 16": (H * T * 16, T * 16, 16) * 3,
    }
    for aligned in (False, True):
        for name, st in cases.items():
            vec, st = AT.aligned_strides(st) if aligned else (1, list(st))
            c = ptx_loads(A._fwd_kernel, consts | dict(VEC=vec), dict(zip(names, st)) | dict(T=T, H=H), ("sc2",),
                          {"LSE": "*fp32"})
            print(f"attention forward, {name}{', MIXZOO_ATTN_STRIDES=aligned' if aligned else ''}: {dict(c)}")


if __name__ == "__main__":
    attention_forward()
    for kernel in ("fwd", "bwd_q", "bwd_kv"):
        for layout in ("padded", "contiguous", "strided"):
            print(f"lla {kernel}, heads {layout}: {dict(ptx_loads(*lla_launch(kernel, layout)))}")
