"""The one step of fla's gated chunk backward that Triton 3.4..3.7.0 miscompiles on Hopper.

fla's chunked gated delta rule (and simple GLA) computes, in its backward, the per-chunk
gradients of q, k, the WY keys w and the chunk-local log decay g from the saved chunk states h and
their gradients dh (``fla.ops.common.chunk_o.chunk_bwd_dqkwg``). On Hopper GPUs with Triton
>= 3.4, < 3.7.1 that one Triton kernel gives wrong results, and fla raises instead of running it;
every other kernel of the backward is fine there. Here the same step is written as batched
PyTorch matmuls over all chunks at once (no sequential dependence: h and dh are already
materialized per chunk), and :func:`install` registers it as an fla dispatch backend used only
where fla's own kernel is refused. All of fla's other kernels keep running.

Per chunk c with positions t, s (s <= t), last valid position L, decay g (log2 units, cumulated
inside the chunk), scale σ, state h (K x V) and its gradient dh:

    dq_t = σ·2^{g_t}·(do_t h^T) + σ·Σ_{s<=t} 2^{g_t-g_s} (do_t·v_s) k_s
    dk_s = 2^{g_L-g_s}·(v_s dh^T)  + σ·Σ_{t>=s} 2^{g_t-g_s} (do_t·v_s) q_t
    dw_t = -(dv_t h^T)
    dg_t = q_t·dq_t - k_t·dk_t  (+ 2^{g_L}·<h, dh> + Σ_s k_s·2^{g_L-g_s}(v_s dh^T) at t = L)

which is the gradient of the chunk output and of the next chunk state with respect to the
natural-log decay (the ln 2 of exp2 cancels the 1/ln 2 fla folds into g). Sums are in float32,
with the in-chunk score matrix rounded to the input dtype before its two matmuls as fla does.
"""
from __future__ import annotations

import functools

import torch


def chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None,
                          state_v_first=False, cu_seqlens=None, chunk_size=64, chunk_indices=None):
    """Drop-in for fla's ``chunk_bwd_dqkwg`` (gated case, fixed-length batches).

    q, k: (B, T, H, K); v, do, dv: (B, T, HV, V); w: (B, T, HV, K) or None; g: (B, T, HV) float32;
    h, dh: (B, NT, HV, K, V) (``state_v_first``: (.., V, K)). Returns dq, dk (B, T, H, K), dw or
    None, dg (B, T, HV) float32, in fla's dtypes."""
    if g is None or g_gamma is not None or cu_seqlens is not None:
        raise ValueError("chunk_bwd_dqkwg_torch: only the gated (g), fixed-length case")
    # fla runs its backward under the forward's autocast state (custom_bwd): bf16 autocast would
    # turn the float32 matmuls below into bf16 ones with bf16 outputs, and dg = q·dq - k·dk is a
    # difference of such products
    with torch.autocast(q.device.type, enabled=False):
        return _dqkwg(q, k, v, do, h, dh, w, g, dv, scale, state_v_first, chunk_size)


def _index(T: int, BT: int, device: torch.device):
    # not cached while a CUDA graph is being captured: tensors made then live in the graph's pool
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _make_index.__wrapped__(T, BT, device)
    return _make_index(T, BT, device)


