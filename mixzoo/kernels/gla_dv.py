"""The value gradient of fla's chunked GLA backward (``fla.ops.gla.chunk.chunk_gla_bwd_dv``) as one
Triton kernel with tiles as narrow as the heads (``gla_dv_triton``).

Per chunk of BT positions, with A the forward's in-chunk scores (A[t, s], s <= t, decays and scale in
them), g the chunk-local cumulative log2-decays of the keys, dh the gradient of the state entering the
next chunk, and L the chunk's last position:

    dv_s = sum_{t >= s in the chunk} A[t, s] do_t + (k_s * 2^{g_L - g_s}) dh

fla's kernel tiles the value head at 64 or more and the key head at 32 or more on Hopper. At the mad
recipe's GLA (16 heads: keys of 4 and values of 8, zero-padded to 16 for fla) that is four times the
work of the in-chunk product, which fla computes in float32 FMA (no TF32, for its precision): on the H200
that one kernel was a fifth of a stacked GLA step at length 1024 (10.3 ms of 104.5, 2026-12-02 profile).
Here the tiles are the heads' widths (at least 16), in fla's precision: the in-chunk product in full
float32, the decayed keys and dh rounded to the keys' dtype for the tensor cores, float32 accumulation.

``install()`` registers it with fla's dispatcher for the 'gla' ops: it takes fla's calls that it handles
(fixed length, contiguous, chunks of 16 to 64, heads up to 128 wide) on a CUDA device (or Triton's
interpreter) where it has matched ``bwd_dv_torch`` (``usable``); any other call runs fla's kernel.
``MIXZOO_GLA_DV=fla`` leaves every call to fla. A run records ``gla_dv`` among its kernels when it ran.
Imports nothing of mixzoo.
"""
from __future__ import annotations

import functools
import os

import torch

from . import GLA_DV_IMPLS, switch_error
from ._check import DeviceCheck, interpreting

# the self-check's bound on the norm-relative error against float64: the output is rounded to bfloat16
# (about 1e-3), the state term's operands too, as fla's
TOLERANCE = 8e-3


def bwd_dv_torch(k, g, A, do, dh, chunk_size: int = 64, dtype=torch.float32):
    """The reference, computed in ``dtype`` with fla's roundings (the decayed keys and dh rounded to k's
    dtype): k, g (B, T, H, K); A (B, T, H, BT); do (B, T, H, V); dh (B, NT, H, K, V) -> (B, T, H, V) in
    ``dtype``."""
    B, T, H, K = k.shape
    V, BT = do.shape[-1], chunk_size
    NT = -(-T // BT)
    pad = NT * BT - T

    def chunks(t):
        t = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) if pad else t
        return t.reshape(B, NT, BT, H, t.shape[-1])
    last = torch.clamp(torch.arange(1, NT + 1, device=k.device) * BT, max=T) - 1
    gn = g[:, last].to(dtype)                                                  # (B, NT, H, K)
    kd = (chunks(k).to(dtype) * torch.exp2(gn.unsqueeze(2) - chunks(g).to(dtype))).to(k.dtype).to(dtype)
    tri = torch.ones(BT, BT, dtype=torch.bool, device=k.device).tril()         # [t, s]: s <= t
    Am = chunks(A).to(dtype).masked_fill(~tri.view(1, 1, BT, 1, BT), 0.)       # (B, NT, t, H, s)
    intra = torch.einsum("bnths,bnthv->bnshv", Am, chunks(do).to(dtype))
    inter = torch.einsum("bnshk,bnhkv->bnshv", kd, dh.to(k.dtype).to(dtype))
    return (intra + inter).reshape(B, NT * BT, H, V)[:, :T]


def impl() -> str:
    """``MIXZOO_GLA_DV`` (validated at the command line): triton (the default) or fla."""
    v = os.environ.get("MIXZOO_GLA_DV") or GLA_DV_IMPLS[0]
    if v not in GLA_DV_IMPLS:
        raise ValueError(switch_error())
    return v


