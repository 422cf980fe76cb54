"""Chunked linear recurrences in plain PyTorch: the reference paths of the recurrent mechanisms
and their GPU path where fla's kernels cannot run. Layout (B, H, T, D), head-first.

* ``simple_gla_chunk``: o_t = scale Σ_{s<=t} (Π_{s<l<=t} a_l) (q_t·k_s) v_s with a scalar decay
  a_t = exp(g_t) per (batch, head, position), optionally signed (``neg``: a_t < 0 there, for
  eigenvalues in (-1, 1)). Fully parallel: intra-chunk masked products, then chunk states
  passed along with one (N x N) decay matrix over the N chunks. Covers linear attention (g = 0)
  and Mamba-2 (q = C, k = B dt, v = x, g = A dt); for Mamba-2, whose B and C are shared by the
  heads, q and k may have one head that every head shares and the per-head dt comes as
  ``k_scale``, so that no per-head copy of them is made (Mamba-2's SSD form).
* ``gated_delta_chunk``: the gated delta rule S_t = a_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ
  (state written as V x K here), o_t = scale S_t q_t. Within a chunk the updates are folded with
  one unit-lower-triangular solve (the WY/UT form); across chunks a short loop of three fused
  matmuls per chunk carries the state.
* ``*_recurrent``: step-by-step loops, the oracles for tests.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import _fla


def _no_autocast(fn):
    """Run ``fn`` with autocast off, so that its float32 matmuls stay float32 under bf16 autocast."""
    @functools.wraps(fn)
    def wrapped(q, *args, **kwargs):
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)
    return wrapped


def _chunked(x: torch.Tensor, C: int, pad_value: float = 0.0) -> torch.Tensor:
    """(B, H, T, ...) -> (B, H, N, C, ...), zero-padding T to a multiple of C."""
    T = x.shape[2]
    Tp = -(-T // C) * C
    if Tp != T:
        pad = [0, 0] * (x.dim() - 3) + [0, Tp - T]
        x = F.pad(x, pad, value=pad_value)
    return x.unflatten(2, (Tp // C, C))


def _sign_from_parity(p: torch.Tensor) -> torch.Tensor:
    return 1.0 - 2.0 * torch.remainder(p, 2)


@_no_autocast
def simple_gla_chunk(q, k, v, g, *, scale: float = 1.0, neg: torch.Tensor | None = None,
                     chunk: int = 64, k_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q, k: (B, H, T, K) or (B, 1, T, K) shared by the heads; v: (B, H, T, V); g: (B, H, T)
    log-magnitude of the decay (<= 0); neg: optional bool (B, H, T), True where the decay is
    negative; k_scale: optional (B, H, T), key s of head h scaled by k_scale[b, h, s]. Returns
    (B, H, T, V) in q's dtype, computed in float32 (float64 for float64 inputs).

    Diagonal scalings are applied to the smaller side of each product (the chunk's scores, the
    value rows, the output rows), never to a per-head copy of q or k; with shared q and k the
    heads are folded into the columns of the state products ((K x C)(C x H·V) per chunk), so that
    no product broadcasts q or k over the heads (a broadcast matmul copies its operand per head)."""
    B, H, T, _ = v.shape
    V = v.shape[-1]
    shared = q.shape[1] == 1 and k.shape[1] == 1 and H > 1
    dt = q.dtype
    C = max(1, min(chunk, T))
    cdt = torch.float64 if dt == torch.float64 else torch.float32
    q, k, v, g = (t.to(cdt) for t in (q, k, v, g))
    qc, kc, vc = _chunked(q, C), _chunked(k, C), _chunked(v, C)
    ks = None if k_scale is None else _chunked(k_scale.to(cdt).unsqueeze(-1), C).squeeze(-1)   # (B, H, N, C)
    gc = _cumsum_last(_chunked(g.unsqueeze(-1), C).squeeze(-1))          # (B, H, N, C)
    if shared and neg is None and ks is not None:
        o = _ssd_shared(qc[:, 0], kc[:, 0], vc, gc, ks)
        return (o if scale == 1.0 else o * scale)[:, :, :T].to(dt)
    N = gc.shape[2]
    last = gc[..., -1:]                                                  # (B, H, N, 1)
    to_end = (last - gc).exp()                                           # decay s -> chunk end
    from_start = gc.exp()                                                # decay chunk start -> t
    chunk_decay = last.squeeze(-1)                                       # (B, H, N)
    if neg is not None:
        p = _chunked(neg.to(torch.int64).unsqueeze(-1), C).squeeze(-1).cumsum(-1)
        to_end = to_end * _sign_from_parity(p[..., -1:] - p)
        from_start = from_start * _sign_from_parity(p)
        chunk_par = p[..., -1]
    tri = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    L = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~tri, float("-inf")).exp()   # (B, H, N, C, C)
    if neg is not None:
        L = L * _sign_from_parity(p.unsqueeze(-1) - p.unsqueeze(-2))
    if ks is not None:
        L = L * ks.unsqueeze(-2)                                         # column s scaled by k_scale_s
    o = ((qc @ kc.transpose(-1, -2)) * L) @ vc                           # intra-chunk
    if ks is not None:
        to_end = to_end * ks
    if N > 1:
        # chunk n reads the states of chunks m < n: the last chunk's state is never read, so states are
        # formed for chunks 0..N-2 and the carried state added to chunks 1..N-1 only
        w = vc[:, :, :-1] * to_end[:, :, :-1].unsqueeze(-1)              # (B, H, N-1, C, V)
        if shared:                                                       # (B, N-1, K, H, V)
            states = (kc[:, 0, :-1].transpose(-1, -2) @ w.permute(0, 2, 3, 1, 4).flatten(3)).unflatten(-1, (H, V))
        else:
            states = kc[:, :, :-1].transpose(-1, -2) @ w                 # (B, H, N-1, K, V)
        if N == 2:
            enter = states                      # the one carried state, chunk 0's, enters chunk 1 undecayed
        else:
            cum = chunk_decay.cumsum(-1)                                 # (B, H, N)
            # state entering chunk n (1..N-1) = Σ_{m<n} (decay of chunks m+1..n-1) states_m
            dm = (cum[..., 1:, None] - chunk_decay[..., 1:, None]) - cum[..., None, :-1]
            upto = torch.ones(N - 1, N - 1, dtype=torch.bool, device=q.device).tril()
            M = dm.masked_fill(~upto, float("-inf")).exp()               # (B, H, N-1, N-1)
            if neg is not None:
                cp = chunk_par.cumsum(-1)
                M = M * _sign_from_parity((cp - chunk_par)[..., 1:, None] - cp[..., None, :-1])
            eq = "bhnm,bmkhv->bnkhv" if shared else "bhnm,bhmkv->bhnkv"
            enter = torch.einsum(eq, M, states)
        if shared:                                                       # (B, H, N-1, C, V)
            inter = (qc[:, 0, 1:] @ enter.flatten(3)).unflatten(-1, (H, V)).permute(0, 3, 1, 2, 4)
        else:
            inter = qc[:, :, 1:] @ enter
        o = torch.cat((o[:, :, :1], o[:, :, 1:] + inter * from_start[:, :, 1:].unsqueeze(-1)), dim=2)
    o = o.flatten(2, 3)[:, :, :T]
    return (o if scale == 1.0 else o * scale).to(dt)


