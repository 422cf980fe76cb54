"""Causal Local Linear Attention in Triton: forward and backward (an autograd Function).

Math (the estimator of ``reference.py``; FlashLLA's, with its ridge λ·ω written for normalized weights).
For query i over keys j <= i, a_ij = softmax_j(scale q_i . k_j), k̄ = Σ a k, b = k̄ - q (the first moment about
the query), C = Σ a (k - k̄)(k - k̄)ᵀ + λ I:

    y = C⁻¹ b,   η = bᵀ y,   o_i = Σ_j a_ij (1 - y . (k_j - k̄)) v_j

The moments about the query are recovered exactly: Ŝ = Σ a (k - q)(k - q)ᵀ + λI = C + b bᵀ, so by
Sherman–Morrison ρ = Ŝ⁻¹ b = y / (1 + η) and δ̂ = 1 - bᵀρ = 1 / (1 + η) (FlashLLA's ρ and δ/ω).

Algorithm (chosen for speed; see benchmarks/lla_notes.md for the measurements):

* Matrix-free conjugate gradients on the *centred* matrix C, never Ŝ. Ŝ = C + b bᵀ carries a rank-one
  outlier of size |k̄ - q|² and the intercept form divides by δ̂ (error amplified by 1 + η); C has neither,
  so CG reaches the accuracy bf16 allows in fewer iterations. Each iteration re-streams the causal prefix
  of K once (one QKᵀ recompute, two matmuls).
* Early exit per query tile: a tile stops as soon as every row has ‖r‖ <= tol·sqrt(min(1, λ/10))·‖r₀‖
  (default tol 1e-3, at most ``max_iter`` = 48 iterations; below λ = 3 at least 4·D, see Precision).
  FlashLLA always runs its 32 iterations (its tolerance, 1e-12 on the squared norm, is out of reach in bf16).
  Optional Jacobi preconditioning (``jacobi=True``): one more matmul in the moment pass; measured separately.
* The backward needs one more solve per query with the same matrix. Differentiating the centred form
  o = v̄ - Σ_VK y directly gives a backward with no 1/δ̂ anywhere (the moments-about-the-query form
  multiplies and then cancels terms of size 1 + η, which loses digits when λ is small):
      h = Σ_VKᵀ g = Σ a Γ (k - k̄) with Γ_j = g . v_j,   ν = C⁻¹ h   (the extra solve)
      e_ij = y_i . (k_j - k̄_i),  f_ij = ν_i . (k_j - k̄_i),  ψ = 1 - e,  Δ_ij = Γ_ij - Γ̄_i
      P_ij = a_ij ((Δ - f) ψ + λ ν . y)
      dq_i = ν_i + scale Σ_j P_ij k_j
      dk_j = Σ_i scale P_ij q_i - a_ij ψ_ij ν_i + a_ij (f_ij - Δ_ij) y_i
      dv_j = Σ_i a_ij ψ_ij g_i,    dλ_i = ν_i . y_i  (so a learned ridge trains)
  Three kernels: forward; backward over query tiles (moments, the solve, dq); backward over key tiles
  (dk, dv), with no atomics.

Precision. Matmuls take bf16 (fp16) operands with fp32 accumulation. Products of inputs (q, k, v, g) are then
exact; what loses digits is rounding a computed fp32 operand (weights, the CG direction, y, ν) to bf16, a
relative 2^-9. A small ridge amplifies that: along directions where Σ a (k - k̄)(k - k̄)ᵀ is small, y ≈ (k̄ - q)/λ
(|y| ~ 5e3 at λ = 0.01 with peaked attention), e = y.k - y.k̄ cancels, an error in h or a CG residual reaches ν
through C⁻¹ ~ 1/λ, and dk multiplies f = ν.(k - k̄) by y. Where that matters a computed operand x goes through
the matmul as hi + lo = bf16(x) + bf16(x - bf16(x)) (~2^-17 relative; the other operand, an input, is exact),
or in three parts (~2^-25). A constexpr level PREC, chosen on the host from the smallest λ (``PREC_BELOW``;
``lla(prec=...)``, by default from λ.min(), a device read: the ``lla`` mechanism passes it without one), switches
this on only where it was measured to be needed (benchmarks/lla_small_ridge.py: Triton interpreter patched to
round like the GPU, errors against the float64 reference; per-flag ablations at λ = 0.01 and λ = 1, q x 4):
  PREC 0, λ >= 10: as measured on the H200 (same PTX, compiled offline for sm_90a): hi + lo only for y and
      the weights of the forward's output pass.
  PREC 1, 3 <= λ < 10: also the one-pass sums: the softmax weights in k̄ (forward and backward) and a Γ in h,
      y and ν in e and f, and the dv weights a ψ. The sums add the weights the matmuls see. Extra matmuls:
      1 in the forward, 2 + 2 (dq kernel) + 3 (dk/dv kernel) in the backward; the CG loop is unchanged.
      Without it, λ = 2..3 with q x 4 gave dk errors of 3e-2 (D = 128).
  PREC 2, 0.1 <= λ < 3: also the CG matvec: p is no longer rounded to bf16 each iteration (that cost ~50% more
      iterations at λ = 0.01) and enters c = p.k as hi + lo; the weighted projections a c go through as hi + lo
      (rounded, they limit how far the true residual falls: o errors 1.3e-2 at λ = 1 and 4.5e-2 at λ = 0.01,
      q x 4, with everything else split). Five matmuls a key tile and iteration instead of three, no more loads.
  PREC 3, λ < 0.1: p enters c in three parts (with two, the 2^-17 error of c times |y| ~ 1/λ left a true
      residual of ~2e-3 and 1-3e-2 errors on rows with few keys at λ = 0.01): six matmuls a key tile and
      iteration. y enters e in three parts (forward output pass, dq and dk/dv kernels: one more matmul each;
      dv 8e-3 -> 2e-3 at T = 64, D = 128). The ν solve stops at ‖r‖ <= tol·min(1, λ/10)·‖r₀‖ instead of
      tol·sqrt(..): dk multiplies ν's error (up to ‖r‖/λ) by y (up to |k̄ - q|/λ); at T = 64, D = 128, q x 4
      (every row sees fewer than D keys) dk went 2.0e-2 -> 8e-3 and dq 1.3e-2 -> 2e-3, for ~45% more
      backward iterations.
  Not split, measured unnecessary (errors moved by < 5e-4 at λ = 0.01, D = 64, q x 4): the dq weights P and
  the three dk matmuls.
  At PREC >= 2 CG needs many more iterations (C's spectrum spans λ .. a|k - k̄|² ~ D; at λ = 0.01, T = 300 up to
  ~2 D for D = 32, ~1.2 D for D = 128), so the iteration cap is max(max_iter, 4 D). The forward's stop rule is
  unchanged: y's residual at that tolerance moved o, dq, dk by < 4e-4 (float64 formulas fed the kernel's y).
  fp32 operands with input_precision "tf32x3" were not used: with one operand exactly bf16, two bf16 matmuls
  give 16 bits where tf32x3 costs three tf32 matmuls (half the bf16 rate) and an fp32 copy of k.

Memory: besides the output, the forward keeps y (fp32, (BH, T, D) at the padded width) and one float per row (with
the explicit solve also C and the moments, dr·dr and dr·dr + 2·dr floats a row); the backward adds ν (fp32, (BH, T,
D)) and four floats per row. The heads themselves are read where they lie (``lla``). Nothing of size T x T or
T x D x D touches global memory.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import LLA_HEADS, aligned_strides, chosen, padded_dim

LOG2E = 1.4426950408889634

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per padded head dim, for the three kernels. Measured at T=4096,
# BH=16, D=128 (benchmarks/lla_notes.md): 4 warps beat 8 by 2x in the forward (register pressure of the CG
# state), (64, 128) and (128, 64) key tiles run out of shared memory in the dk/dv kernel.
CONFIGS = {
    "fwd": {16: (64, 64, 4, 2), 32: (64, 64, 4, 2), 64: (64, 64, 4, 2), 128: (64, 64, 4, 2)},
    "bwd_q": {16: (64, 64, 4, 2), 32: (64, 64, 4, 2), 64: (64, 64, 4, 2), 128: (64, 64, 4, 2)},
    "bwd_kv": {16: (64, 64, 4, 2), 32: (64, 64, 4, 2), 64: (64, 64, 4, 2), 128: (64, 64, 4, 2)},
}
DEFAULTS = {"tol": 1e-3, "max_iter": 48, "jacobi": False, "solve": "auto", "onepass": False, "c_from_forward": True,
            "h_from_forward": True}


def c_from_forward() -> bool:
    """Whether the explicit solve's backward takes the forward's C: ``DEFAULTS["c_from_forward"]``, unless the
    switch ``MIXZOO_LLA_C`` says ``summed`` (C summed again in the backward's query pass) or ``forward``."""
    sw = os.environ.get("MIXZOO_LLA_C")
    return DEFAULTS["c_from_forward"] if not sw else sw == "forward"


def h_from_forward() -> bool:
    """Whether the explicit solve's backward forms its right-hand side h = Σ_VKᵀ g from moments the forward kept
    (Σ_VK, k̄, v̄: the forward then forms its output from them, ``onepass``) instead of summing it over the keys
    again: ``DEFAULTS["h_from_forward"]``, unless the switch ``MIXZOO_LLA_H`` says ``summed`` or ``forward``.
    Only with the forward's C (``c_from_forward``): the backward's query pass then makes one pass over the keys."""
    sw = os.environ.get("MIXZOO_LLA_H")
    return DEFAULTS["h_from_forward"] if not sw else sw == "forward"
# Heads of at most this many dims solve C y = b directly (``_direct_solve``): C's DR x DR entries are summed in
# the moment pass (DR = 4 or 8, the head dim rounded up; tl.dot needs DR·DR >= 16), then eliminated in registers,
# in place of CG's passes over the keys. Wider heads would not fit C in registers.
DIRECT_MAX_DIM = 8
SOLVES = ("auto", "cg", "direct")


# The explicit solve's precision level (``MIXZOO_LLA_DIRECT_PREC=capped``, the default): at most 1. Its C and right-hand sides are
# summed in the moment pass and eliminated in fp32 registers, so the level's CG parts (PREC >= 2: the direction p split,
# the matvec's weights as hi + lo) do not occur, and its remaining parts (the moments' weights in three bf16 parts, PREC
# >= 2, against two at 1) did not change any error: benchmarks/lla_small_ridge.py --D 4,8 --T 64,160,300 --qscale 1,4,
# λ 0.01 and 0.03 at levels 3 / 1 and λ 0.1 to 2.9 at levels 2 / 1, o, dq, dk and dv against float64 equal to two
# digits in every case (1.4e-3 to 3.5e-3); level 0 left dk, dv errors up to 5.6e-2 at λ 0.01 (benchmarks/lla_notes.md).
# Fewer matmuls in the moment pass (three in place of five per moment): side by side on an H100 (2026-12-06,
# benchmarks/calls-2026-12-06c/), LLA's stacked+graphed training step (K = 6, MAD's baseline shape) capped against the
# level λ gives (2 at the default ridge): 614.8 / 605.5 model-steps/s at length 128 (1.02x), 277.0 / 269.9 at 256
# (1.03x), 110.6 / 106.5 at 512 (1.04x), 38.2 / 36.5 at 1024 (1.05x); tests/gpu/test_lla_kernel.py -k direct, 34 of 34
# with the cap. ``MIXZOO_LLA_DIRECT_PREC=level`` runs the level λ gives.
DIRECT_PREC_MAX = 1


def direct_prec(prec: int) -> int:
    """The precision level the explicit solve runs at for λ's level ``prec``: at most ``DIRECT_PREC_MAX`` (the default,
    ``MIXZOO_LLA_DIRECT_PREC=capped``), or ``prec`` itself with ``MIXZOO_LLA_DIRECT_PREC=level``."""
    return prec if os.environ.get("MIXZOO_LLA_DIRECT_PREC") == "level" else min(prec, DIRECT_PREC_MAX)


def direct_dims(D: int, solve: str = "auto") -> int | None:
    """The DR of the explicit solve for a head of D dims under ``solve``, or None for CG."""
    if solve == "cg" or D > DIRECT_MAX_DIM:
        return None
    return max(4, 1 << (D - 1).bit_length())


@triton.jit
def _scores(q, k, offs_m, offs_n, T, sc2):
    s = tl.dot(q, tl.trans(k)) * sc2
    ok = (offs_m[:, None] >= offs_n[None, :]) & (offs_n[None, :] < T) & (offs_m[:, None] < T)
    return tl.where(ok, s, float("-inf"))


@triton.jit
def _hi_lo(x, DT: tl.constexpr):
    """x (fp32) = hi + lo + O(2^-18 |x|), both halves in DT (bf16: hi carries 8 bits, lo the next 8)."""
    xh = x.to(DT)
    return xh, (x - xh.to(tl.float32)).to(DT)


@triton.jit
def _split3(x, DT: tl.constexpr):
    """x (fp32) = hi + mid + lo + O(2^-26 |x|), all three in DT (bf16: 8 bits each)."""
    xh = x.to(DT)
    r = x - xh.to(tl.float32)
    xm = r.to(DT)
    return xh, xm, (r - xm.to(tl.float32)).to(DT)


@triton.jit
def _first(x, D: tl.constexpr, DR: tl.constexpr, BM: tl.constexpr):
    """The first DR of the D columns of a (BM, D) tile (the real head dims of a padded head)."""
    x3 = tl.reshape(x, (BM, D // DR, DR))
    return tl.sum(tl.where((tl.arange(0, D // DR) == 0)[None, :, None], x3, 0.0), 1)


@triton.jit
def _widen(xr, D: tl.constexpr, DR: tl.constexpr, BM: tl.constexpr):
    """(BM, DR) -> (BM, D), zero in the padded columns."""
    x3 = tl.where((tl.arange(0, D // DR) == 0)[None, :, None], xr[:, None, :], 0.0)
    return tl.reshape(x3, (BM, D))


@triton.jit
def _rows(X, offs_n, T, st, DR: tl.constexpr, DIN: tl.constexpr):
    """The first DR head dims of a tile of rows of X (rows ``st`` elements apart; dims past the DIN real ones
    zero), (BN, DR) fp32."""
    dr = tl.arange(0, DR)
    return tl.load(X + offs_n[:, None] * st + dr[None, :], mask=(offs_n[:, None] < T) & (dr < DIN)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _tile(X, offs, T, st, offs_d, DIN: tl.constexpr):
    """Rows ``offs`` of one head of X (``st`` elements apart), its DIN real dims zero-padded to the tile's width."""
    return tl.load(X + offs[:, None] * st + offs_d[None, :], mask=(offs[:, None] < T) & (offs_d < DIN)[None, :],
                   other=0.0)


@triton.jit
def _put(X, offs, T, st, offs_d, x, DIN: tl.constexpr):
    """Store a tile's DIN real dims into rows ``offs`` of one head of X."""
    tl.store(X + offs[:, None] * st + offs_d[None, :], x, mask=(offs[:, None] < T) & (offs_d < DIN)[None, :])


@triton.jit
def _head(X, bh, NH, sb, sh):
    """One (sequence, head) of X (B, H, T, ·) at strides (sb, sh) from program row bh = b·NH + h."""
    return X + (bh // NH) * sb + (bh % NH) * sh


@triton.jit
def _outer(a, b, BN: tl.constexpr, DR: tl.constexpr, DT: tl.constexpr):
    """The products a bᵀ per row, (BN, DR·DR), as hi + lo in DT: exact, for a and b holding bf16 (fp16) values,
    since a product of two of them has at most 16 (22) significant bits."""
    return _hi_lo(tl.reshape(a[:, :, None] * b[:, None, :], (BN, DR * DR)), DT)


@triton.jit
def _moment_dot(wb, wm, wl, xh, xl, acc, PREC: tl.constexpr):
    """acc + Σ_j w_ij x_j on the tensor cores, x = xh + xl exactly (``_outer``) and w = wb + wm + wl
    (``_split3``): wb.xh + wb.xl + wm.xh, the weights to ~2^-17; from PREC 2 on also wm.xl + wl.xh (~2^-25), so
    that C = S2/Σw - k̄ k̄ᵀ carries fp32's error and no more."""
    acc = tl.dot(wb, xh, acc)
    acc = tl.dot(wb, xl, acc)
    acc = tl.dot(wm, xh, acc)
    if PREC >= 2:
        acc = tl.dot(wm, xl, acc)
        acc = tl.dot(wl, xh, acc)
    return acc


@triton.jit
def _direct_matrix(s2, wsum, kbar, lam, D: tl.constexpr, DR: tl.constexpr, BM: tl.constexpr):
    """C = S2/Σw - k̄ k̄ᵀ + λI per row, (BM, DR, DR) fp32, over the real head dims DR <= 8."""
    kr = _first(kbar, D, DR, BM)
    ii = tl.arange(0, DR)
    eye = ii[:, None] == ii[None, :]
    A = tl.reshape(s2, (BM, DR, DR)) / wsum[:, None, None] - kr[:, :, None] * kr[:, None, :]
    return A + tl.where(eye[None, :, :], lam[:, None, None], 0.0)


@triton.jit
def _direct_eliminate(A, rhs, D: tl.constexpr, DR: tl.constexpr, BM: tl.constexpr):
    """x = A⁻¹ rhs per row for A (BM, DR, DR) symmetric positive definite, by Gaussian elimination on its rows
    (LDLᵀ without pivoting: stable for SPD), in fp32 registers; rhs scaled to unit size as in ``_cg_solve``.
    Also returns the eliminated A, whose upper triangle U (A = Uᵀ diag(U)⁻¹ U) ``_direct_substitute`` takes."""
    br = _first(rhs, D, DR, BM)
    ii = tl.arange(0, DR)
    sc = tl.max(tl.abs(br), 1)
    sc = tl.where(sc > 0, sc, 1.0)
    x = br / sc[:, None]
    for j in tl.static_range(DR):               # eliminate below the diagonal, reading row j only
        ej = ii == j
        rowj = tl.sum(tl.where(ej[None, :, None], A, 0.0), 1)
        piv = tl.sum(tl.where(ej[None, :], rowj, 0.0), 1)
        xj = tl.sum(tl.where(ej[None, :], x, 0.0), 1)
        f = tl.where((ii > j)[None, :], rowj / piv[:, None], 0.0)      # C symmetric: C[i, j] = C[j, i]
        A = A - f[:, :, None] * rowj[:, None, :]
        x = x - f * xj[:, None]
    y = tl.zeros([BM, DR], tl.float32)
    for jj in tl.static_range(DR):              # back substitution
        j = DR - 1 - jj
        ej = ii == j
        rowj = tl.sum(tl.where(ej[None, :, None], A, 0.0), 1)
        piv = tl.sum(tl.where(ej[None, :], rowj, 0.0), 1)
        xj = tl.sum(tl.where(ej[None, :], x, 0.0), 1)
        sj = tl.sum(tl.where((ii > j)[None, :], rowj * y, 0.0), 1)
        y = tl.where(ej[None, :], ((xj - sj) / piv)[:, None], y)
    return _widen(y * sc[:, None], D, DR, BM), A


@triton.jit
def _direct_substitute(U, rows, rmask, rhs, D: tl.constexpr, DR: tl.constexpr, BM: tl.constexpr):
    """x = A⁻¹ rhs per row from the eliminated rows U of A (``_direct_eliminate``, stored row-major, DR·DR floats a
    row of the tile at ``U + rows·DR·DR``): the same operations as the elimination's on the right-hand side, each
    row of U read from memory when it is used (rows past ``rmask`` solve the identity)."""
    br = _first(rhs, D, DR, BM)
    ii = tl.arange(0, DR)
    sc = tl.max(tl.abs(br), 1)
    sc = tl.where(sc > 0, sc, 1.0)
    x = br / sc[:, None]
    base = U + rows.to(tl.int64)[:, None] * (DR * DR) + ii[None, :]
    for j in tl.static_range(DR):
        ej = ii == j
        rowj = tl.load(base + j * DR, mask=rmask[:, None], other=0.0) + tl.where((~rmask)[:, None] & ej[None, :], 1.0, 0.0)
        piv = tl.sum(tl.where(ej[None, :], rowj, 0.0), 1)
        xj = tl.sum(tl.where(ej[None, :], x, 0.0), 1)
        x = x - tl.where((ii > j)[None, :], rowj / piv[:, None], 0.0) * xj[:, None]
    y = tl.zeros([BM, DR], tl.float32)
    for jj in tl.static_range(DR):
        j = DR - 1 - jj
        ej = ii == j
        rowj = tl.load(base + j * DR, mask=rmask[:, None], other=0.0) + tl.where((~rmask)[:, None] & ej[None, :], 1.0, 0.0)
        piv = tl.sum(tl.where(ej[None, :], rowj, 0.0), 1)
        xj = tl.sum(tl.where(ej[None, :], x, 0.0), 1)
        sj = tl.sum(tl.where((ii > j)[None, :], rowj * y, 0.0), 1)
        y = tl.where(ej[None, :], ((xj - sj) / piv)[:, None], y)
    return _widen(y * sc[:, None], D, DR, BM)


@triton.jit
def _direct_solve(s2, wsum, kbar, lam, rhs, D: tl.constexpr, DR: tl.constexpr, BM: tl.constexpr):
    """x = C⁻¹ rhs per row with C = S2/Σw - k̄ k̄ᵀ + λI formed explicitly (real head dims DR <= 8)."""
    x, _ = _direct_eliminate(_direct_matrix(s2, wsum, kbar, lam, D, DR, BM), rhs, D, DR, BM)
    return x


@triton.jit
def _stored_moments(MOM, rows, rmask, g, D: tl.constexpr, DR: tl.constexpr, BM: tl.constexpr):
    """k̄, Γ̄ = g . v̄ and h = Σ_VKᵀ g of a query tile from the forward's Σ_VK, k̄, v̄ (rows of DR·DR + 2·DR floats,
    ``_lla_fwd`` with STORE_M): h = Σ a (k - k̄)(v - v̄)ᵀ g = Σ a (Γ - Γ̄)(k - k̄), the pass over the keys it replaces."""
    mrow = MOM + rows.to(tl.int64)[:, None] * (DR * DR + 2 * DR)
    svk = tl.reshape(tl.load(mrow + tl.arange(0, DR * DR)[None, :], mask=rmask[:, None], other=0.0), (BM, DR, DR))
    kr = tl.load(mrow + DR * DR + tl.arange(0, DR)[None, :], mask=rmask[:, None], other=0.0)
    vr = tl.load(mrow + DR * DR + DR + tl.arange(0, DR)[None, :], mask=rmask[:, None], other=0.0)
    gr = _first(g.to(tl.float32), D, DR, BM)
    h = tl.sum(svk * gr[:, :, None], 1)                # Σ_VK[d1, d2] g[d1] over the value dims d1
    return _widen(kr, D, DR, BM), tl.sum(gr * vr, 1), _widen(h, D, DR, BM)


@triton.jit
def _cg_solve(rhs, q, kbar, lse2, lam, dinv, Kb, sk_t, offs_m, offs_d, hi, T, sc2, tol2, max_iter,
              D: tl.constexpr, BN: tl.constexpr, JACOBI: tl.constexpr, PREC: tl.constexpr, TIGHT: tl.constexpr,
              DIN: tl.constexpr):
    """Solve (Σ a (k - k̄)(k - k̄)ᵀ + λI) x = rhs for every row of a query tile; matrix-free CG.

    PREC < 2: the direction p is rounded to bf16 and the weighted projections a c go through the matmul in bf16
    (three matmuls a key tile). PREC >= 2: p is kept as hi + lo (PREC 3: hi + mid + lo, ~24 bits) and enters
    c = p . k in those parts, a c as hi + lo: five (six) matmuls a key tile. TIGHT (the ν solve at PREC 3): stop
    at ‖r‖ <= tol·min(1, λ/10)·‖r₀‖."""
    DT = q.dtype
    # The system is linear: solve for rhs / s, s the row's largest |rhs|, and scale x back. Output gradients
    # of 1e-23 reach the backward's ν solve (rows of the loss that barely depend on the layer); unscaled, r.z,
    # p.Ap and their ratios fall into fp32's subnormal range, where CG's recurrences lose every digit (the
    # H200 returned dq, dk of 1e18 from g ~ 1e-23: benchmarks/divergence.py mqar512, step 1047).
    s = tl.max(tl.abs(rhs), 1)
    s = tl.where(s > 0, s, 1.0)
    x = tl.zeros(rhs.shape, tl.float32)
    r = rhs / s[:, None]
    if JACOBI:
        z = r * dinv
    else:
        z = r
    if PREC >= 2:
        p = z
    else:
        p = z.to(DT).to(tl.float32)       # p exactly representable: the matvec sees the p that x gets
    rz = tl.sum(r * z, 1)
    # stop at ‖r‖ <= tol·sqrt(min(1, λ/10))·‖r₀‖ (the error in x is at most ‖r‖/λ). Written as in the measured
    # kernel: ptxas spills a third more in the dq kernel when this is min(λ/10, 1) directly.
    lr = tl.sqrt(tl.minimum(lam / 10.0, 1.0))
    thr = rz * tol2 * lr * lr
    if TIGHT:                                       # ‖r‖ <= tol·min(1, λ/10)·‖r₀‖
        thr = thr * lr * lr
    active = rz > 0
    it = tl.full([], 0, tl.int32)
    n_act = tl.sum(active.to(tl.int32), 0)
    while (it < max_iter) & (n_act > 0):
        pb, pm, pl = _split3(p, DT)
        if PREC >= 2:                       # p = pb + pm (+ pl) exactly, so x and the matvec see the same p
            p = pb.to(tl.float32) + pm.to(tl.float32)
            if PREC >= 3:
                p += pl.to(tl.float32)
        pk = tl.sum(p * kbar, 1)
        acc = tl.zeros(rhs.shape, tl.float32)
        cs = tl.zeros(lse2.shape, tl.float32)
        for start in range(0, hi, BN):
            offs_n = start + tl.arange(0, BN)
            k = _tile(Kb, offs_n, T, sk_t, offs_d, DIN)
            a = tl.math.exp2(_scores(q, k, offs_m, offs_n, T, sc2) - lse2[:, None])
            c = tl.dot(pb, tl.trans(k))
            if PREC >= 2:
                c = tl.dot(pm, tl.trans(k), c)
                if PREC >= 3:
                    c = tl.dot(pl, tl.trans(k), c)
                wh, wl = _hi_lo(a * (c - pk[:, None]), DT)
                acc = tl.dot(wh, k, acc)
                acc = tl.dot(wl, k, acc)
                cs += tl.sum(wh.to(tl.float32) + wl.to(tl.float32), 1)     # the weights the matmuls see
            else:
                wb = (a * (c - pk[:, None])).to(DT)
                acc = tl.dot(wb, k, acc)
                cs += tl.sum(wb.to(tl.float32), 1)
        ap = acc - cs[:, None] * kbar + lam[:, None] * p
        pap = tl.sum(p * ap, 1)
        active = active & (pap > 0)                 # stop a row whose curvature rounding made non-positive
        alpha = tl.where(active, rz / pap, 0.0)
        x += alpha[:, None] * p
        r -= alpha[:, None] * ap
        if JACOBI:
            z = r * dinv
        else:
            z = r
        rz_new = tl.sum(r * z, 1)
        active = active & (rz_new > thr)
        beta = tl.where(active, rz_new / rz, 0.0)
        p = z + beta[:, None] * p
        if PREC < 2:
            p = p.to(DT).to(tl.float32)
        rz = tl.where(active, rz_new, rz)
        it += 1
        n_act = tl.sum(active.to(tl.int32), 0)
    return x * s[:, None], it


@triton.jit
def _lla_fwd(Q, K, V, LAM, OUT, Y, LSE, ITS, CM, MOM, T, sc2, tol2, max_iter, NH,
             sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, so_t, sl_b, sl_h, sl_t,
             D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, JACOBI: tl.constexpr, STORE_Y: tl.constexpr,
             PREC: tl.constexpr, DR: tl.constexpr, DIRECT: tl.constexpr, ONEPASS: tl.constexpr,
             STORE_C: tl.constexpr, STORE_M: tl.constexpr, DIN: tl.constexpr, VEC: tl.constexpr):
    # the heads' strides come in units of VEC elements (``_io_strides``): multiplied back by the constexpr, the
    # compiler knows every row starts VEC-aligned and loads a row of DIN in vectors
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t = sq_b * VEC, sq_h * VEC, sq_t * VEC, sk_b * VEC, sk_h * VEC, sk_t * VEC
    sv_b, sv_h, sv_t, so_b, so_h, so_t = sv_b * VEC, sv_h * VEC, sv_t * VEC, so_b * VEC, so_h * VEC, so_t * VEC
    n_m = tl.cdiv(T, BM)
    pid_m = n_m - 1 - tl.program_id(0)            # longest tiles first
    bh = tl.program_id(1).to(tl.int64)
    Qb, Kb, Vb = _head(Q, bh, NH, sq_b, sq_h), _head(K, bh, NH, sk_b, sk_h), _head(V, bh, NH, sv_b, sv_h)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    rmask = offs_m < T
    q = _tile(Qb, offs_m, T, sq_t, offs_d, DIN)
    DT = q.dtype
    lam = tl.load(_head(LAM, bh, NH, sl_b, sl_h) + offs_m * sl_t, mask=rmask, other=1.0)
    hi = tl.minimum(T, (pid_m + 1) * BM)

    # pass 1: online softmax moments (max, sum, Σ w k, and Σ w k∘k for Jacobi). PREC >= 1: the weights enter
    # Σ w k as hi + lo (k̄ then matches the weights a of the later passes to ~2^-17); the sums always add the
    # weights the matmuls see, so that Σ w (k - k̄) = 0 holds for them
    m = tl.full([BM], float("-inf"), tl.float32)
    wsum = tl.zeros([BM], tl.float32)
    mk = tl.zeros([BM, D], tl.float32)
    dg = tl.zeros([BM, D], tl.float32)
    s2 = tl.zeros([BM, DR * DR], tl.float32)
    mv = tl.zeros([BM, D], tl.float32)
    vk = tl.zeros([BM, DR * DR], tl.float32)
    for start in range(0, hi, BN):
        offs_n = start + tl.arange(0, BN)
        k = _tile(Kb, offs_n, T, sk_t, offs_d, DIN)
        s = _scores(q, k, offs_m, offs_n, T, sc2)
        m_new = tl.maximum(m, tl.max(s, 1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_new)
        w = tl.math.exp2(s - m_new[:, None])
        wb, wl = _hi_lo(w, DT)
        if DIRECT:                                  # the weights as _moment_dot splits them, in k̄ and Σw too
            wb, wm, wl = _split3(w, DT)
            wsum = wsum * alpha + tl.sum(wb.to(tl.float32) + wm.to(tl.float32), 1)
            mk = tl.dot(wm, k, tl.dot(wb, k, mk * alpha[:, None]))
            if PREC >= 2:
                wsum += tl.sum(wl.to(tl.float32), 1)
                mk = tl.dot(wl, k, mk)
            kr = _rows(Kb, offs_n, T, sk_t, DR, DIN)
            kkh, kkl = _outer(kr, kr, BN, DR, DT)
            s2 = _moment_dot(wb, wm, wl, kkh, kkl, s2 * alpha[:, None], PREC)
            if ONEPASS:                             # Σ w v and Σ w v kᵀ: the output without a second pass
                v = _tile(Vb, offs_n, T, sv_t, offs_d, DIN)
                mv = tl.dot(wm, v, tl.dot(wb, v, mv * alpha[:, None]))
                if PREC >= 2:
                    mv = tl.dot(wl, v, mv)
                vkh, vkl = _outer(_rows(Vb, offs_n, T, sv_t, DR, DIN), kr, BN, DR, DT)
                vk = _moment_dot(wb, wm, wl, vkh, vkl, vk * alpha[:, None], PREC)
        elif PREC >= 1:
            wsum = wsum * alpha + tl.sum(wb.to(tl.float32) + wl.to(tl.float32), 1)
            mk = tl.dot(wl, k, tl.dot(wb, k, mk * alpha[:, None]))
        else:
            wsum = wsum * alpha + tl.sum(wb.to(tl.float32), 1)
            mk = tl.dot(wb, k, mk * alpha[:, None])
        if JACOBI:
            kf = k.to(tl.float32)
            dg = tl.dot(wb, (kf * kf).to(DT), dg * alpha[:, None])
        m = m_new
    wsum = tl.where(wsum > 0, wsum, 1.0)
    kbar = mk / wsum[:, None]
    lse2 = m + tl.math.log2(wsum)
    bv = kbar - q.to(tl.float32)
    if JACOBI:
        diag = dg / wsum[:, None] - kbar * kbar + lam[:, None]
        dinv = 1.0 / tl.maximum(diag, lam[:, None])
    else:
        dinv = bv
    if DIRECT:
        y, cu = _direct_eliminate(_direct_matrix(s2, wsum, kbar, lam, D, DR, BM), bv, D, DR, BM)
        if STORE_C:                                 # the backward's ν solve takes this C, eliminated (``lla_forward``)
            tl.store(CM + (bh * T + offs_m)[:, None] * (DR * DR) + tl.arange(0, DR * DR)[None, :],
                     tl.reshape(cu, (BM, DR * DR)), mask=rmask[:, None])
        it = tl.full([], 0, tl.int32)
    else:
        y, it = _cg_solve(bv, q, kbar, lse2, lam, dinv, Kb, sk_t, offs_m, offs_d, hi, T, sc2, tol2, max_iter,
                          D, BN, JACOBI, PREC, False, DIN)

    if ONEPASS:
        # o = v̄ - Σ_VK y with Σ_VK = Σ a v kᵀ / Σa - v̄ k̄ᵀ, the moments summed in pass 1 to ~2^-25 (PREC >= 2) or
        # ~2^-17: the two terms of size |v||k||y| cancel to |v|, and |y| <= |k̄ - q|/λ is small where the weights
        # are split in two only (λ >= 3)
        vbar = mv / wsum[:, None]
        vr, kr, yr = _first(vbar, D, DR, BM), _first(kbar, D, DR, BM), _first(y, D, DR, BM)
        svk = tl.reshape(vk, (BM, DR, DR)) / wsum[:, None, None] - vr[:, :, None] * kr[:, None, :]
        acc = _widen(vr - tl.sum(svk * yr[:, None, :], 2), D, DR, BM)
        if STORE_M:                                 # Σ_VK, k̄, v̄ for the backward's h = Σ_VKᵀ g (``lla_backward``)
            mrow = MOM + (bh * T + offs_m)[:, None] * (DR * DR + 2 * DR)
            tl.store(mrow + tl.arange(0, DR * DR)[None, :], tl.reshape(svk, (BM, DR * DR)), mask=rmask[:, None])
            tl.store(mrow + DR * DR + tl.arange(0, DR)[None, :], kr, mask=rmask[:, None])
            tl.store(mrow + DR * DR + DR + tl.arange(0, DR)[None, :], vr, mask=rmask[:, None])
    else:
        # pass 3: o = Σ a (1 - y . (k - k̄)) v. When λ is small and the query lies outside the key cloud, |y| is up to
        # |k̄ - q|/λ and e = y.k - y.k̄ cancels, so y and the weights always go through the matmuls as hi + lo
        # pairs; PREC 3 (λ < 0.1) splits y in three (hi + lo left e errors of ~1e-2 at λ = 0.01 on the first rows).
        yb, yl, yl2 = _split3(y, DT)
        yk = tl.sum(y * kbar, 1)
        acc = tl.zeros([BM, D], tl.float32)
        for start in range(0, hi, BN):
            offs_n = start + tl.arange(0, BN)
            k = _tile(Kb, offs_n, T, sk_t, offs_d, DIN)
            v = _tile(Vb, offs_n, T, sv_t, offs_d, DIN)
            a = tl.math.exp2(_scores(q, k, offs_m, offs_n, T, sc2) - lse2[:, None])
            e = tl.dot(yl, tl.trans(k), tl.dot(yb, tl.trans(k)))
            if PREC >= 3:
                e = tl.dot(yl2, tl.trans(k), e)
            wb, wl = _hi_lo(a * (1.0 - (e - yk[:, None])), DT)
            acc = tl.dot(wb, v, acc)
            acc = tl.dot(wl, v, acc)

    _put(_head(OUT, bh, NH, so_b, so_h), offs_m, T, so_t, offs_d, acc.to(DT), DIN)
    if STORE_Y:                                     # y, ν, lse, rows: (B·H, T, ·) at the padded width D
        tl.store(Y + bh * T * D + offs_m[:, None] * D + offs_d[None, :], y, mask=rmask[:, None])
    tl.store(LSE + bh * T + offs_m, lse2, mask=rmask)
    tl.store(ITS + bh * n_m + pid_m, it)


@triton.jit
def _lla_bwd_q(Q, K, V, G, LAM, Y, LSE, DQ, NU, ROWS, DLAM, ITS, CM, MOM, T, scale, sc2, tol2, max_iter, NH,
               sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, so_b, so_h, so_t,
               sl_b, sl_h, sl_t,
               D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, JACOBI: tl.constexpr, PREC: tl.constexpr,
               DR: tl.constexpr, DIRECT: tl.constexpr, LOAD_C: tl.constexpr, LOAD_M: tl.constexpr,
               DIN: tl.constexpr, VEC: tl.constexpr):
    """Per query tile: k̄, h = Σ a (Γ - Γ̄)(k - k̄) with Γ_j = g . v_j; ν = C⁻¹ h; dq = ν + scale Σ P (k - k̄).
    LOAD_C (with DIRECT): C is the forward's (``CM``), not summed again here. LOAD_M (with LOAD_C): h = Σ_VKᵀ g and
    Γ̄ = g . v̄ from the forward's Σ_VK, k̄, v̄ (``MOM``), and no pass over the keys before the solve."""
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t = sq_b * VEC, sq_h * VEC, sq_t * VEC, sk_b * VEC, sk_h * VEC, sk_t * VEC
    sv_b, sv_h, sv_t, sg_b, sg_h, sg_t = sv_b * VEC, sv_h * VEC, sv_t * VEC, sg_b * VEC, sg_h * VEC, sg_t * VEC
    so_b, so_h, so_t = so_b * VEC, so_h * VEC, so_t * VEC
    n_m = tl.cdiv(T, BM)
    pid_m = n_m - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    Kb, Vb = _head(K, bh, NH, sk_b, sk_h), _head(V, bh, NH, sv_b, sv_h)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    rmask = offs_m < T
    row_off = bh * T * D + offs_m[:, None] * D + offs_d[None, :]       # y and ν: (B·H, T, D)
    q = _tile(_head(Q, bh, NH, sq_b, sq_h), offs_m, T, sq_t, offs_d, DIN)
    DT = q.dtype
    g = _tile(_head(G, bh, NH, sg_b, sg_h), offs_m, T, sg_t, offs_d, DIN)
    y = tl.load(Y + row_off, mask=rmask[:, None], other=0.0)
    lam = tl.load(_head(LAM, bh, NH, sl_b, sl_h) + offs_m * sl_t, mask=rmask, other=1.0)
    lse2 = tl.load(LSE + bh * T + offs_m, mask=rmask, other=0.0)
    hi = tl.minimum(T, (pid_m + 1) * BM)

    if LOAD_M:                                     # the forward's moments: no pass over the keys here
        kbar, gbar, h = _stored_moments(MOM, bh * T + offs_m, rmask, g, D, DR, BM)
        dinv = h
    else:
        # pass 1: Σ a k, Σ a Γ k, Σ a Γ (and Σ a k∘k for Jacobi). PREC >= 1: a and a Γ as hi + lo (an error in h
        # goes into ν through C⁻¹ like a CG residual; k̄ must match the forward's)
        kb = tl.zeros([BM, D], tl.float32)
        tg = tl.zeros([BM, D], tl.float32)
        dg = tl.zeros([BM, D], tl.float32)
        asum = tl.zeros([BM], tl.float32)
        gsum = tl.zeros([BM], tl.float32)
        s2 = tl.zeros([BM, DR * DR], tl.float32)
        for start in range(0, hi, BN):
            offs_n = start + tl.arange(0, BN)
            k = _tile(Kb, offs_n, T, sk_t, offs_d, DIN)
            v = _tile(Vb, offs_n, T, sv_t, offs_d, DIN)
            a = tl.math.exp2(_scores(q, k, offs_m, offs_n, T, sc2) - lse2[:, None])
            gam = tl.dot(g, tl.trans(v))
            ab, al = _hi_lo(a, DT)
            agb, agl = _hi_lo(a * gam, DT)
            tg = tl.dot(agb, k, tg)
            if DIRECT:                                  # a as _moment_dot splits it, in k̄ and Σa too
                ab, am, al = _split3(a, DT)
                kb = tl.dot(am, k, tl.dot(ab, k, kb))
                asum += tl.sum(ab.to(tl.float32) + am.to(tl.float32), 1)
                if PREC >= 2:
                    kb = tl.dot(al, k, kb)
                    asum += tl.sum(al.to(tl.float32), 1)
                if PREC >= 1:
                    tg = tl.dot(agl, k, tg)
                    gsum += tl.sum(agb.to(tl.float32) + agl.to(tl.float32), 1)
                else:
                    gsum += tl.sum(agb.to(tl.float32), 1)
                if not LOAD_C:
                    kr = _rows(Kb, offs_n, T, sk_t, DR, DIN)
                    kkh, kkl = _outer(kr, kr, BN, DR, DT)
                    s2 = _moment_dot(ab, am, al, kkh, kkl, s2, PREC)
            elif PREC >= 1:
                kb = tl.dot(ab, k, kb)
                kb = tl.dot(al, k, kb)
                tg = tl.dot(agl, k, tg)
                asum += tl.sum(ab.to(tl.float32) + al.to(tl.float32), 1)
                gsum += tl.sum(agb.to(tl.float32) + agl.to(tl.float32), 1)
            else:
                kb = tl.dot(ab, k, kb)
                asum += tl.sum(ab.to(tl.float32), 1)
                gsum += tl.sum(agb.to(tl.float32), 1)
            if JACOBI:
                kf = k.to(tl.float32)
                dg = tl.dot(ab, (kf * kf).to(DT), dg)
        asum = tl.where(asum > 0, asum, 1.0)
        kbar = kb / asum[:, None]
        gbar = gsum / asum
        h = tg / asum[:, None] - gbar[:, None] * kbar
        if JACOBI:
            diag = dg / asum[:, None] - kbar * kbar + lam[:, None]
            dinv = 1.0 / tl.maximum(diag, lam[:, None])
        else:
            dinv = h
    if DIRECT:
        if LOAD_C:
            nu = _direct_substitute(CM, bh * T + offs_m, rmask, h, D, DR, BM)
        else:
            nu = _direct_solve(s2, asum, kbar, lam, h, D, DR, BM)
        it = tl.full([], 0, tl.int32)
    else:
        nu, it = _cg_solve(h, q, kbar, lse2, lam, dinv, Kb, sk_t, offs_m, offs_d, hi, T, sc2, tol2, max_iter,
                           D, BN, JACOBI, PREC, PREC >= 3, DIN)
    yb, yl, yl2 = _split3(y, DT)
    nb, nl = _hi_lo(nu, DT)
    if PREC >= 1:
        yk = tl.sum(y * kbar, 1)
        nk = tl.sum(nu * kbar, 1)
    else:                                          # the row constants of the y, ν the matmuls see
        yk = tl.sum(yb.to(tl.float32) * kbar, 1)
        nk = tl.sum(nb.to(tl.float32) * kbar, 1)
    dlam = tl.sum(nu * y, 1)
    lnu = lam * dlam

    # pass 2: P = a ((Γ - Γ̄ - f)(1 - e) + λ ν.y), e = y.(k - k̄), f = ν.(k - k̄). PREC >= 1: y and ν as hi + lo
    # (|y| is up to |k̄ - q|/λ, and f multiplies y in dk)
    acc = tl.zeros([BM, D], tl.float32)
    psum = tl.zeros([BM], tl.float32)
    for start in range(0, hi, BN):
        offs_n = start + tl.arange(0, BN)
        k = _tile(Kb, offs_n, T, sk_t, offs_d, DIN)
        v = _tile(Vb, offs_n, T, sv_t, offs_d, DIN)
        a = tl.math.exp2(_scores(q, k, offs_m, offs_n, T, sc2) - lse2[:, None])
        gam = tl.dot(g, tl.trans(v))
        yk_j = tl.dot(yb, tl.trans(k))
        if PREC >= 1:
            yk_j = tl.dot(yl, tl.trans(k), yk_j)
            if PREC >= 3:
                yk_j = tl.dot(yl2, tl.trans(k), yk_j)
        psi = 1.0 - (yk_j - yk[:, None])
        f = tl.dot(nb, tl.trans(k))
        if PREC >= 1:
            f = tl.dot(nl, tl.trans(k), f)
        f = f - nk[:, None]
        pb = (a * ((gam - gbar[:, None] - f) * psi + lnu[:, None])).to(DT)
        acc = tl.dot(pb, k, acc)
        psum += tl.sum(pb.to(tl.float32), 1)
    dq = nu + scale * (acc - psum[:, None] * kbar)
    _put(_head(DQ, bh, NH, so_b, so_h), offs_m, T, so_t, offs_d, dq.to(DT), DIN)
    tl.store(NU + row_off, nu, mask=rmask[:, None])
    rows = ROWS + (bh * T + offs_m) * 4
    tl.store(rows, yk, mask=rmask)
    tl.store(rows + 1, nk, mask=rmask)
    tl.store(rows + 2, gbar, mask=rmask)
    tl.store(rows + 3, lnu, mask=rmask)
    tl.store(DLAM + bh * T + offs_m, dlam, mask=rmask)
    tl.store(ITS + bh * n_m + pid_m, it)


@triton.jit
def _lla_bwd_kv(Q, K, V, G, Y, NU, LSE, ROWS, DK, DV, T, scale, sc2, NH,
                sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, so_b, so_h, so_t,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, DIN: tl.constexpr,
                VEC: tl.constexpr):
    """Per key tile: dv = Σ_i a ψ g_i; dk = Σ_i scale P q_i - a ψ ν_i + a (f - Γ + Γ̄) y_i.

    PREC >= 1: y and ν (in e and f) and the dv weights a ψ go through the matmuls as hi + lo (PREC 3: y in three
    parts). The three dk matmuls stay one-part: splitting both operands (hi.hi + hi.lo + lo.hi) moved dk by
    < 5e-4 at λ = 0.01, D = 64, q x 4."""
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t = sq_b * VEC, sq_h * VEC, sq_t * VEC, sk_b * VEC, sk_h * VEC, sk_t * VEC
    sv_b, sv_h, sv_t, sg_b, sg_h, sg_t = sv_b * VEC, sv_h * VEC, sv_t * VEC, sg_b * VEC, sg_h * VEC, sg_t * VEC
    so_b, so_h, so_t = so_b * VEC, so_h * VEC, so_t * VEC
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k = _tile(_head(K, bh, NH, sk_b, sk_h), offs_n, T, sk_t, offs_d, DIN)
    v = _tile(_head(V, bh, NH, sv_b, sv_h), offs_n, T, sv_t, offs_d, DIN)
    Qb, Gb = _head(Q, bh, NH, sq_b, sq_h), _head(G, bh, NH, sg_b, sg_h)
    DT = k.dtype
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    start_m = (pid_n * BN // BM) * BM
    for start in range(start_m, T, BM):
        offs_m = start + tl.arange(0, BM)
        rmask = offs_m < T
        row_off = bh * T * D + offs_m[:, None] * D + offs_d[None, :]   # y and ν: (B·H, T, D)
        q = _tile(Qb, offs_m, T, sq_t, offs_d, DIN)
        g = _tile(Gb, offs_m, T, sg_t, offs_d, DIN)
        yb, yl, yl2 = _split3(tl.load(Y + row_off, mask=rmask[:, None], other=0.0), DT)
        nb, nl = _hi_lo(tl.load(NU + row_off, mask=rmask[:, None], other=0.0), DT)
        lse2 = tl.load(LSE + bh * T + offs_m, mask=rmask, other=0.0)
        rows = ROWS + (bh * T + offs_m) * 4
        yk = tl.load(rows, mask=rmask, other=0.0)
        nk = tl.load(rows + 1, mask=rmask, other=0.0)
        gbar = tl.load(rows + 2, mask=rmask, other=0.0)
        lnu = tl.load(rows + 3, mask=rmask, other=0.0)
        a = tl.math.exp2(_scores(q, k, offs_m, offs_n, T, sc2) - lse2[:, None])
        dl = tl.dot(g, tl.trans(v)) - gbar[:, None]
        yk_j = tl.dot(yb, tl.trans(k))
        if PREC >= 1:
            yk_j = tl.dot(yl, tl.trans(k), yk_j)
            if PREC >= 3:
                yk_j = tl.dot(yl2, tl.trans(k), yk_j)
        apsi = a * (1.0 - (yk_j - yk[:, None]))
        f = tl.dot(nb, tl.trans(k))
        if PREC >= 1:
            f = tl.dot(nl, tl.trans(k), f)
        f = f - nk[:, None]
        apsi_b, apsi_l = _hi_lo(apsi, DT)
        dv = tl.dot(tl.trans(apsi_b), g, dv)
        if PREC >= 1:
            dv = tl.dot(tl.trans(apsi_l), g, dv)
        p = (dl - f) * apsi + a * lnu[:, None]
        dk = tl.dot(tl.trans((p * scale).to(DT)), q, dk)
        dk = tl.dot(tl.trans(-apsi_b), nb, dk)
        dk = tl.dot(tl.trans((a * (f - dl)).to(DT)), yb, dk)
    _put(_head(DK, bh, NH, so_b, so_h), offs_n, T, so_t, offs_d, dk.to(DT), DIN)
    _put(_head(DV, bh, NH, so_b, so_h), offs_n, T, so_t, offs_d, dv.to(DT), DIN)


def _heads4(t):
    """(B, H, T, D) with a unit last stride as it is, else made so; (BH, T, D) as (1, BH, T, D)."""
    t = t if t.dim() == 4 else t.unsqueeze(0)
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t):
    return t.stride(0), t.stride(1), t.stride(2)


def _io_strides(*ts) -> tuple[int, list[int]]:
    """(VEC, the (b, h, t) strides of each tensor in units of VEC): ``mixzoo.kernels.aligned_strides``; without it the
    rows of a head of 8 were read element by element, 0.84-0.89x the step at length 1024 (``heads_mode``)."""
    return aligned_strides([s for t in ts for s in _strides(t)])


def _out_like(t4, three_d: bool):
    """An output for inputs like t4 (B, H, T, D): for (BH, T, D) callers (B = 1) contiguous as theirs, else (B, H, T, D)
    stored as (B, T, H, D), so that merging the heads is a view and a (B, T, H, D) producer's gradient is too."""
    B, H, T, D = t4.shape
    return torch.empty_like(t4, memory_format=torch.contiguous_format) if three_d else \
        torch.empty(B, T, H, D, device=t4.device, dtype=t4.dtype).transpose(1, 2)


def _ridge_rows(lam, B, H, T):
    """λ as a (B, H, T) float32 view (a per-head λ broadcast with zero strides, nothing copied); (BH, T) as (1, BH, T)."""
    lam = lam.to(torch.float32)
    return lam.unsqueeze(0) if lam.dim() == 2 else lam.broadcast_to(B, H, T)


# The explicit solve's forward and query-pass kernels at 3 stages (heads of at most 8, padded to 16): on the H200
# (BH 2048, λ 1, the backward taking the forward's C) the forward 0.94-0.98x and the query pass 0.98x the time at 2
# stages at lengths 128-1024, the same outputs (benchmarks/h200-2026-12-03d/lla-c-tiles-02d5346.log)
CONFIGS_DIRECT = {"fwd": {16: (64, 64, 4, 3)}, "bwd_q": {16: (64, 64, 4, 3)}}


def _cfg(kind, dp, override, direct=False):
    if override and kind in override:
        return override[kind]
    if direct and dp in CONFIGS_DIRECT.get(kind, {}):
        return CONFIGS_DIRECT[kind][dp]
    return CONFIGS[kind][dp]


# Precision level of a launch from its smallest ridge (module docstring; measured in benchmarks/lla_small_ridge.py):
# PREC >= n where λ.min() < PREC_BELOW[n - 1]. From PREC 2 on CG needs up to ~2 D iterations (the spectrum of C
# spans λ..a|k - k̄|², up to ~D), so the cap is raised to at least SMALL_RIDGE_ITERS_PER_DIM x the padded head dim.
PREC_BELOW = (10.0, 3.0, 0.1)
SMALL_RIDGE_ITERS_PER_DIM = 4


def precision_level(lam_min: float) -> int:
    """The precision level for a launch whose smallest ridge is ``lam_min`` (module docstring)."""
    return sum(lam_min < t for t in PREC_BELOW)


def _iter_cap(max_iter, prec, Dp):
    return max(max_iter, SMALL_RIDGE_ITERS_PER_DIM * Dp) if prec >= 2 else max_iter


def lla_forward(q, k, v, lam, scale, tol, max_iter, jacobi, cfg=None, store_y=True, prec=None, dr=None,
                onepass=None, cm=None, mom=None):
    """q, k, v: (B, H, T, D) at any strides with a unit last one (a projection's head views), read at their width D
    and zero-padded in registers to ``padded_dim(D)``; or (BH, T, D) contiguous. lam: λ per row, (BH, T), or
    broadcastable to (B, H, T) (a per-head λ is read through zero strides). The output is (B, H, T, D) stored as
    (B, T, H, D) (``_out_like``; (BH, T, D) for (BH, T, D) inputs).

    ``prec`` (default: ``precision_level(lam.min())``) is the precision level; the backward must get the same.
    ``dr``: solve directly (``_direct_solve``) over the first ``dr`` head dims (4 or 8; the others zero), else CG;
    with it, ``onepass`` (default ``DEFAULTS["onepass"]``) sums Σ a v and Σ a v kᵀ in the moment pass and forms
    the output from them, without the output pass; and ``cm`` (a (BH, T, dr·dr) fp32 tensor, optional) receives
    each row's C for the backward (``lla_backward(cm=...)``); ``mom`` (a (BH, T, dr·dr + 2·dr) fp32 tensor, with
    ``cm`` and the one-pass output) receives each row's Σ_VK, k̄ and v̄ for the backward (``lla_backward(mom=...)``).
    Returns o, y (fp32, (BH, T, padded_dim(D))), lse (log2-sum-exp per row), and the CG iterations per query tile
    (0: direct)."""
    three_d = q.dim() == 3
    q4, k4, v4 = (_heads4(t) for t in (q, k, v))
    B, H, T, D = q4.shape
    BH, Dp = B * H, padded_dim(D)
    lam4 = _ridge_rows(lam, B, H, T)
    prec = precision_level(float(lam.min())) if prec is None else int(prec)
    BM, BN, nw, ns = _cfg("fwd", Dp, cfg, direct=dr is not None)
    o = _out_like(q4, three_d)
    y = torch.empty(BH, T, Dp, device=q.device, dtype=torch.float32) if store_y else torch.empty(1, device=q.device)
    lse = torch.empty(BH, T, device=q.device, dtype=torch.float32)
    n_m = triton.cdiv(T, BM)
    its = torch.empty(BH, n_m, device=q.device, dtype=torch.int32)
    _check_cm(cm, BH, T, dr)
    onepass = dr is not None and (DEFAULTS["onepass"] if onepass is None else bool(onepass))
    _check_mom(mom, cm, BH, T, dr, onepass)
    vec, io = _io_strides(q4, k4, v4, o)
    _lla_fwd[(n_m, BH)](q4, k4, v4, lam4, o, y, lse, its, lse if cm is None else cm, lse if mom is None else mom, T,
                        scale * LOG2E, tol * tol, _iter_cap(max_iter, prec, Dp), H, *io, *_strides(lam4), D=Dp, BM=BM,
                        BN=BN, JACOBI=jacobi, STORE_Y=store_y, PREC=prec, DR=dr or 4, DIRECT=dr is not None,
                        ONEPASS=onepass, STORE_C=cm is not None, STORE_M=mom is not None, DIN=D, VEC=vec,
                        num_warps=nw, num_stages=ns)
    return (o[0] if three_d else o), y, lse, its


def _check_cm(cm, BH, T, dr):
    if cm is not None and (dr is None or tuple(cm.shape) != (BH, T, dr * dr) or cm.dtype != torch.float32
                           or not cm.is_contiguous()):
        raise ValueError(f"lla: cm must be a contiguous float32 ({BH}, {T}, dr*dr) tensor with the explicit solve "
                         f"(dr={dr}), got {None if cm is None else (tuple(cm.shape), cm.dtype)}")


def _check_mom(mom, cm, BH, T, dr, onepass=True):
    if mom is not None and (cm is None or not onepass or tuple(mom.shape) != (BH, T, dr * dr + 2 * dr)
                            or mom.dtype != torch.float32 or not mom.is_contiguous()):
        raise ValueError(f"lla: mom must be a contiguous float32 ({BH}, {T}, dr*dr + 2*dr) tensor, with cm and the "
                         f"one-pass output (dr={dr}), got {None if mom is None else (tuple(mom.shape), mom.dtype)}")


def lla_backward(q, k, v, g, lam, y, lse, scale, tol, max_iter, jacobi, cfg=None, prec=None, dr=None, cm=None,
                 mom=None):
    """Returns dq, dk, dv (laid out as ``lla_forward``'s output), dλ (fp32, (BH, T)) and the CG iterations per query
    tile (inputs as ``lla_forward``'s, g like the output; ``prec``, ``dr`` as the forward's; ``cm``: the forward's
    C, from ``lla_forward(cm=...)``, else C is summed again; ``mom``: the forward's Σ_VK, k̄, v̄, from
    ``lla_forward(mom=...)``, else h is summed over the keys)."""
    prec = precision_level(float(lam.min())) if prec is None else int(prec)
    three_d = q.dim() == 3
    q4, k4, v4, g4 = (_heads4(t) for t in (q, k, v, g))
    B, H, T, D = q4.shape
    BH, Dp = B * H, padded_dim(D)
    lam4 = _ridge_rows(lam, B, H, T)
    BM, BN, nw, ns = _cfg("bwd_q", Dp, cfg, direct=dr is not None)
    dq, dk, dv = (_out_like(q4, three_d) for _ in range(3))
    nu = torch.empty(BH, T, Dp, device=q.device, dtype=torch.float32)
    rows = torch.empty(BH, T, 4, device=q.device, dtype=torch.float32)
    dlam = torch.empty(BH, T, device=q.device, dtype=torch.float32)
    n_m = triton.cdiv(T, BM)
    its = torch.empty(BH, n_m, device=q.device, dtype=torch.int32)
    _check_cm(cm, BH, T, dr)
    _check_mom(mom, cm, BH, T, dr)
    vec, io = _io_strides(q4, k4, v4, g4, dq)
    _lla_bwd_q[(n_m, BH)](q4, k4, v4, g4, lam4, y, lse, dq, nu, rows, dlam, its, lse if cm is None else cm,
                          lse if mom is None else mom, T, scale, scale * LOG2E, tol * tol, _iter_cap(max_iter, prec, Dp),
                          H, *io, *_strides(lam4), D=Dp, BM=BM, BN=BN, JACOBI=jacobi, PREC=prec, DR=dr or 4,
                          DIRECT=dr is not None, LOAD_C=cm is not None, LOAD_M=mom is not None, DIN=D, VEC=vec,
                          num_warps=nw, num_stages=ns)
    BM, BN, nw, ns = _cfg("bwd_kv", Dp, cfg)
    _lla_bwd_kv[(triton.cdiv(T, BN), BH)](q4, k4, v4, g4, y, nu, lse, rows, dk, dv, T, scale, scale * LOG2E, H, *io,
                                          D=Dp, BM=BM, BN=BN, PREC=prec, DIN=D, VEC=vec, num_warps=nw,
                                          num_stages=ns)
    if three_d:
        dq, dk, dv = dq[0], dk[0], dv[0]
    return dq, dk, dv, dlam, its


def heads_mode() -> str:
    """How ``lla`` hands the kernels q, k, v and the output gradient (``MIXZOO_LLA_HEADS``): ``strided`` (the default),
    as they lie (with the qkv prologue, ``models.lla``, views of its (B, T, H, D) output: no copy); ``padded``,
    zero-padded (B·H, T, padded width) copies, λ materialized per row; ``contiguous``, each head's rows contiguous at
    the head's width, (B, H, T, D), copied so only where they are not (a projection's views). Except ``padded``, λ per
    head through zero strides, the output and gradients written as (B, T, H, D). The kernels read q, k, v and g once
    per tile of the other side. Timed with the strides in units of the rows' alignment (``_io_strides``; the three
    compile to the same loads, tests/test_kernels_compile.py), stacked+graphed K = 6 at MAD's shape on an H200
    (benchmarks/calls-2026-12-06f): strided from the prologue 1.07x / 1.06x / 1.06x / 1.03x the padded copies' step at
    lengths 128 / 256 / 512 / 1024, contiguous 1.05x / 1.04x / 1.03x / 1.01x. Before that alignment rows of 8 were
    read element by element and the step at 1024 was 0.84x (strided) the padded copies' (benchmarks/calls-2026-12-06e)."""
    mode = chosen("MIXZOO_LLA_HEADS")
    return mode if mode in LLA_HEADS else LLA_HEADS[0]


def _as_mode(t, mode: str, Dp: int):
    if mode == "padded":
        return _padded_copy(t, Dp)
    t = _heads4(t)
    return t.contiguous() if mode == "contiguous" else t


def _padded_copy(t, Dp):
    B, H, T, D = t.shape
    return torch.nn.functional.pad(t, (0, Dp - D)).reshape(B * H, T, Dp).contiguous()


class LLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ridge, scale, tol, max_iter, jacobi, cfg, store, prec, solve):
        B, H, T, D = q.shape
        dr = direct_dims(D, solve)
        dtype = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        mode = heads_mode()
        pad = mode == "padded"
        # the heads at their width (padded in registers), read through their strides (``heads_mode``)
        qq, kk, vv = (_as_mode(t.to(dtype), mode, padded_dim(D)) for t in (q, k, v))
        if torch.is_tensor(ridge):                # (B, H, T) through zero strides where λ is per head: no copy
            lam = ridge.detach().to(torch.float32).broadcast_to(B, H, T)
        else:
            lam = torch.full((1, 1, 1), float(ridge), device=q.device, dtype=torch.float32).expand(B, H, T)
        if pad:
            lam = lam.reshape(B * H, T).contiguous()
        if prec is None:                          # a float ridge needs no device sync
            prec = precision_level(float(lam.min()) if torch.is_tensor(ridge) else float(ridge))
        if dr is not None:
            prec = direct_prec(prec)
        # with the explicit solve, the forward's C is kept for the backward's ν solve (``c_from_forward``): the
        # backward's query pass then sums no second moments (dr·dr floats a row kept instead)
        cm = (torch.empty(B * H, T, dr * dr, device=q.device, dtype=torch.float32)
              if store and dr is not None and c_from_forward() else None)
        # and its Σ_VK, k̄, v̄ (``h_from_forward``; the output then formed from them): the query pass makes no pass
        # over the keys before its solve
        mom = (torch.empty(B * H, T, dr * dr + 2 * dr, device=q.device, dtype=torch.float32)
               if cm is not None and h_from_forward() else None)
        o, y, lse, its = lla_forward(qq, kk, vv, lam, scale, tol, max_iter, jacobi, cfg, store_y=store, prec=prec,
                                     dr=dr, cm=cm, mom=mom, onepass=True if mom is not None else None)
        ctx.save_for_backward(qq, kk, vv, lam, y, lse, cm, mom)
        ctx.meta = (B, H, T, D, scale, tol, max_iter, jacobi, cfg, prec, dr, q.dtype,
                    ridge.shape if torch.is_tensor(ridge) else None)
        ctx.fwd_iters = its
        ctx.mode = mode
        return (o.reshape(B, H, T, -1)[..., :D] if pad else o).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_o):
        qq, kk, vv, lam, y, lse, cm, mom = ctx.saved_tensors
        B, H, T, D, scale, tol, max_iter, jacobi, cfg, prec, dr, in_dtype, ridge_shape = ctx.meta
        g = _as_mode(grad_o.to(qq.dtype), ctx.mode, qq.shape[-1])
        dq, dk, dv, dlam, _ = lla_backward(qq, kk, vv, g, lam, y, lse, scale, tol, max_iter, jacobi, cfg, prec, dr,
                                           cm=cm, mom=mom)
        grads = [(t.reshape(B, H, T, -1)[..., :D] if ctx.mode == "padded" else t).to(in_dtype) for t in (dq, dk, dv)]
        dridge = None
        if ridge_shape is not None and ctx.needs_input_grad[3]:
            dridge = dlam.reshape(B, H, T)
            dridge = dridge.sum_to_size(ridge_shape) if tuple(ridge_shape) != (B, H, T) else dridge
        return (*grads, dridge, None, None, None, None, None, None, None, None)


def lla(q, k, v, *, ridge, scale=None, tol=None, max_iter=None, jacobi=None, cfg=None, prec=None, solve=None):
    """Causal LLA on (B, H, T, D) CUDA tensors (bf16/fp16; fp32 inputs run in bf16) -> (B, H, T, D).

    The kernels read q, k, v and the output gradient through their strides (any, with a unit last one) at the head's
    width, zero-padded in registers to ``padded_dim(D)``. How they are handed over is ``heads_mode``
    (``MIXZOO_LLA_HEADS``): by default as they lie (``strided``), or at their width contiguous per head
    (``contiguous``), each with a λ per head through zero strides and the output and dq, dk, dv written as
    (B, H, T, D) views of (B, T, H, D) tensors; or zero-padded contiguous copies (``padded``); the same numbers (bit
    for bit in the interpreter, tests/test_lla_kernel_interpret.py).

    ``ridge`` is λ: a float or a tensor broadcastable to (B, H, T); it gets a gradient when it requires one.
    ``tol`` (relative CG residual), ``max_iter`` and ``jacobi`` default to ``DEFAULTS``; ``prec`` (the precision
    level, module docstring) defaults to ``precision_level(λ.min())``. ``solve``: "auto" (``direct_dims``: the
    explicit solve for heads of at most ``DIRECT_MAX_DIM`` dims, CG above), "cg" or "direct"; default
    ``DEFAULTS["solve"]``.
    """
    if q.dim() != 4:
        raise ValueError(f"lla: expected (B, H, T, D) inputs, got shape {tuple(q.shape)}")
    D = q.shape[-1]
    if not 1 <= D <= 128:
        raise ValueError(f"lla: head dim {D} not supported (1..128)")
    scale = D ** -0.5 if scale is None else float(scale)
    tol = DEFAULTS["tol"] if tol is None else float(tol)
    max_iter = DEFAULTS["max_iter"] if max_iter is None else int(max_iter)
    jacobi = DEFAULTS["jacobi"] if jacobi is None else bool(jacobi)
    # y is kept for the backward only when one can follow (autograd.Function.forward itself runs without grad)
    store = torch.is_grad_enabled() and any(torch.is_tensor(t) and t.requires_grad for t in (q, k, v, ridge))
    solve = solve or DEFAULTS["solve"]
    if solve not in SOLVES:
        raise ValueError(f"lla: solve={solve!r}; allowed: {', '.join(SOLVES)}")
    if solve == "direct" and D > DIRECT_MAX_DIM:
        raise ValueError(f"lla: solve='direct' needs a head dim of at most {DIRECT_MAX_DIM}, got {D}")
    return LLAFunction.apply(q, k, v, ridge, scale, tol, max_iter, jacobi, cfg, store, prec, solve)


__all__ = ["lla", "lla_forward", "lla_backward", "LLAFunction", "CONFIGS", "DEFAULTS", "PREC_BELOW",
           "precision_level", "direct_dims", "DIRECT_MAX_DIM", "SOLVES"]
