"""Mamba: selective state-space models. Mamba-2 (Dao & Gu, 2024) by default, Mamba-1 (Gu & Dao,
2023) with ``version=1``.

Mamba-2 per head: h_t = a_t h_{t-1} + B_t (dt_t x_t)ᵀ, y_t = h_tᵀ C_t + D x_t with a scalar
a_t = exp(A dt_t), A < 0; B, C shared by the heads. That is simple gated linear attention with
q = C, k = B dt, v = x, log-decay A dt, which is how it runs: ``torch-chunk`` is
``_scan.simple_gla_chunk`` (plain PyTorch, fully parallel, the CPU path and the reference; B and C
enter once for all heads with dt as a per-head key scale, the SSD form) and
``fla-simple-gla`` is fla's Triton ``chunk_simple_gla`` on a GPU, taken by ``backend="auto"`` for value
heads of at least 64 (``FLA_MIN_HEAD_DIM``; narrower heads would be zero-padded to 64, which
``backend="fla"`` does and which measured slower than ``torch-chunk``). On Hopper with Triton < 3.7.1,
where fla refuses its gated ``chunk_bwd_dqkwg`` kernel, that one backward step runs as mixzoo's
one-launch Triton version where it has matched mixzoo's PyTorch version on the device
(``fla-simple-gla+triton-dqkwg``), else as that PyTorch version (``fla-simple-gla+torch-dqkwg``;
``mixzoo.kernels.fla_dqkwg``).

Narrower value heads (the mad recipe's 16 heads of 16) run on a GPU as mamba-ssm's Triton SSD
(``mamba_chunk_scan_combined``, the official Mamba-2 kernels: softplus(dt + dt_bias), the skip D x
and the scan in one call; backend ``mamba-ssm-ssd``) where that package is installed and its kernels
have matched ``ssd_reference`` on the device at the layer's head, state and chunk sizes
(``ssd_usable``), else as ``torch-chunk``. ``MIXZOO_MAMBA_SSD=torch-chunk`` keeps ``torch-chunk``
(to time one against the other); ``backend="mamba-ssm"`` asks for the SSD and fails where it cannot
run. Measured on one H200 (benchmarks/mamba_ssd.py, 16 heads of 16, d_state 64, batch 768): the
SSD's forward and backward 1.02 / 1.36 / 1.38 / 1.37x torch-chunk's at lengths 128 / 256 / 512 / 1024.
Stacked steps fold the models into its heads, the K models' B and C as its K groups
(``mixzoo.train.vmapfold``), in several calls where one would give torch's cumsum in its backward more rows
than it scans well (``vmapfold.ssd_models_per_call``; ``MIXZOO_MAMBA_SSD_FOLD=whole`` keeps one call).

``allow_neg_eigval`` maps the transition a in (0, 1) to 2a - 1 in (-1, 1) (Grazzi et al., 2025,
for state tracking); signed decays run on ``torch-chunk`` only.

Mamba-1 (per channel and state dimension decays) uses mamba-ssm's CUDA ``selective_scan_fn``
when that package is installed with its compiled kernels (backend ``mamba-ssm``); otherwise a
step-by-step PyTorch scan (``torch-scan-slow``), which on a GPU is about two seconds a training
step at length 1024 and says so on stderr.
"""
from __future__ import annotations

import functools
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import MAMBA_SSD, switch_error
from ..kernels._check import DeviceCheck
from ..registry import register_mixer
from . import _fla
from ._parts import ConvAct, dt_bias_init
from ._scan import simple_gla_chunk
from .common import RMSNorm