@functools.lru_cache(maxsize=64)
def _make_index(T: int, BT: int, device: torch.device):
    """The chunk layout's constant masks and indices, made once per (length, chunk, device): on a
    GPU each would be a kernel launch per call, and this step is launch-bound at small shapes.
    (NT,) index of each chunk's last valid position; (NT, BT) validity; (NT, BT, BT) causal and
    valid pairs; (NT, BT) whether a position is its chunk's last."""
    NT = -(-T // BT)
    valid = (torch.arange(NT * BT, device=device) < T).reshape(NT, BT)
    last = (torch.clamp(torch.arange(NT, device=device) * BT + BT, max=T) - 1) % BT
    causal = torch.ones(BT, BT, dtype=torch.bool, device=device).tril()
    mask = causal & valid.unsqueeze(-1) & valid.unsqueeze(-2)
    at_last = torch.arange(BT, device=device).view(1, BT) == last.view(NT, 1)
    return last, valid, mask, at_last


def _dqkwg(q, k, v, do, h, dh, w, g, dv, scale, state_v_first, chunk_size):
    B, T, H, K = k.shape
    HV = v.shape[2]
    BT = chunk_size
    NT = -(-T // BT)
    Tp = NT * BT
    if scale is None:
        scale = K ** -0.5
    f32 = torch.float32
    cdt = do.dtype                        # fla's matmul operand dtype
    dense = torch.contiguous_format

    def chunks(x):                        # (B, T, HV, X) -> (B, NT, HV, BT, X), zero padded (a view if T = Tp)
        if x.shape[1] != Tp:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, Tp - x.shape[1]))
        return x.reshape(B, NT, BT, x.shape[2], x.shape[3]).transpose(2, 3)

    def f32_chunks(x):                    # the float32 copy, made dense in the chunk layout in one kernel
        return chunks(x).to(f32, memory_format=dense)

    rep = HV // H
    qh = q.repeat_interleave(rep, dim=2) if rep > 1 else q
    kh = k.repeat_interleave(rep, dim=2) if rep > 1 else k
    qc, kf = f32_chunks(qh), f32_chunks(kh)
    vf, dof = f32_chunks(v), f32_chunks(do)
    if state_v_first:
        h, dh = h.transpose(-1, -2), dh.transpose(-1, -2)
    hh = h.to(cdt).to(f32)                                          # (B, NT, HV, K, V)
    dhh = dh.to(v.dtype).to(f32)
    # <h, dh> unrounded, as fla: h as given (hh is that when h is already in cdt), dh in float32
    hdh = ((hh if h.dtype == cdt else h.to(f32)) * dh.to(f32)).sum((-1, -2)).unsqueeze(-1)

    gp = g.to(f32)
    if Tp != T:
        gp = torch.nn.functional.pad(gp, (0, 0, 0, Tp - T))
    gc = gp.reshape(B, NT, BT, HV).transpose(2, 3).contiguous()     # (B, NT, HV, BT)
    last, valid, mask, at_last = _index(T, BT, g.device)
    g_last = gc.gather(-1, last.view(1, NT, 1, 1).expand(B, NT, HV, 1))  # (B, NT, HV, 1)

    dq = (dof @ hh.transpose(-1, -2)) * (gc.exp2() * scale).unsqueeze(-1)
    dk = vf @ dhh.transpose(-1, -2)
    decay = (g_last - gc).exp2()
    if Tp != T:
        decay = torch.where(valid.view(1, NT, 1, BT), decay, 0.0)
    dk = dk * decay.unsqueeze(-1)
    dg_last = hdh * g_last.exp2() + (dk * kf).sum((-1, -2)).unsqueeze(-1)

    ds = dof @ vf.transpose(-1, -2)                                 # (B, NT, HV, BT, BT)
    ds = torch.where(mask.view(1, NT, 1, BT, BT), ds * (gc.unsqueeze(-1) - gc.unsqueeze(-2)).exp2(), 0.0) * scale
    ds = ds.to(k.dtype).to(f32)
    dq = dq + ds @ kf
    dk = dk + ds.transpose(-1, -2) @ qc
    dg = (dq * qc).sum(-1) - (dk * kf).sum(-1)                      # (B, NT, HV, BT)
    dg = dg + torch.where(at_last.view(1, NT, 1, BT), dg_last, 0.0)

    def unchunk(x, dtype):                # (B, NT, HV, BT, X) -> (B, T, HV, X) in dtype, dense: one copy
        out = torch.empty(B, NT, BT, HV, x.shape[-1], dtype=dtype, device=x.device)
        out.copy_(x.transpose(2, 3))
        out = out.view(B, Tp, HV, x.shape[-1])
        # fla's later kernels index these as contiguous (B, T, H, K) arrays: a partial last chunk
        # leaves the [:, :T] slice strided, so copy it out
        return out if Tp == T else out[:, :T].contiguous()

    if rep > 1:
        dq = unchunk(dq, f32).view(B, T, H, rep, K).sum(3).to(q.dtype)
        dk = unchunk(dk, f32).view(B, T, H, rep, K).sum(3).to(k.dtype)
    else:
        dq, dk = unchunk(dq, q.dtype), unchunk(dk, k.dtype)
    dw = None
    if w is not None:
        dw = unchunk(-(chunks(dv).to(v.dtype).to(f32, memory_format=dense) @ hh.transpose(-1, -2)), w.dtype)
    dg = unchunk(dg.unsqueeze(-1), f32).view(B, T, HV)
    return dq, dk, dw, dg