def _ssd_shared(q, k, vc, gc, ks):
    """Mamba-2's SSD form of ``simple_gla_chunk``: q, k (B, N, C, K) shared by the heads, vc (B, H, N, C, V)
    (any strides: Mamba-2 passes a view of (B, T, H, V) memory), gc (B, H, N, C) the cumulative log-decays
    within each chunk, ks (B, H, N, C) the key scales (dt). Returns (B, H, N·C, V) whose memory is
    (B, N·C, H, V), Mamba-2's own layout.

    Within the chunks: ``mixzoo.kernels.ssd_intra`` (its kernels on a GPU, reading the values in place).
    Between them, in that layout, where every per-head scaling broadcasts over a (C, H, V) or (K, H, V)
    block and the heads sit in the columns of each product: chunk n's state k[n]ᵀ (u[n] v[n]) (K x H·V,
    u_s = exp(g_last - g_s) ks_s), the state entering each chunk carried along them (``carry_states``),
    then q[n] S_n, scaled by exp(g_t) and added to the within-chunk part. No permuted copies, no
    concatenation."""
    B, H, N, C, V = vc.shape
    o = _fla._op("mixzoo.kernels.ssd_intra", "intra")(q, k, vc, gc, ks)     # folded when stacking
    tm = lambda t: t.permute(0, 2, 3, 1).unsqueeze(-1)                    # (B, H, N, C) -> (B, N, C, H, 1)
    if N == 1:
        return o.flatten(2, 3)
    last = gc[..., -1:]
    u = (last - gc).exp() * ks                                           # (B, H, N, C)
    vt = vc.permute(0, 2, 3, 1, 4)                                       # (B, N, C, H, V), a view
    w = (vt[:, :-1] * tm(u)[:, :-1]).flatten(3)                          # (B, N-1, C, H·V)
    states = (k[:, :-1].transpose(-1, -2) @ w).unflatten(-1, (H, V))      # (B, N-1, K, H, V)
    decay = tm(last.exp())                                               # (B, N, 1, H, 1): exp(g_last[n])
    enter = _fla._op("mixzoo.models._scan", "carry_states")(states, decay[:, :-1])   # (B, N, K, H, V)
    inter = (q @ enter.flatten(3)).unflatten(-1, (H, V))                 # (B, N, C, H, V)
    y = torch.addcmul(o.permute(0, 2, 3, 1, 4), inter, tm(gc.exp()))
    return y.flatten(1, 2).transpose(1, 2)