# fla's chunk_simple_gla on an H200 (Triton 3.6, with mixzoo's dqkwg step) at d_state 64: value heads of 16
# gave wrong input gradients (relative error 12-24 against float64 at the mad recipe's 16 heads, a non-finite
# gradient at the first step) and heads of 32 an illegal memory access; 64 and 128 match the reference. The
# value head is zero-padded to 64 there (exact: zero value columns give zero output columns, sliced off)
# when fla is asked for; "auto" takes fla only for heads that need no padding. Measured on one H200
# (bench mixers, one layer forward+backward, bf16, as one CUDA graph / eagerly): at the mad recipe's 16
# heads of 16 (batch 128, length 128) fla padded 3.85 / 6.68 ms, torch-chunk 2.92 / 7.20 ms; at 2 heads
# of 128 (batch 8, length 1024) fla 0.93 / 5.54 ms, torch-chunk 1.12 / 4.60 ms.
FLA_MIN_HEAD_DIM = 64


@functools.cache
def _selective_scan_cuda():
    """mamba-ssm's compiled selective scan, or None (never stubs the extension)."""
    try:
        import selective_scan_cuda  # noqa: F401
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
        return selective_scan_fn
    except Exception:
        return None


@functools.cache
def ssd_combined():
    """mamba-ssm's Triton SSD entry point (``mamba_chunk_scan_combined``, the official Mamba-2 kernels), or
    None. Those kernels are Triton only, but the package's ``__init__`` imports its compiled selective-scan
    extension first, which a source install without CUDA builds lacks; so where the package has not been
    imported, its modules are loaded under a bare package module (the package's own folder, its ``__init__``
    not run). Nothing is stubbed: whatever needs the extension still fails to import."""
    import importlib
    import importlib.util
    import types
    try:
        if "mamba_ssm" not in sys.modules:
            spec = importlib.util.find_spec("mamba_ssm")
            if spec is None or not spec.submodule_search_locations:
                return None
            pkg = types.ModuleType("mamba_ssm")
            pkg.__path__ = list(spec.submodule_search_locations)
            pkg.__spec__ = spec
            sys.modules["mamba_ssm"] = pkg
        return importlib.import_module("mamba_ssm.ops.triton.ssd_combined").mamba_chunk_scan_combined
    except Exception:
        return None


SSD_MODULE, SSD_FN = "mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined"
# the self-check's bound on each norm-relative error against float64: bfloat16 inputs and products, float32
# accumulation (measured 2.3e-3 at the mad recipe's sizes, benchmarks/h200-2026-12-04)
SSD_TOLERANCE = 2e-2


def ssd_scan(op, x, dt, A_log, dt_bias, D, Bm, Cm, chunk: int):
    """Mamba-2's scan with mamba-ssm's SSD ``op``: x (B, T, H, P), dt (B, T, H) before softplus, A_log, dt_bias, D
    (H,), Bm, Cm (B, T, N) -> y (B, T, H, P) = scan + D x (``ssd_reference``'s result, A = -exp(A_log)), in x's
    dtype: softplus(dt + dt_bias), the scan and D x in the one call, B and C one group for every head. (Called with
    A taken into dt and D applied outside, so that stacked models fold into its batch, it measured 0.86-0.89x this
    form, stacked+graphed K = 6 at lengths 128 to 1024 side by side on an H200: benchmarks/h200-2026-12-04d.)"""
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32    # float64 only for checks
    return op(x, dt, -A_log.to(cdt).exp(), Bm.unsqueeze(2), Cm.unsqueeze(2), chunk, D=D.to(cdt),
              dt_bias=dt_bias.to(cdt), dt_softplus=True)


def ssd_reference(x, dt, A, Bm, Cm, D, dt_bias, chunk: int = 64):
    """``mamba_chunk_scan_combined(x, dt, A, Bm, Cm, chunk, D=D, dt_bias=dt_bias, dt_softplus=True)`` in
    PyTorch, as ``torch-chunk`` computes it: x (B, T, H, P), dt (B, T, H), A, D, dt_bias (H,), Bm, Cm
    (B, T, 1, N) -> (B, T, H, P), in the inputs' floating dtype (float64 for the check)."""
    hf = lambda t: t.transpose(1, 2)                                        # noqa: E731
    dts = F.softplus(dt + dt_bias)
    y = hf(simple_gla_chunk(hf(Cm), hf(Bm), hf(x), hf(A * dts), chunk=chunk, k_scale=hf(dts)))
    return y + x * D[:, None]


