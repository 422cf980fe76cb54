"""Steps of fla's chunked GLA (``fla.ops.gla.chunk``) as Triton kernels with tiles as narrow as the heads
(``gla_steps_triton``), each with a plain-PyTorch reference beside it.

Per chunk of BT positions, with g the chunk-local cumulative log2-decays of the keys, h the state entering the
chunk and dh the gradient of the state entering the next one, L the chunk's last position, σ the scale, A the
forward's in-chunk scores (A[t, s], s <= t, decays and scale in them):

- ``o`` (fla's ``chunk_gla_fwd_o_gk``), the output:  o_t = σ (q_t * 2^{g_t}) h + sum_{s <= t} A[t, s] v_s
- ``dv`` (fla's ``chunk_gla_bwd_dv``):  dv_s = sum_{t >= s in the chunk} A[t, s] do_t + (k_s * 2^{g_L - g_s}) dh
- ``dqkg`` (fla's ``chunk_gla_bwd_dqkg``), the state's parts added to the in-chunk dq, dk:
  dq_t += σ 2^{g_t} * (do_t hᵀ),  dk_s += 2^{g_L - g_s} * (v_s dhᵀ),  and the log-decays' gradient
  dg_t = sum_{s >= t in the chunk} (q_s * dq_s - k_s * dk_s) + 2^{g_L} * sum_v h * dh + sum_s dk_s^state * k_s

fla's kernels tile the value head at 64 or more and the key head at 32 or more on Hopper. At the mad recipe's
GLA (16 heads: keys of 4 and values of 8, zero-padded to 16 for fla) that is four to eight times the products: on
the H200 fla's dv kernel was a fifth of a stacked GLA step at length 1024 (10.3 ms of 104.5, 2026-12-02 profile),
its dqkg kernel 8 %, its output kernel 4 %. Here the tiles are the heads' widths (at least 16), in fla's
precision (``gla_steps_triton``).

``install()`` registers them with fla's dispatcher for the 'gla' ops: each takes fla's calls that it handles
(fixed length, contiguous, chunks of 16 to 64, heads up to 128 wide) on a CUDA device (or Triton's interpreter)
where it has matched its reference at those widths (``usable``); any other call runs fla's kernel. The switches
``MIXZOO_GLA_DV``, ``MIXZOO_GLA_DQKG`` and ``MIXZOO_GLA_O`` (``triton`` or ``fla``) pick per step; each defaults to
triton, after the H200 (dv: bit for bit fla's numbers, 1.16x a stacked GLA step; dqkg and o: their kernels 1.45x to
2.3x fla's, a stacked step 1.05x more; benchmarks/h200-2026-12-03d). A run records ``gla_dv`` / ``gla_dqkg`` /
``gla_o`` among its kernels when they ran. Imports nothing of mixzoo.
"""
from __future__ import annotations

import functools
import os

import torch

from . import GLA_SWITCHES, switch_error
from ._check import DeviceCheck, interpreting

STEPS = ("dv", "dqkg", "o")
# the self-check's bound on the norm-relative error against float64: outputs rounded to bfloat16 (about 1e-3)
# and products of bfloat16-rounded operands, as fla's
TOLERANCE = 8e-3


def _chunks(t, NT: int, BT: int):
    """(B, T, H, D) -> (B, NT, BT, H, D), zero-padded at the end."""
    pad = NT * BT - t.shape[1]
    t = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) if pad else t
    return t.reshape(t.shape[0], NT, BT, *t.shape[2:])


def _last(g, NT: int, BT: int):
    """g at each chunk's last position: (B, NT, H, K)."""
    return g[:, torch.clamp(torch.arange(1, NT + 1, device=g.device) * BT, max=g.shape[1]) - 1]


