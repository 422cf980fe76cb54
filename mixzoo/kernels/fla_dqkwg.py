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

    def chunks(x):                        # (B, T, HV, X) -> (B, NT, HV, BT, X), zero padded
        if x.shape[1] != Tp:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, Tp - x.shape[1]))
        return x.reshape(B, NT, BT, x.shape[2], x.shape[3]).transpose(2, 3)

    rep = HV // H
    qh = q.repeat_interleave(rep, dim=2) if rep > 1 else q
    kh = k.repeat_interleave(rep, dim=2) if rep > 1 else k
    qc, kc = chunks(qh).to(f32), chunks(kh)
    vc, doc = chunks(v), chunks(do)
    if state_v_first:
        h, dh = h.transpose(-1, -2), dh.transpose(-1, -2)
    hh = h.to(cdt).to(f32)                                          # (B, NT, HV, K, V)
    dhh = dh.to(v.dtype).to(f32)

    gp = g.to(f32)
    if Tp != T:
        gp = torch.nn.functional.pad(gp, (0, 0, 0, Tp - T))
    gc = gp.reshape(B, NT, BT, HV).transpose(2, 3)                  # (B, NT, HV, BT)
    valid = (torch.arange(Tp, device=g.device) < T).reshape(NT, BT)[None, :, None, :]
    last = (torch.clamp(torch.arange(NT, device=g.device) * BT + BT, max=T) - 1) % BT
    g_last = gc.gather(-1, last.view(1, NT, 1, 1).expand(B, NT, HV, 1))  # (B, NT, HV, 1)

    vf, dof = vc.to(f32), doc.to(f32)
    dq = (dof @ hh.transpose(-1, -2)) * (gc.exp2() * scale).unsqueeze(-1)
    dk = vf @ dhh.transpose(-1, -2)
    dk = dk * torch.where(valid, (g_last - gc).exp2(), 0.0).unsqueeze(-1)
    kf = kc.to(f32)
    hdh = (h.to(f32) * dh.to(f32)).sum((-1, -2)).unsqueeze(-1)      # unrounded, as fla
    dg_last = hdh * g_last.exp2() + (dk * kf).sum((-1, -2)).unsqueeze(-1)

    ds = dof @ vf.transpose(-1, -2)                                 # (B, NT, HV, BT, BT)
    causal = torch.ones(BT, BT, dtype=torch.bool, device=g.device).tril()
    mask = causal & valid.unsqueeze(-1) & valid.unsqueeze(-2)
    ds = torch.where(mask, ds * (gc.unsqueeze(-1) - gc.unsqueeze(-2)).exp2(), 0.0) * scale
    ds = ds.to(k.dtype).to(f32)
    dq = dq + ds @ kf
    dk = dk + ds.transpose(-1, -2) @ qc
    dg = (dq * qc).sum(-1) - (dk * kf).sum(-1)                      # (B, NT, HV, BT)
    at_last = torch.arange(BT, device=g.device).view(1, 1, 1, BT) == last.view(1, NT, 1, 1)
    dg = dg + torch.where(at_last, dg_last, 0.0)

    def unchunk(x):                       # (B, NT, HV, BT, X) -> (B, T, HV, X)
        return x.transpose(2, 3).reshape(B, Tp, HV, x.shape[-1])[:, :T]

    dq, dk = unchunk(dq), unchunk(dk)
    if rep > 1:
        dq = dq.view(B, T, H, rep, K).sum(3)
        dk = dk.view(B, T, H, rep, K).sum(3)
    dw = None
    if w is not None:
        dw = -(chunks(dv).to(v.dtype).to(f32) @ hh.transpose(-1, -2))
        dw = unchunk(dw).to(w.dtype)
    dg = dg.transpose(2, 3).reshape(B, Tp, HV)[:, :T]
    # fla's later kernels index these as contiguous (B, T, H, K) arrays: a partial last chunk
    # leaves the [:, :T] slices strided, so copy them out
    return (dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(),
            None if dw is None else dw.contiguous(), dg.contiguous())


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
            return chunk_bwd_dqkwg_torch(*args, **kwargs)

    fb.register("common")(MixzooTorchDqkwg)
    return True