def takes(k, g, A, do, dh, cu_seqlens=None, chunk_size: int = 64, state_v_first: bool = False) -> str | None:
    """Why the kernel does not take this call (None: it does)."""
    if impl() != "triton":
        return "MIXZOO_GLA_DV=fla"
    if cu_seqlens is not None or state_v_first:
        return "fixed-length calls with dh as (K, V) only"
    if not (k.is_cuda or interpreting()) or torch.compiler.is_compiling():
        return "not a CUDA tensor"
    if chunk_size not in (16, 32, 64) or k.shape[-1] > 128 or do.shape[-1] > 128:
        return f"chunk {chunk_size}, key {k.shape[-1]}, value {do.shape[-1]}: outside 16-64 / 128 / 128"
    if not all(t.is_contiguous() for t in (k, g, A, do, dh)) or g.dtype != torch.float32:
        return "non-contiguous inputs or g not float32"
    dev = (k.device.index or 0) if k.is_cuda else -1
    if not usable(k.shape[-1], do.shape[-1], chunk_size, dev):
        return "has not matched its reference on this device"
    return None


def bwd_dv(k, g, A, do, dh, cu_seqlens=None, chunk_size: int = 64, chunk_indices=None, state_v_first: bool = False):
    """fla's ``chunk_gla_bwd_dv`` signature, by the kernel (``takes`` checked by the caller)."""
    from . import RAN
    from . import gla_dv_triton as Kt
    RAN.add("gla_dv")
    return Kt.bwd_dv(k, g, A, do, dh, chunk_size)


def errors_here(K: int, V: int, BT: int, device_index: int) -> list[float]:
    """Norm-relative errors of the kernel against ``bwd_dv_torch`` in float64 on this device (-1: the
    interpreter) at key and value widths K, V and chunk BT: bfloat16 keys and output gradient as fla's
    calls have them, 2 sequences of 2 chunks and a part (T = 2 BT + 7), 3 heads; then float32 ones."""
    from . import gla_dv_triton as Kt
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    B, H, T = 2, 3, 2 * BT + 7
    NT = -(-T // BT)
    out = []
    for dt in (torch.bfloat16, torch.float32):
        k = torch.randn(B, T, H, K, generator=gen).to(dt)
        glog = -torch.rand(B, NT * BT, H, K, generator=gen) * 0.2
        g = glog.view(B, NT, BT, H, K).cumsum(2).view(B, NT * BT, H, K)[:, :T].contiguous()
        A = torch.randn(B, T, H, BT, generator=gen) * BT ** -0.5
        do = torch.randn(B, T, H, V, generator=gen).to(dt)
        dh = torch.randn(B, NT, H, K, V, generator=gen)
        want = bwd_dv_torch(k, g, A, do, dh, BT, dtype=torch.float64)
        got = Kt.bwd_dv(*(t.to(dev) for t in (k, g, A, do, dh)), BT)
        out.append(float((got.double().cpu() - want).norm() / want.norm()) if got.shape == want.shape else float("inf"))
    return out


def _matches_here(key: tuple[int, int, int, int]) -> bool:
    return max(errors_here(*key)) <= TOLERANCE


_USABLE = DeviceCheck(_matches_here)


def usable(K: int, V: int, BT: int = 64, device_index: int = 0) -> bool:
    """Whether the kernel gives ``bwd_dv_torch``'s numbers at these widths on this device (-1: the
    interpreter), checked once per (widths, device)."""
    return _USABLE((K, V, BT, device_index))


@functools.cache
def install() -> bool:
    """Register the kernel with fla's dispatcher for the 'gla' ops (before its own kernel, after a usable
    TileLang backend); it takes the calls ``takes`` accepts. Returns whether it is installed."""
    try:
        import fla.backends as fb
        import fla.ops.gla.chunk  # noqa: F401  (creates the 'gla' registry)
    except Exception:
        return False

    class MixzooGlaDv(fb.BaseBackend):
        backend_type = "mixzoo_gla_dv"
        priority = 6

        def chunk_gla_bwd_dv_verifier(self, k, g, A, do, dh, state_v_first=False, cu_seqlens=None,
                                      chunk_size=64, chunk_indices=None):
            why = takes(k, g, A, do, dh, cu_seqlens, chunk_size, state_v_first)
            return why is None, why

        def chunk_gla_bwd_dv(self, k, g, A, do, dh, state_v_first=False, cu_seqlens=None, chunk_size=64,
                             chunk_indices=None):
            return bwd_dv(k, g, A, do, dh, cu_seqlens, chunk_size, chunk_indices, state_v_first)

    fb.register("gla")(MixzooGlaDv)
    return True