def _cumsum_last(x: torch.Tensor) -> torch.Tensor:
    """The cumulative sum along the last (short: a chunk's) dimension, as a product with an upper
    triangular matrix of ones (in x's dtype, never TF32 unless PyTorch's float32 matmul precision is
    lowered). On CUDA ``cumsum`` over rows of 64 ran at a few percent of the memory's bandwidth (1.1 ms for
    Mamba-2's 12.6M log-decays at the mad recipe, 6 models stacked, length 1024, on an H200)."""
    n = x.shape[-1]
    return x @ torch.ones(n, n, dtype=x.dtype, device=x.device).triu()


class _CarryStates(torch.autograd.Function):
    """``carry_states`` with its gradient written by hand: forward and backward each one multiply-add a
    chunk into one preallocated tensor; the decays' gradient one product and one sum over every chunk at
    once (autograd through the loop took a product and a reduction per chunk, and a stack)."""

    @staticmethod
    def forward(ctx, states, decay):
        B, M = states.shape[:2]
        E = states.new_empty((B, M + 1, *states.shape[2:]))
        E[:, 0].zero_()
        E[:, 1].copy_(states[:, 0])
        for n in range(1, M):
            torch.addcmul(states[:, n], E[:, n], decay[:, n], out=E[:, n + 1])
        ctx.save_for_backward(E, decay)
        return E

    @staticmethod
    def backward(ctx, dE):
        E, decay = ctx.saved_tensors
        M = E.shape[1] - 1
        G = torch.empty_like(E[:, 1:])                  # G[:, n]: the gradient reaching E_{n+1}, all paths
        G[:, M - 1].copy_(dE[:, M])
        for n in range(M - 2, -1, -1):
            torch.addcmul(dE[:, n + 1], G[:, n + 1], decay[:, n + 1], out=G[:, n])
        dd = G * E[:, :-1]                              # d decay_n = G_{n+1} E_n, summed where decay broadcasts
        dims = [i for i in range(2, dd.dim()) if decay.shape[i] == 1 and dd.shape[i] != 1]
        return G, dd.sum(dims, keepdim=True) if dims else dd