# The Triton kernel by default (where it has matched this step on the device, else this step): on an
# H200 at the mad recipe's layer (16 heads, batch 128, length 128) gdn's forward+backward took 1.55 ms
# with it against 2.35 ms with this step as one CUDA graph, and 5.49 against 6.61 ms eagerly.
DEFAULT_IMPL = "triton"


def impl() -> str:
    """Which implementation of this step is asked for: ``MIXZOO_DQKWG`` = torch | triton (mixzoo's
    one-launch Triton kernel, ``mixzoo.kernels.fla_dqkwg_triton``, on a CUDA device where it matches
    this PyTorch version at the call's sizes, else this version); default ``DEFAULT_IMPL`` (triton)."""
    import os
    v = os.environ.get("MIXZOO_DQKWG", DEFAULT_IMPL)
    return v if v in ("torch", "triton") else DEFAULT_IMPL


_FAILED: set[tuple[int, int, int]] = set()      # (K, V, chunk) where the Triton kernel raised


def triton_ok(K: int = 16, V: int = 32, BT: int = 64) -> bool:
    """Whether the Triton kernel runs for calls of these sizes here (CUDA, allowed, and matching)."""
    if impl() == "torch" or not torch.cuda.is_available() or (K, V, BT) in _FAILED:
        return False
    try:
        from . import fla_dqkwg_triton as tri
    except Exception:
        return False
    return tri.usable(K, V, BT, torch.cuda.current_device())


def chunk_bwd_dqkwg_any(q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None,
                        state_v_first=False, cu_seqlens=None, chunk_size=64, chunk_indices=None):
    """The Triton kernel where it takes the call and has matched this step here, else this step."""
    if q.is_cuda and triton_ok(k.shape[-1], v.shape[-1], chunk_size):
        from . import fla_dqkwg_triton as tri
        if tri.supported(q, k, v, h, w=w, g=g, g_gamma=g_gamma, state_v_first=state_v_first,
                         cu_seqlens=cu_seqlens):
            try:
                return tri.chunk_bwd_dqkwg_triton(q, k, v, do, h, dh, w=w, g=g, dv=dv, scale=scale,
                                                  chunk_size=chunk_size)
            except Exception as e:     # compile or launch resources at this size: the PyTorch step, from now on
                import warnings
                _FAILED.add((k.shape[-1], v.shape[-1], chunk_size))
                warnings.warn(f"mixzoo Triton dqkwg failed ({type(e).__name__}: {e}); using the PyTorch step",
                              stacklevel=2)
    return chunk_bwd_dqkwg_torch(q, k, v, do, h, dh, w=w, g=g, g_gamma=g_gamma, dv=dv, scale=scale,
                                 state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                                 chunk_size=chunk_size, chunk_indices=chunk_indices)


@functools.cache
def triton_refused() -> bool:
    """Whether fla refuses its gated chunk_bwd_dqkwg here (Hopper, 3.4.0 <= Triton < 3.7.1)."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton
        from packaging.version import Version
        v = Version(triton.__version__.split("+")[0])
    except Exception:
        return False
    hopper = torch.cuda.get_device_capability()[0] == 9
    return hopper and Version("3.4.0") <= v < Version("3.7.1")


@functools.cache
def install() -> bool:
    """Register :func:`chunk_bwd_dqkwg_torch` with fla's dispatcher for the 'common' ops, enabled
    only where fla refuses its own kernel and only for calls it handles (gated, fixed length).
    A usable tilelang backend, if installed, keeps precedence. Returns whether it is installed."""
    try:
        import fla.backends as fb
        import fla.ops.common.chunk_o  # noqa: F401  (creates the 'common' registry)
    except Exception:
        return False

    class MixzooTorchDqkwg(fb.BaseBackend):
        backend_type = "mixzoo_torch"
        priority = 6                       # after tilelang (5)

        def is_enabled(self) -> bool:
            return triton_refused()

        def chunk_bwd_dqkwg_verifier(self, q, k, v, do, h, dh, w=None, g=None, g_gamma=None,
                                     dv=None, scale=None, state_v_first=False, cu_seqlens=None,
                                     chunk_size=64, chunk_indices=None):
            if g is None or g_gamma is not None:
                return False, "mixzoo torch dqkwg: gated case only"
            if cu_seqlens is not None:
                return False, "mixzoo torch dqkwg: fixed-length batches only"
            return True, None

        def chunk_bwd_dqkwg(self, *args, **kwargs):
            return chunk_bwd_dqkwg_any(*args, **kwargs)

    fb.register("common")(MixzooTorchDqkwg)
    return True