def bwd_dv_torch(k, g, A, do, dh, chunk_size: int = 64, dtype=torch.float32):
    """dv's reference, computed in ``dtype`` with fla's roundings (the decayed keys and dh rounded to k's
    dtype): k, g (B, T, H, K); A (B, T, H, BT); do (B, T, H, V); dh (B, NT, H, K, V) -> (B, T, H, V) in
    ``dtype``."""
    B, T, H, K = k.shape
    V, BT = do.shape[-1], chunk_size
    NT = -(-T // BT)
    gn = _last(g, NT, BT).to(dtype)
    kd = (_chunks(k, NT, BT).to(dtype) * torch.exp2(gn.unsqueeze(2) - _chunks(g, NT, BT).to(dtype))).to(k.dtype).to(dtype)
    tri = torch.ones(BT, BT, dtype=torch.bool, device=k.device).tril()         # [t, s]: s <= t
    Am = _chunks(A, NT, BT).to(dtype).masked_fill(~tri.view(1, 1, BT, 1, BT), 0.)       # (B, NT, t, H, s)
    intra = torch.einsum("bnths,bnthv->bnshv", Am, _chunks(do, NT, BT).to(dtype))
    inter = torch.einsum("bnshk,bnhkv->bnshv", kd, dh.to(k.dtype).to(dtype))
    return (intra + inter).reshape(B, NT * BT, H, V)[:, :T]


def bwd_dqkg_torch(q, k, v, h, g, do, dh, dq, dk, scale: float, chunk_size: int = 64, dtype=torch.float32):
    """dqkg's reference, computed in ``dtype`` with fla's roundings (h and dh rounded to the output gradient's and
    the values' dtypes before their products): q, k, g, dq, dk (B, T, H, K); v, do (B, T, H, V); h, dh
    (B, NT, H, K, V) -> dq, dk, dg (B, T, H, K) in ``dtype``."""
    B, T, H, K = k.shape
    BT = chunk_size
    NT = -(-T // BT)
    c = lambda t: _chunks(t, NT, BT).to(dtype)                               # noqa: E731
    gc, gn = c(g), _last(g, NT, BT).to(dtype)
    dgk = (h.to(dtype) * dh.to(dtype)).sum(-1) * torch.exp2(gn)                  # (B, NT, H, K)
    dqs = torch.einsum("bnthv,bnhkv->bnthk", c(do), h.to(do.dtype).to(dtype)) * scale * torch.exp2(gc)
    dks = torch.einsum("bnthv,bnhkv->bnthk", c(v), dh.to(v.dtype).to(dtype)) * torch.exp2(gn.unsqueeze(2) - gc)
    dgk = dgk + (dks * c(k)).sum(2)
    dq2, dk2 = dqs + c(dq), dks + c(dk)
    dg = c(q) * dq2 - c(k) * dk2
    dg = dg.flip(2).cumsum(2).flip(2) + dgk.unsqueeze(2)
    return tuple(t.reshape(B, NT * BT, H, K)[:, :T] for t in (dq2, dk2, dg))


def fwd_o_torch(q, v, g, A, h, scale: float, chunk_size: int = 64, dtype=torch.float32):
    """o's reference, computed in ``dtype`` with fla's roundings (the decayed queries, the state and the in-chunk
    scores rounded to the queries' and values' dtypes before their products): q, g (B, T, H, K); v (B, T, H, V);
    A (B, T, H, BT); h (B, NT, H, K, V) -> (B, T, H, V) in ``dtype``."""
    B, T, H, K = q.shape
    V, BT = v.shape[-1], chunk_size
    NT = -(-T // BT)
    c = lambda t: _chunks(t, NT, BT)                                         # noqa: E731
    qg = (c(q).float() * torch.exp2(c(g).float())).to(q.dtype).to(dtype)
    inter = torch.einsum("bnthk,bnhkv->bnthv", qg, h.to(q.dtype).to(dtype)) * scale
    tri = torch.ones(BT, BT, dtype=torch.bool, device=q.device).tril()         # [t, s]: s <= t
    Am = c(A).masked_fill(~tri.view(1, 1, BT, 1, BT), 0.).to(v.dtype).to(dtype)
    intra = torch.einsum("bnths,bnshv->bnthv", Am, c(v).to(dtype))
    return (inter + intra).reshape(B, NT * BT, H, V)[:, :T]


def impl(step: str) -> str:
    """The implementation asked for ``step`` (``MIXZOO_GLA_DV``, ``MIXZOO_GLA_DQKG``, ``MIXZOO_GLA_O``, validated at
    the command line): triton or fla, the first of the switch's values by default."""
    var = f"MIXZOO_GLA_{step.upper()}"
    v = os.environ.get(var) or GLA_SWITCHES[var][0]
    if v not in GLA_SWITCHES[var]:
        raise ValueError(switch_error())
    return v


def _refusal(step: str, tensors, K: int, V: int, cu_seqlens, chunk_size: int, state_v_first: bool) -> str | None:
    """Why the kernel of ``step`` does not take this call (None: it does)."""
    if impl(step) != "triton":
        return f"MIXZOO_GLA_{step.upper()}=fla"
    if cu_seqlens is not None or state_v_first:
        return "fixed-length calls with states as (K, V) only"
    first = tensors[0]
    if not (first.is_cuda or interpreting()) or torch.compiler.is_compiling():
        return "not a CUDA tensor"
    if chunk_size not in (16, 32, 64) or K > 128 or V > 128:
        return f"chunk {chunk_size}, key {K}, value {V}: outside 16-64 / 128 / 128"
    if not all(t.is_contiguous() for t in tensors):
        return "non-contiguous inputs"
    dev = (first.device.index or 0) if first.is_cuda else -1
    if not usable(step, K, V, chunk_size, dev):
        return "has not matched its reference on this device"
    return None


def takes_dv(k, g, A, do, dh, cu_seqlens=None, chunk_size: int = 64, state_v_first: bool = False) -> str | None:
    if g.dtype != torch.float32:
        return "g not float32"
    return _refusal("dv", (k, g, A, do, dh), k.shape[-1], do.shape[-1], cu_seqlens, chunk_size, state_v_first)


def takes_dqkg(q, k, v, h, g, do, dh, dq, dk, scale=None, cu_seqlens=None, chunk_size: int = 64,
               state_v_first: bool = False) -> str | None:
    if g.dtype != torch.float32 or scale is None:
        return "g not float32, or no scale given"
    return _refusal("dqkg", (q, k, v, h, g, do, dh, dq, dk), k.shape[-1], v.shape[-1], cu_seqlens, chunk_size,
                    state_v_first)


def takes_o(q, v, g, A, h, scale=None, state_v_first: bool = False, cu_seqlens=None, chunk_size: int = 64,
            use_graph: bool = False) -> str | None:
    if g.dtype != torch.float32 or scale is None or use_graph or v.shape[2] != q.shape[2]:
        return "g not float32, no scale, a graph's padded batch or grouped heads"
    return _refusal("o", (q, v, g, A, h), q.shape[-1], v.shape[-1], cu_seqlens, chunk_size, state_v_first)


def fwd_o(q, v, g, A, h, scale, state_v_first: bool = False, cu_seqlens=None, chunk_size: int = 64,
          chunk_indices=None, use_graph: bool = False):
    """fla's ``chunk_gla_fwd_o_gk`` signature, by the kernel (``takes_o`` checked by the caller)."""
    from . import RAN
    from . import gla_steps_triton as Kt
    RAN.add("gla_o")
    return Kt.fwd_o(q, v, g, A, h, scale, chunk_size)


def bwd_dv(k, g, A, do, dh, cu_seqlens=None, chunk_size: int = 64, chunk_indices=None, state_v_first: bool = False):
    """fla's ``chunk_gla_bwd_dv`` signature, by the kernel (``takes_dv`` checked by the caller)."""
    from . import RAN
    from . import gla_steps_triton as Kt
    RAN.add("gla_dv")
    return Kt.bwd_dv(k, g, A, do, dh, chunk_size)


def bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, scale=None, state_v_first: bool = False, cu_seqlens=None,
             chunk_size: int = 64, chunk_indices=None):
    """fla's ``chunk_gla_bwd_dqkg`` signature, by the kernel (``takes_dqkg`` checked by the caller)."""
    from . import RAN
    from . import gla_steps_triton as Kt
    RAN.add("gla_dqkg")
    return Kt.bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, scale, chunk_size)


def _inputs(step: str, K: int, V: int, BT: int, dt, gen):
    """Random inputs of ``step`` (as fla's calls have them: keys, values and output gradient in ``dt``, the rest
    float32): 2 sequences of 2 chunks and a part (T = 2 BT + 7), 3 heads."""
    B, H, T = 2, 3, 2 * BT + 7
    NT = -(-T // BT)
    r = lambda *s: torch.randn(*s, generator=gen)                            # noqa: E731
    glog = -torch.rand(B, NT * BT, H, K, generator=gen) * 0.2
    g = glog.view(B, NT, BT, H, K).cumsum(2).view(B, NT * BT, H, K)[:, :T].contiguous()
    if step == "dv":
        return dict(k=r(B, T, H, K).to(dt), g=g, A=r(B, T, H, BT) * BT ** -0.5, do=r(B, T, H, V).to(dt),
                    dh=r(B, NT, H, K, V))
    if step == "o":
        return dict(q=r(B, T, H, K).to(dt), v=r(B, T, H, V).to(dt), g=g, A=r(B, T, H, BT) * BT ** -0.5,
                    h=r(B, NT, H, K, V).to(dt))
    return dict(q=r(B, T, H, K).to(dt), k=r(B, T, H, K).to(dt), v=r(B, T, H, V).to(dt), h=r(B, NT, H, K, V),
                g=g, do=r(B, T, H, V).to(dt), dh=r(B, NT, H, K, V), dq=r(B, T, H, K), dk=r(B, T, H, K))


def errors_here(step: str, K: int, V: int, BT: int, device_index: int) -> list[float]:
    """Norm-relative errors of ``step``'s kernel against its reference in float64 on this device (-1: the
    interpreter) at key and value widths K, V and chunk BT, with bfloat16 inputs and then float32 ones (each of
    dqkg's three outputs)."""
    from . import gla_steps_triton as Kt
    dev = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for dt in (torch.bfloat16, torch.float32):
        x = _inputs(step, K, V, BT, dt, gen)
        d = {n: t.to(dev) for n, t in x.items()}
        if step == "dv":
            wants = [bwd_dv_torch(**x, chunk_size=BT, dtype=torch.float64)]
            gots = [Kt.bwd_dv(**d, chunk_size=BT)]
        elif step == "o":
            wants = [fwd_o_torch(**x, scale=K ** -0.5, chunk_size=BT, dtype=torch.float64)]
            gots = [Kt.fwd_o(**d, scale=K ** -0.5, chunk_size=BT)]
        else:
            wants = bwd_dqkg_torch(**x, scale=K ** -0.5, chunk_size=BT, dtype=torch.float64)
            gots = Kt.bwd_dqkg(**d, scale=K ** -0.5, chunk_size=BT)
        out += [float((a.double().cpu() - b).norm() / b.norm()) if a.shape == b.shape else float("inf")
                for a, b in zip(gots, wants)]
    return out


def _matches_here(key: tuple[str, int, int, int, int]) -> bool:
    return max(errors_here(*key)) <= TOLERANCE


_USABLE = DeviceCheck(_matches_here)


def usable(step: str, K: int, V: int, BT: int = 64, device_index: int = 0) -> bool:
    """Whether ``step``'s kernel gives its reference's numbers at these widths on this device (-1: the
    interpreter), checked once per (step, widths, device)."""
    return _USABLE((step, K, V, BT, device_index))


@functools.cache
def install() -> bool:
    """Register the kernels with fla's dispatcher for the 'gla' ops (before its own kernels, after a usable
    TileLang backend); each takes the calls its ``takes_*`` accepts. Returns whether they are installed."""
    try:
        import fla.backends as fb
        import fla.ops.gla.chunk  # noqa: F401  (creates the 'gla' registry)
    except Exception:
        return False

    class MixzooGlaSteps(fb.BaseBackend):
        backend_type = "mixzoo_gla_steps"
        priority = 6

        def chunk_gla_bwd_dv_verifier(self, k, g, A, do, dh, state_v_first=False, cu_seqlens=None,
                                      chunk_size=64, chunk_indices=None):
            why = takes_dv(k, g, A, do, dh, cu_seqlens, chunk_size, state_v_first)
            return why is None, why

        def chunk_gla_bwd_dv(self, k, g, A, do, dh, state_v_first=False, cu_seqlens=None, chunk_size=64,
                             chunk_indices=None):
            return bwd_dv(k, g, A, do, dh, cu_seqlens, chunk_size, chunk_indices, state_v_first)

        def chunk_gla_bwd_dqkg_verifier(self, q, k, v, h, g, do, dh, dq, dk, scale=None, state_v_first=False,
                                        cu_seqlens=None, chunk_size=64, chunk_indices=None):
            why = takes_dqkg(q, k, v, h, g, do, dh, dq, dk, scale, cu_seqlens, chunk_size, state_v_first)
            return why is None, why

        def chunk_gla_bwd_dqkg(self, q, k, v, h, g, do, dh, dq, dk, scale=None, state_v_first=False,
                               cu_seqlens=None, chunk_size=64, chunk_indices=None):
            return bwd_dqkg(q, k, v, h, g, do, dh, dq, dk, scale, state_v_first, cu_seqlens, chunk_size,
                            chunk_indices)

        def chunk_gla_fwd_o_gk_verifier(self, q, v, g, A, h, scale, state_v_first=False, cu_seqlens=None,
                                        chunk_size=64, chunk_indices=None, use_graph=False):
            why = takes_o(q, v, g, A, h, scale, state_v_first, cu_seqlens, chunk_size, use_graph)
            return why is None, why

        def chunk_gla_fwd_o_gk(self, q, v, g, A, h, scale, state_v_first=False, cu_seqlens=None, chunk_size=64,
                               chunk_indices=None, use_graph=False):
            return fwd_o(q, v, g, A, h, scale, state_v_first, cu_seqlens, chunk_size, chunk_indices, use_graph)

    fb.register("gla")(MixzooGlaSteps)
    return True


def suffix(K: int, V: int, device_index: int) -> str:
    """The backend-name suffix for GLA's fla path with heads of K, V (fla's chunk of 64) on this device:
    ``+triton-`` and the steps whose kernels take its calls (``+triton-dv``, ``+triton-dv-dqkg-o``, ...), else
    ``""``."""
    if not install():
        return ""
    on = [s for s in STEPS if impl(s) == "triton" and usable(s, K, V, 64, device_index)]
    return "+triton-" + "-".join(on) if on else ""