def carry_states(states: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """The states entering each chunk from each chunk's own: states (B, M, ...) those of chunks 0..M-1,
    decay (B, M, ...) broadcastable to them, each chunk's decay over its length -> E (B, M + 1, ...) with
    E_0 = 0 and E_{n+1} = decay_n E_n + states_n. Under an unfolded vmap (functorch transforms active) the
    same recurrence as a differentiable loop."""
    if not torch._C._are_functorch_transforms_active():
        return _CarryStates.apply(states, decay)
    S = states[:, 0]
    enter = [torch.zeros_like(S), S]
    for st, d in zip(states.unbind(1)[1:], decay.unbind(1)[1:]):
        S = torch.addcmul(st, S, d)
        enter.append(S)
    return torch.stack(enter, 1)


def simple_gla_recurrent(q, k, v, g, *, scale: float = 1.0, neg=None) -> torch.Tensor:
    B, H, T, K = q.shape
    a = g.float().exp()
    if neg is not None:
        a = torch.where(neg, -a, a)
    S = q.new_zeros(B, H, v.shape[-1], K, dtype=torch.float32)
    out = []
    for t in range(T):
        S = a[..., t, None, None] * S + v[..., t, :, None].float() * k[..., t, None, :].float()
        out.append((S @ q[..., t, :, None].float()).squeeze(-1))
    return (torch.stack(out, 2) * scale).to(q.dtype)


@_no_autocast
def gated_delta_chunk(q, k, v, g, beta, *, scale: float = 1.0, chunk: int = 64) -> torch.Tensor:
    """q, k: (B, H, T, K); v: (B, H, T, V); g: (B, H, T) log-decay; beta: (B, H, T).
    Returns (B, H, T, V) in q's dtype, computed in float32 (float64 for float64 inputs).
    The chunk's unit-triangular system is solved by substitution (``solve_triangular``): the
    series (I + A)⁻¹ = Σ (-A)ⁿ, evaluated by repeated squaring, is no faster on an H200 and
    loses every digit in float32 when keys are correlated (terms ~ β^n C(chunk, n) cancel)."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    dt = q.dtype
    C = 1 << (max(1, min(chunk, T)) - 1).bit_length()                   # a power of two >= min(chunk, T)
    cdt = torch.float64 if dt == torch.float64 else torch.float32
    q, k, v, g, beta = (t.to(cdt) for t in (q, k, v, g, beta))
    qc, kc, vc = _chunked(q, C), _chunked(k, C), _chunked(v, C)
    gc = _chunked(g.unsqueeze(-1), C).squeeze(-1).cumsum(-1)             # (B, H, N, C)
    bc = _chunked(beta.unsqueeze(-1), C)                                 # (B, H, N, C, 1)
    N = gc.shape[2]
    eye = torch.eye(C, dtype=torch.bool, device=q.device)
    low = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = gc.unsqueeze(-1) - gc.unsqueeze(-2)
    Lin = diff.masked_fill(~low, float("-inf")).exp()                    # t >= s
    Lst = Lin.masked_fill(eye, 0.0)                                      # t > s
    # (I + A) [U | W] = [β v | β e^{γ} k],  A_ts = β_t e^{γ_t - γ_s} k_t·k_s (t > s)
    A = bc * (kc @ kc.transpose(-1, -2)) * Lst
    rhs = torch.cat([bc * vc, bc * gc.exp().unsqueeze(-1) * kc], dim=-1)
    I_A = A + torch.eye(C, dtype=A.dtype, device=A.device)
    sol = torch.linalg.solve_triangular(I_A, rhs, upper=False, unitriangular=True)
    U, W = sol[..., :V], sol[..., V:]                                    # δ = U - W S₀ᵀ-form
    P = (qc @ kc.transpose(-1, -2)) * Lin                                # (B, H, N, C, C)
    Qe = qc * gc.exp().unsqueeze(-1) - P @ W                             # o = P U + Qe S₀ᵀ
    Ou = P @ U
    if N == 1:
        o = Ou
    else:
        last = gc[..., -1]                                               # (B, H, N)
        KdT = (kc * (last.unsqueeze(-1) - gc).exp().unsqueeze(-1)).transpose(-1, -2)
        dec = last.exp()
        # flatten (B, H) into one batch axis for baddbmm; S is (BH, K, V) here
        fl = lambda t: t.flatten(0, 1)
        Us, Ws, Ks, Ds = fl(U).unbind(1), fl(W).unbind(1), fl(KdT).unbind(1), fl(dec).unbind(1)
        S = q.new_zeros(B * H, K, V)
        enters = [S]
        for n in range(N - 1):
            d = torch.baddbmm(Us[n], Ws[n], S, alpha=-1.0)              # δ of chunk n
            S = torch.baddbmm(S * Ds[n][:, None, None], Ks[n], d)
            enters.append(S)
        S_in = torch.stack(enters, 1).unflatten(0, (B, H))               # (B, H, N, K, V)
        o = Ou + Qe @ S_in
    return (o.flatten(2, 3)[:, :, :T] * scale).to(dt)


def gated_delta_recurrent(q, k, v, g, beta, *, scale: float = 1.0) -> torch.Tensor:
    B, H, T, K = q.shape
    S = q.new_zeros(B, H, v.shape[-1], K, dtype=torch.float32)
    out = []
    for t in range(T):
        kt, vt, qt = k[..., t, :].float(), v[..., t, :].float(), q[..., t, :].float()
        S = S * g[..., t, None, None].float().exp()
        err = vt - (S @ kt.unsqueeze(-1)).squeeze(-1)
        S = S + beta[..., t, None, None].float() * err.unsqueeze(-1) * kt.unsqueeze(-2)
        out.append((S @ qt.unsqueeze(-1)).squeeze(-1))
    return (torch.stack(out, 2) * scale).to(q.dtype)


@_no_autocast
def decayed_prefix_sums(x: torch.Tensor, g: torch.Tensor, *, chunk: int = 64) -> torch.Tensor:
    """S_t = Σ_{s<=t} exp(Σ_{s<l<=t} g_l) x_s for x (B, H, T, P) and log-decays g (B, H, T):
    every prefix state materialized, by the chunked parallel form (no step loop)."""
    B, H, T, P = x.shape
    dt = x.dtype
    cdt = torch.float64 if dt == torch.float64 else torch.float32
    x, g = x.to(cdt), g.to(cdt)
    C = max(1, min(chunk, T))
    xc = _chunked(x, C)                                                  # (B, H, N, C, P)
    gc = _chunked(g.unsqueeze(-1), C).squeeze(-1).cumsum(-1)             # (B, H, N, C)
    N = gc.shape[2]
    tri = torch.ones(C, C, dtype=torch.bool, device=x.device).tril()
    L = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~tri, float("-inf")).exp()
    s = L @ xc                                                           # within the chunk
    if N > 1:
        last = gc[..., -1]                                               # (B, H, N)
        ends = ((last.unsqueeze(-1) - gc).exp().unsqueeze(-2) @ xc).squeeze(-2)    # (B, H, N, P)
        cum = last.cumsum(-1)
        dm = (cum[..., :, None] - last[..., :, None]) - cum[..., None, :]
        strict = torch.ones(N, N, dtype=torch.bool, device=x.device).tril(-1)
        enter = dm.masked_fill(~strict, float("-inf")).exp() @ ends      # (B, H, N, P)
        s = s + gc.exp().unsqueeze(-1) * enter.unsqueeze(-2)
    return s.flatten(2, 3)[:, :, :T].to(dt)