# mamba-ssm's kernels autotune once per (chunk, head width, state width, dtypes), whatever the batch, length and
# head count: the first call of a key fixes its tiles for the process (and, with TRITON_CACHE_AUTOTUNING, for every
# later one). So before its self-check (a few sequences) the op is run once at the layer's own sizes, where a
# training run's calls will be; the sizes used when a caller gives none (the self-check called directly)
DEFAULT_TUNE_SHAPE = (32, 1024, 16)     # (batch, length, heads)
_TUNE_AT: dict[tuple, tuple[int, int, int]] = {}
_TUNED: set[tuple[int, int, int, int]] = set()


def ssd_tune(device_index: int, P: int, N: int, chunk: int, shape: tuple[int, int, int] | None = None) -> None:
    """One forward and backward of ``ssd_scan`` at ``shape`` (batch, length, heads; default
    ``DEFAULT_TUNE_SHAPE``) on random bfloat16 inputs: its kernels' autotuning for these widths happens here.
    Once per (device, P, N, chunk) in a process."""
    if (device_index, P, N, chunk) in _TUNED:
        return
    op = ssd_op()
    if op is None:
        raise RuntimeError("mamba-ssm's Triton SSD is not installed")
    Bs, T, H = shape or DEFAULT_TUNE_SHAPE
    dev = torch.device("cuda", device_index)
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s: torch.randn(*s, device=dev, generator=g).to(torch.bfloat16).requires_grad_()   # noqa: E731
    x, dt, Bm, Cm = r(Bs, T, H, P), r(Bs, T, H), r(Bs, T, N), r(Bs, T, N)
    A_log, D, dtb = (torch.randn(H, device=dev, generator=g).requires_grad_() for _ in range(3))
    y = ssd_scan(op, x, dt, A_log, dtb, D, Bm, Cm, chunk)
    y.float().square().mean().backward()
    torch.cuda.synchronize(dev)
    _TUNED.add((device_index, P, N, chunk))


def ssd_errors(device_index: int, P: int, N: int, chunk: int) -> list[float]:
    """Norm-relative errors of ``ssd_scan`` with mamba-ssm's SSD against ``ssd_reference`` in float64 on
    ``device_index``, for the output and the gradients of x, dt, A_log, B, C, D, dt_bias: 2 sequences, 3 heads of
    ``P``, state ``N``, two chunks of ``chunk`` and a part of a third; x, dt, B and C bfloat16 (as autocast
    gives them), x and dt views of a wider projection's rows (Mamba-2's layout). Its kernels are tuned first
    (``ssd_tune``), not at these few sequences. Raises where the op is missing.
    """
    ssd_tune(device_index, P, N, chunk)
    op = ssd_op()
    dev = torch.device("cuda", device_index)
    g = torch.Generator(device="cpu").manual_seed(0)
    Bs, H, T = 2, 3, 2 * chunk + chunk // 2 + 1
    proj = torch.randn(Bs, T, H * P + H + 3, generator=g)
    x, dt = proj[..., :H * P].view(Bs, T, H, P), proj[..., H * P:H * P + H] * 0.5 - 1.0
    Bm, Cm = (torch.randn(Bs, T, N, generator=g) * N ** -0.5 for _ in range(2))
    A_log = (torch.rand(H, generator=g) * 8 + 1).log()
    D, dt_bias = torch.randn(H, generator=g), torch.randn(H, generator=g) * 0.5
    dy = torch.randn(Bs, T, H, P, generator=g)
    lo = [t.to(torch.bfloat16) if i in (0, 1, 3, 4) else t for i, t in enumerate((x, dt, A_log, Bm, Cm, D, dt_bias))]
    ref = [t.double().to(dev).requires_grad_() for t in lo]
    want = ssd_reference(ref[0], ref[1], -ref[2].exp(), ref[3].unsqueeze(2), ref[4].unsqueeze(2), ref[5], ref[6], chunk=16)
    wants = [want.detach(), *torch.autograd.grad(want, ref, dy.double().to(dev))]
    proj_dev = proj.to(torch.bfloat16).to(dev)
    xs = proj_dev[..., :H * P].view(Bs, T, H, P).detach().requires_grad_()
    ins = [xs] + [t.to(dev).detach().requires_grad_() for t in lo[1:]]
    got = ssd_scan(op, ins[0], ins[1], ins[2], ins[6], ins[5], ins[3], ins[4], chunk)
    gots = [got.detach(), *torch.autograd.grad(got, ins, dy.to(dev, got.dtype))]
    return [float((a.double() - b).norm() / b.norm().clamp_min(1e-30)) if a.shape == b.shape else float("inf")
            for a, b in zip(gots, wants)]


