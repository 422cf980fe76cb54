"""The Triton kernels behind ``mixzoo.kernels.rmsnorm`` (imported only when they are to run).

Layout: x (G, R, D) contiguous, one weight row per group w (G, D); a program takes BR rows of one
group, the whole row of D (padded to a power of two) in registers. Backward: dx per row, and per
program the partial sums of dy x̂ over its rows, summed per group by the caller. With ``GATE`` the
norm is of x silu(z) (Mamba-2's gated norm), z like x: the product is formed in registers, forward and
backward, never written. With ``POST`` the gate comes after the norm: y = norm(x) w silu(z) in z's dtype (the gated
output norm of gdn, GLA and MesaNet, fla's ``norm_before_gate=True``), z read through its strides as (G, tokens, ZH,
D) rows (a split view of a projection's output, no copy), silu(z) and its gradient rounded to z's dtype as
PyTorch's silu on z rounds them. With ``RES`` the norm is of s = x + r (a residual add before a pre-norm), s written
in x's dtype and normed as written; backward, the gradient s gets from elsewhere (``ds``) is added to the
norm's, and that sum is the gradient of x and of r (in r's dtype), so the add's forward and the sum of the
two gradients are no separate passes over the activations."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _zoff(g, rows, cols, ZH, zs_g, zs_t, zs_h):
    """Offsets of the gate's (rows, cols) for ``POST``: row = token * ZH + head, the gate's strides per group, token and
    head (its columns contiguous)."""
    tok, hd = rows // ZH, rows % ZH
    return (g.to(tl.int64) * zs_g + tok.to(tl.int64)[:, None] * zs_t + (hd * zs_h)[:, None] + cols[None, :])


@triton.jit
def _fwd_kernel(x, z, w, y, rstd, res, s, R, D, NB, eps, ZH, zs_g, zs_t, zs_h, BR: tl.constexpr, BD: tl.constexpr,
                GATE: tl.constexpr, RES: tl.constexpr, POST: tl.constexpr):
    g, rb = tl.program_id(0), tl.program_id(1)
    rows = rb * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mr, mc = rows < R, cols < D
    m = mr[:, None] & mc[None, :]
    off = (g * R + rows).to(tl.int64)[:, None] * D + cols[None, :]
    xv = tl.load(x + off, mask=m, other=0.).to(tl.float32)
    if RES:         # s = x + r in float32, rounded to s's dtype (x's) as PyTorch's add rounds it; normed as stored
        sv = (xv + tl.load(res + off, mask=m, other=0.).to(tl.float32)).to(s.dtype.element_ty)
        tl.store(s + off, sv, mask=m)
        xv = sv.to(tl.float32)
    if GATE:
        zv = tl.load(z + off, mask=m, other=0.).to(tl.float32)
        xv = xv * zv * tl.sigmoid(zv)
    r = 1. / tl.sqrt(tl.sum(xv * xv, axis=1) / D + eps)
    wv = tl.load(w + g * D + cols, mask=mc, other=0.).to(tl.float32)
    yv = xv * r[:, None] * wv[None, :]
    if POST:        # times silu(z), silu rounded to z's dtype as F.silu(z) is; the product in float32, then y's dtype
        zv = tl.load(z + _zoff(g, rows, cols, ZH, zs_g, zs_t, zs_h), mask=m, other=0.).to(tl.float32)
        yv = yv * (zv * tl.sigmoid(zv)).to(z.dtype.element_ty).to(tl.float32)
    tl.store(y + off, yv.to(y.dtype.element_ty), mask=m)
    tl.store(rstd + g * R + rows, r, mask=mr)


@triton.jit
def _bwd_kernel(x, z, w, rstd, dy, dx, dz, dwp, ds, dr, R, D, NB, ZH, zs_g, zs_t, zs_h, BR: tl.constexpr,
                BD: tl.constexpr, GATE: tl.constexpr, HAS_DS: tl.constexpr, RES: tl.constexpr, POST: tl.constexpr):
    g, rb = tl.program_id(0), tl.program_id(1)
    rows = rb * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mr, mc = rows < R, cols < D
    m = mr[:, None] & mc[None, :]
    off = (g * R + rows).to(tl.int64)[:, None] * D + cols[None, :]
    xv = tl.load(x + off, mask=m, other=0.).to(tl.float32)
    av = xv
    if GATE:
        zv = tl.load(z + off, mask=m, other=0.).to(tl.float32)
        sg = tl.sigmoid(zv)
        av = xv * zv * sg
    gv = tl.load(dy + off, mask=m, other=0.).to(tl.float32)
    r = tl.load(rstd + g * R + rows, mask=mr, other=0.)
    wv = tl.load(w + g * D + cols, mask=mc, other=0.).to(tl.float32)
    xh = av * r[:, None]
    if POST:        # out = y silu(z), y = x̂ w: y's gradient dy silu(z); silu's, dy y rounded to z's dtype (autograd's
        # gradient of a z-dtype silu), then silu's backward in float32 rounded to z's dtype
        zv = tl.load(z + _zoff(g, rows, cols, ZH, zs_g, zs_t, zs_h), mask=m, other=0.).to(tl.float32)
        sg = tl.sigmoid(zv)
        dsz = (gv * xh * wv[None, :]).to(z.dtype.element_ty).to(tl.float32)
        tl.store(dz + off, (dsz * sg * (1. + zv * (1. - sg))).to(dz.dtype.element_ty), mask=m)
        gv = gv * (zv * sg).to(z.dtype.element_ty).to(tl.float32)
    gw = gv * wv[None, :]
    c = tl.sum(gw * xh, axis=1) / D
    da = (gw - xh * c[:, None]) * r[:, None]
    if GATE:        # a = x silu(z): da/dx = silu(z), da/dz = x sigmoid(z) (1 + z (1 - sigmoid(z)))
        tl.store(dz + off, (da * xv * sg * (1. + zv * (1. - sg))).to(dz.dtype.element_ty), mask=m)
        da = da * zv * sg
    if HAS_DS:      # the gradient x (s) gets from its other uses
        da += tl.load(ds + off, mask=m, other=0.).to(tl.float32)
    tl.store(dx + off, da.to(dx.dtype.element_ty), mask=m)
    if RES:         # s = x + r: r's gradient is x's, in r's dtype
        tl.store(dr + off, da.to(dr.dtype.element_ty), mask=m)
    tl.store(dwp + ((g * NB + rb) * D + cols).to(tl.int64), tl.sum(gv * xh, axis=0), mask=mc)


#: a program's share: about ``TILE[0]`` elements (whole rows of D, padded to a power of two) on ``TILE[1]`` warps.
#: A launch parameter (``tile``) so that benchmarks/norm_tiles.py can time others. Each row is one program's, but
#: the warps can change the order of a row's sum (bit-equal to this default at every tiling timed but 2048
#: elements on 16 warps), and the weight gradient's partial sums follow the row blocks. Kept after that sweep
#: (H100, 2026-12-05, benchmarks/h100-2026-12-05b): the add-and-norm launches ran at 2.6-2.9 TB/s and no tiling
#: beat this one by more than 1 %.
TILE = (4096, 4)


def _blocks(R: int, D: int, tile: tuple[int, int] | None = None) -> tuple[int, int, int, int]:
    """(rows a program, D padded, programs a group, warps)."""
    floats, warps = tile or TILE
    BD = triton.next_power_of_2(D)
    BR = max(1, min(triton.next_power_of_2(R), floats // BD))
    return BR, BD, triton.cdiv(R, BR), warps


def _post_strides(x: torch.Tensor, z: torch.Tensor | None) -> tuple[int, int, int, int]:
    """(ZH, zs_g, zs_t, zs_h) of a ``POST`` gate z (G, tokens, ZH, D), its last stride 1; (1, 0, 0, 0) without."""
    if z is None:
        return 1, 0, 0, 0
    G, _, ZH, D = z.shape
    if z.stride(-1) != 1 or x.shape[-1] != D or z.shape[1] * ZH * G != x.shape[0] * x.shape[1]:
        raise ValueError(f"rmsnorm: a gate after the norm must be (G, tokens, heads, {x.shape[-1]}) with its last "
                         f"stride 1, got {tuple(z.shape)} with strides {z.stride()}")
    return ZH, z.stride(0), z.stride(1), z.stride(2)


def forward(x: torch.Tensor, w: torch.Tensor, eps: float, out_dtype: torch.dtype, z: torch.Tensor | None = None,
            r: torch.Tensor | None = None, tile: tuple[int, int] | None = None, post: torch.Tensor | None = None):
    """x (G, R, D) contiguous, w (G, D) contiguous (z like x: the norm of x silu(z)) -> y (G, R, D) in
    out_dtype, rstd (G, R) float32; with r like x (contiguous, any float dtype) the norm is of s = x + r, and
    -> y, rstd, s (x's dtype). With ``post`` (G, tokens, heads, D), tokens x heads = R, any strides but a last of 1:
    y = the norm of x times silu(post) (``POST``)."""
    G, R, D = x.shape
    y = torch.empty(G, R, D, dtype=out_dtype, device=x.device)
    rstd = torch.empty(G, R, dtype=torch.float32, device=x.device)
    s = None if r is None else torch.empty_like(x)
    BR, BD, NB, warps = _blocks(R, D, tile)
    ZH, *zs = _post_strides(x, post)
    gate = post if post is not None else z
    if G and R:
        _fwd_kernel[(G, NB)](x, x if gate is None else gate, w, y, rstd, x if r is None else r, y if s is None else s,
                             R, D, NB, float(eps), ZH, *zs, BR=BR, BD=BD, GATE=z is not None, RES=r is not None,
                             POST=post is not None, num_warps=warps)
    return (y, rstd) if r is None else (y, rstd, s)


def backward(x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, z: torch.Tensor | None = None,
             ds: torch.Tensor | None = None, r_dtype: torch.dtype | None = None, tile: tuple[int, int] | None = None,
             post: torch.Tensor | None = None):
    """-> dx (x's shape and dtype), dw (G, D) float32, dz (z's dtype; None without z). With ``ds`` (like x,
    contiguous) dx adds it (the gradient x got from its other uses). With ``r_dtype`` (the residual form, x then
    being s = x + r) also -> dr, the same gradient in r_dtype. With ``post`` (as ``forward``'s) dz is its gradient,
    (G, tokens, heads, D) contiguous in its dtype."""
    G, R, D = x.shape
    BR, BD, NB, warps = _blocks(R, D, tile)
    dx = torch.empty_like(x)
    ZH, *zs = _post_strides(x, post)
    if post is not None:
        z, dz = post, torch.empty(post.shape, dtype=post.dtype, device=x.device)
    else:
        dz = None if z is None else torch.empty_like(z)
    dr = None if r_dtype is None else torch.empty(G, R, D, dtype=r_dtype, device=x.device)
    dwp = torch.empty(G, NB, D, dtype=torch.float32, device=x.device)
    if G and R:
        _bwd_kernel[(G, NB)](x, x if z is None else z, w, rstd, dy, dx, dx if z is None else dz, dwp,
                             dx if ds is None else ds, dx if dr is None else dr, R, D, NB, ZH, *zs, BR=BR, BD=BD,
                             GATE=z is not None and post is None, HAS_DS=ds is not None, RES=dr is not None,
                             POST=post is not None, num_warps=warps)
    out = dx, dwp.sum(1), dz
    return out if r_dtype is None else (*out, dr)