def _tuned_check(key: tuple[int, int, int, int]) -> bool:
    ssd_tune(*key, shape=_TUNE_AT.get(key))
    return max(ssd_errors(*key)) <= SSD_TOLERANCE


_SSD_OK = DeviceCheck(_tuned_check)


def ssd_usable(device_index: int, P: int, N: int, chunk: int, shape: tuple[int, int, int] | None = None) -> bool:
    """Whether ``ssd_scan`` with mamba-ssm's SSD gives ``ssd_reference``'s
    numbers on this device at heads of P, state N and this chunk (``ssd_errors`` within ``SSD_TOLERANCE``), checked
    once per key (``_check.DeviceCheck``) after the op has run once at ``shape`` (batch, length, heads: the
    caller's), where its kernels autotune (``ssd_tune``)."""
    key = (device_index, P, N, chunk)
    if shape is not None and key not in _SSD_OK.answers:
        _TUNE_AT.setdefault(key, tuple(shape))
    return _SSD_OK(key)


def ssd_op():
    """mamba-ssm's ``mamba_chunk_scan_combined`` looked up through ``_fla._op`` (where stacked training folds it),
    or None where the package is not installed."""
    if ssd_combined() is None:        # puts the package in sys.modules without its __init__ where needed
        return None
    return _fla._op(SSD_MODULE, SSD_FN)


def _signed(log_a: torch.Tensor, neg: bool):
    """log|a'| and the sign mask of a' = 2a - 1 (neg) or a' = a (not neg), from log a."""
    if not neg:
        return log_a, None
    a2 = 2.0 * log_a.exp() - 1.0
    return a2.abs().clamp_min(1e-6).log(), a2 < 0


@register_mixer("mamba", search_space={
    "lr": ("log", 1e-4, 3e-2),
    "weight_decay": ("cat", [0.0, 0.1]),
    "d_state": ("cat", [16, 32, 64]),
    "allow_neg_eigval": ("cat", [False, True]),
})
class Mamba(nn.Module):
    """Mamba selective SSM: Mamba-2 (scalar decay per head, simple-GLA form) or Mamba-1."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0, version: int = 2,
                 d_state: int = 64, expand: int = 2, conv_size: int = 4,
                 allow_neg_eigval: bool = False, chunk_size: int = 64, backend: str = "auto"):
        super().__init__()
        if version not in (1, 2):
            raise ValueError(f"version={version}; allowed: 1, 2")
        if backend not in ("auto", "torch", "fla", "mamba-ssm"):
            raise ValueError(f"backend={backend!r}; allowed: auto, torch, fla, mamba-ssm")
        di = expand * d_model
        if version == 2 and di % num_heads:
            raise ValueError(f"expand*d_model={di} not divisible by num_heads={num_heads}")
        self.version, self.h, self.N, self.di, self.neg, self.chunk, self.requested = (
            version, num_heads, d_state, di, allow_neg_eigval, chunk_size, backend)
        self._warned = False
        if version == 2:
            self.in_proj = nn.Linear(d_model, 2 * di + 2 * d_state + num_heads, bias=False)
            self.conv = ConvAct(di + 2 * d_state, conv_size)
            self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(1, 16)))
            self.dt_bias = nn.Parameter(dt_bias_init(num_heads))
            self.D = nn.Parameter(torch.ones(num_heads))
            self.backend = "torch-chunk"
        else:
            self.rank = math.ceil(d_model / 16)
            self.in_proj = nn.Linear(d_model, 2 * di, bias=False)
            self.conv = ConvAct(di, conv_size)
            self.x_proj = nn.Linear(di, self.rank + 2 * d_state, bias=False)
            self.dt_proj = nn.Linear(self.rank, di, bias=True)
            with torch.no_grad():
                self.dt_proj.bias.copy_(dt_bias_init(di))
            self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1).float()).repeat(di, 1))
            self.D = nn.Parameter(torch.ones(di))
            self.backend = "torch-scan-slow"
        self.norm = RMSNorm(di) if version == 2 else None
        self.out_proj = nn.Linear(di, d_model, bias=False)

    # Mamba-2 -----------------------------------------------------------------------------
    def _ssd(self, x: torch.Tensor, P: int):
        """mamba-ssm's SSD for this forward (module docstring), or None."""
        wide = P >= FLA_MIN_HEAD_DIM
        if self.requested == "mamba-ssm":
            op = ssd_op() if x.is_cuda and not self.neg else None
            if op is None or not ssd_usable(x.device.index or 0, P, self.N, self.chunk, (*x.shape[:2], self.h)):
                raise RuntimeError("mamba: backend='mamba-ssm' asked for but mamba-ssm's Triton SSD cannot run here "
                                   "(needs a GPU, mamba-ssm installed and its check passed, no negative eigenvalues)")
            return op
        if self.requested != "auto" or wide or not x.is_cuda or self.neg:
            return None
        choice = os.environ.get("MIXZOO_MAMBA_SSD") or MAMBA_SSD[0]
        if choice not in MAMBA_SSD:
            raise ValueError(switch_error())
        if choice != "mamba-ssm":
            return None
        op = ssd_op()
        return op if op is not None and ssd_usable(x.device.index or 0, P, self.N, self.chunk, (*x.shape[:2], self.h)) else None

    def _forward2(self, x):
        B, T, _ = x.shape
        z, xbc, dt = self.in_proj(x).split([self.di, self.di + 2 * self.N, self.h], dim=-1)
        xs, Bm, Cm = self.conv(xbc).split([self.di, self.N, self.N], dim=-1)
        xh = xs.view(B, T, self.h, -1)                                      # (B, T, H, P)
        ssd = self._ssd(x, xh.shape[-1])
        if ssd is not None:
            self.backend = "mamba-ssm-ssd"
            y = ssd_scan(ssd, xh, dt, self.A_log, self.dt_bias, self.D, Bm, Cm, self.chunk)
            return self.out_proj(self.norm(y.reshape(B, T, self.di), gate=z).to(x.dtype))
        dt = F.softplus(dt.float() + self.dt_bias)                          # (B, T, H)
        log_a, negm = _signed(-self.A_log.float().exp() * dt, self.neg)     # (B, T, H)
        xf = xh.float()                                                     # the scan's values and the skip's
        fn = None
        wide = xh.shape[-1] >= FLA_MIN_HEAD_DIM
        if x.is_cuda and negm is None and (self.requested == "fla" or (self.requested == "auto" and wide)):
            fn, suffix = _fla.gated_chunk_op("fla.ops.simple_gla", "chunk_simple_gla", max(self.N, _fla.MIN_DOT),
                                             max(xh.shape[-1], FLA_MIN_HEAD_DIM))
            name = "fla-simple-gla" + suffix
        if self.requested == "fla" and fn is None:
            raise RuntimeError("mamba: backend='fla' asked for but fla's chunk_simple_gla cannot run here")
        if fn is not None:
            self.backend = name
            k = Bm.float().unsqueeze(2) * dt.unsqueeze(-1)                  # (B, T, H, N): fla takes a key per head
            q = Cm.float().unsqueeze(2).expand(B, T, self.h, self.N)
            qp, kp = _fla.pad_heads(q.to(xh.dtype), k.to(xh.dtype))
            vp = _fla.pad_heads(xh, width=FLA_MIN_HEAD_DIM)
            y = fn(qp, kp, vp, g=log_a.contiguous(), scale=1.0)[0][..., :xh.shape[-1]]
        else:
            self.backend = "torch-chunk"
            hf = lambda t: t.transpose(1, 2)
            # B and C once for every head, dt as the per-head key scale (no (B, T, H, N) copies)
            # the values as a view of (B, T, H, P) memory, which the SSD form reads in place and whose layout
            # it returns (y below is a view, the skip one multiply-add, the reshape for the norm a view)
            y = hf(simple_gla_chunk(Cm.float().unsqueeze(1), Bm.float().unsqueeze(1), hf(xf), hf(log_a),
                                    neg=None if negm is None else hf(negm), chunk=self.chunk, k_scale=hf(dt)))
        y = torch.addcmul(y.float(), xf, self.D[:, None])                  # + D x
        # the gated norm, norm(y silu(z)): on a GPU one kernel each way (mixzoo.kernels.rmsnorm)
        return self.out_proj(self.norm(y.reshape(B, T, self.di), gate=z).to(x.dtype))

    # Mamba-1 -----------------------------------------------------------------------------
    def _forward1(self, x):
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        xs = self.conv(xs)                                                  # (B, T, Di)
        dt_low, Bm, Cm = self.x_proj(xs).split([self.rank, self.N, self.N], dim=-1)
        dt = F.softplus(self.dt_proj(dt_low).float())                      # (B, T, Di)
        A = -self.A_log.float().exp()                                       # (Di, N)
        scan = _selective_scan_cuda() if (x.is_cuda and self.requested != "torch" and not self.neg) else None
        if self.requested == "mamba-ssm" and scan is None:
            raise RuntimeError("mamba: backend='mamba-ssm' asked for but its CUDA kernels are not built here")
        if scan is not None:
            self.backend = "mamba-ssm"
            y = scan(xs.transpose(1, 2).contiguous(), dt.transpose(1, 2).to(xs.dtype).contiguous(), A,
                     Bm.transpose(1, 2).contiguous(), Cm.transpose(1, 2).contiguous(), self.D.float(),
                     z=z.transpose(1, 2).contiguous()).transpose(1, 2)
            return self.out_proj(y.to(x.dtype))
        self.backend = "torch-scan-slow"
        if x.is_cuda and not self._warned:
            self._warned = True
            print("mixzoo: WARNING: mamba version=1 runs the step-by-step PyTorch scan on this GPU "
                  "(mamba-ssm's CUDA kernels are not built here): about 2 s per training step at "
                  "length 1024. Use version=2 or build mamba-ssm.", file=sys.stderr, flush=True)
        log_a, negm = _signed(dt.unsqueeze(-1) * A, self.neg)               # (B, T, Di, N)
        a = log_a.exp() if negm is None else torch.where(negm, -log_a.exp(), log_a.exp())
        u = (dt * xs.float()).unsqueeze(-1) * Bm.float().unsqueeze(2)        # (B, T, Di, N)
        h = x.new_zeros(x.shape[0], self.di, self.N, dtype=torch.float32)
        ys = []
        for t in range(x.shape[1]):
            h = a[:, t] * h + u[:, t]
            ys.append((h * Cm[:, t, None, :].float()).sum(-1))
        y = torch.stack(ys, 1) + self.D * xs.float()
        y = y * F.silu(z.float())
        return self.out_proj(y.to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward2(x) if self.version == 2 else self._forward1(x)

    def state_size(self, seq_len: int) -> int:
        return self.di * self.N
