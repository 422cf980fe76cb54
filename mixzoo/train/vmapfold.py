"""Per-sequence custom ops under ``torch.func.vmap``, by folding the model dimension into the op.

Stacked training (``mixzoo.train.stacked``) runs K models as one with ``vmap`` over their stacked
weights. Most of a mechanism is plain PyTorch and vmaps as is (projections become batched matmuls),
but its core is often a custom op: an fla Triton kernel (an ``autograd.Function`` that functorch
cannot enter) or SDPA (whose CPU kernel has no batching rule, so vmap would loop over the models).
Such an op computes each sequence, and each head, independently, so K models' calls are one call
with the K models folded in:

* into the batch: (K, B, ...) -> (K*B, ...), when every per-model argument has the batch dimension
  (q, k, v, gates, a ridge expanded over the batch);
* into the heads: (K, B, T, H, ...) -> (B, T, K*H, ...), when a per-model argument is a per-head
  parameter with no batch dimension (MesaNet's ``lamb``), which the kernel takes as (H,) or (H, D):
  the K models' parameters become (K*H,) or (K*H, D) (MesaNet's op runs one model a call instead by default:
  ``mesa_models_per_call``).

An op whose cost grows worse than linearly with the folded size (mamba-ssm's SSD, whose backward's ``torch.cumsum``
slows fiftyfold per element past a row count: ``ssd_models_per_call``) runs in groups of models, one folded call
per group (``FoldSpec.per_call``).

Folding into the batch is preferred where an op allows it: fla's autotuning keys on the head count
(every kernel) and on the batch (a few small ones), so a heads fold autotunes the whole mechanism
again for each K. GDN's call with its gate fused in the kernel (``use_gate_in_kernel``, per-head
``A_log`` and ``dt_bias``) is therefore rewritten first (``REWRITES``): the gate
-exp(A_log) softplus(a + dt_bias) is computed in float32 by PyTorch, per model under vmap (the
formula of gdn's own PyTorch path), and the kernel takes it as a precomputed log-decay, which folds
into the batch.

The folded call is an ordinary call of the op on ordinary tensors, so autograd records it as usual
and ``loss.backward()`` outside the vmap runs the op's own backward. Outside vmap a folded op is the
op itself (no copy, no overhead beyond one check), so installing the wrappers changes nothing for
ordinary training.

``folding()`` installs them for the duration of a block: on ``F.scaled_dot_product_attention``, on
``F.rms_norm`` and on every entry point mixzoo's mechanisms look up through ``mixzoo.models._fla._op``
(they call it on each forward: fla's ops, LLA's Triton kernel, mixzoo's SwiGLU, RMS-norm,
rotary-embedding and short-convolution kernels). The long-term home of the
entry points' wrapping is ``mixzoo/models/_fla.py`` itself (its ``_op`` returning ``foldable(...)``);
it lives here so that stacking needs no change to the models.

``F.rms_norm`` is there because vmap has no batching rule for it: functorch decomposes it into its
elementwise definition (a power, a mean, a reciprocal square root, products; about 6 operators
forward and 14 backward, each writing a full activation), where an unstacked CUDA step runs one fused
kernel each way. A norm is per row, so under vmap it runs as one call on the K models' rows
(``_NormCall``) with any weight applied after it, per model (a weight is a per-model parameter with
no batch dimension). ``MIXZOO_FOLD_RMS_NORM=0`` leaves it to functorch (to time one against the
other).
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class FoldSpec:
    """How to fold one op. ``params``: names of its per-head parameter arguments (no batch
    dimension; head axis 0). ``head_axis``: the head axis of its per-sequence tensors and outputs
    ((B, T, H, D): 2, fla's layout). ``per_call``: where set, ``per_call(K, args)`` (args by name, each
    tensor one model's) is how many of the K models one folded call may take; the models then run in
    groups of that many, one folded call each (``_Call.run``)."""
    params: frozenset[str] = field(default_factory=frozenset)
    head_axis: int = 2
    per_call: Callable[[int, dict], int] | None = None


# torch's CUDA cumsum along the last dimension (ATen ScanUtils.cuh, get_log_num_threads_x_inner_scan) gives a block
# 2^x threads per row with x = (9 + log2 row - log2 rows) / 2 in unsigned arithmetic: past 2^(9 + log2 row) rows the
# difference wraps and x clamps to 9, one row of 64 per block of 512 threads. Measured on an H200
# (benchmarks/cumsum_rows.py, benchmarks/h200-2026-12-04d): float32 rows of 64, 32,768 rows 22 us (748 GB/s),
# 196,608 rows 1.1 ms (91 GB/s).
SCAN_LOG_THREADS = 9


def scan_rows_limit(row: int) -> int:
    """The most rows of length ``row`` that torch's CUDA cumsum along the last dimension scans several to a block."""
    return 1 << (SCAN_LOG_THREADS + max(row - 1, 0).bit_length())


def ssd_models_per_call(K: int, args: dict) -> int:
    """mamba-ssm's ``mamba_chunk_scan_combined`` under stacking: its backward calls ``torch.cumsum`` over rows of
    ``chunk_size`` with batch x heads x chunks rows, which the heads fold multiplies by the models in the call (a
    graphed K = 6 step at length 1024 spent 4.6 ms of 85 there). As many models a call as keep those rows within
    ``scan_rows_limit`` (at least one); all K with ``MIXZOO_MAMBA_SSD_FOLD=whole``."""
    if os.environ.get("MIXZOO_MAMBA_SSD_FOLD", "split") == "whole":
        return K
    x, chunk = args["x"], args["chunk_size"]
    rows = x.shape[0] * x.shape[2] * -(-x.shape[1] // chunk)
    return max(1, min(K, scan_rows_limit(chunk) // rows))


def mesa_models_per_call(K: int, args: dict) -> int:
    """fla's chunk_mesa_net under stacking: its per-head ``lamb`` makes a heads fold, with copies into and out of a
    (B, T, K*H, D) layout that later ops read strided. One model a call on views of the stacked layout instead (the
    default) measured 1.03 / 1.05 / 1.07 / 1.08x the heads fold, stacked+graphed K = 6 at lengths 128 / 256 / 512 /
    1024 side by side on an H200 (benchmarks/h200-2026-12-04d). ``MIXZOO_MESA_FOLD=whole``: the heads fold."""
    return K if os.environ.get("MIXZOO_MESA_FOLD") == "whole" else 1


# the ops mixzoo's mechanisms call, by function name; anything else folds into the batch
SPECS: dict[str, FoldSpec] = {
    "scaled_dot_product_attention": FoldSpec(),
    "chunk_gated_delta_rule": FoldSpec(frozenset({"A_log", "dt_bias"})),   # if not rewritten (REWRITES)
    "chunk_mesa_net": FoldSpec(frozenset({"lamb"}), per_call=mesa_models_per_call),
    "lla": FoldSpec(head_axis=1),           # mixzoo.kernels.lla.triton_lla.lla: (B, H, T, D)
    # mamba-ssm's SSD (Mamba-2 at narrow heads): x (B, T, K*H, P), dt (B, T, K*H), the K models' B and C
    # (B, T, 1, N) as its K groups (B, T, K, N): head k*H + h reads group k, as mamba-ssm groups heads; the
    # models in groups under torch's cumsum row limit (ssd_models_per_call)
    "mamba_chunk_scan_combined": FoldSpec(frozenset({"A", "D", "dt_bias"}), per_call=ssd_models_per_call),
}


class FoldError(RuntimeError):
    pass


def _gdn_gate_outside(names: tuple[str, ...], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """chunk_gated_delta_rule(..., g=a, use_gate_in_kernel=True, A_log=, dt_bias=) ->
    (..., g=-exp(A_log) softplus(a + dt_bias), use_gate_in_kernel=False)."""
    if not kwargs.get("use_gate_in_kernel"):
        return args, kwargs
    kw = dict(zip(names, args)) | kwargs
    if any(n not in kw for n in ("g", "A_log")):
        return args, kwargs
    a, A_log, dt_bias = kw["g"].float(), kw.pop("A_log").float(), kw.pop("dt_bias", None)
    kw["g"] = -A_log.exp() * F.softplus(a if dt_bias is None else a + dt_bias.float())
    kw["use_gate_in_kernel"] = False
    n = min(len(args), len(names))
    return tuple(kw.pop(k) for k in names[:n]), kw


# op name -> a rewrite of its (positional names, args, kwargs) applied under vmap before folding
REWRITES: dict[str, Callable] = {"chunk_gated_delta_rule": _gdn_gate_outside}


@dataclass
class _Call:
    fn: Callable
    name: str
    spec: FoldSpec
    npos: int
    keys: tuple[str, ...]          # keyword names, in order, after the positional arguments
    argnames: tuple[str, ...]      # the op's positional parameter names, where known

    def names(self) -> list[str]:
        pos = [self.argnames[i] if i < len(self.argnames) else f"arg{i}" for i in range(self.npos)]
        return pos + list(self.keys)

    def run(self, K: int, in_dims, args):
        if self.spec.per_call is not None:
            g = self.spec.per_call(K, {n: t.select(d, 0) if torch.is_tensor(t) and d is not None else t
                                       for n, t, d in zip(self.names(), args, in_dims)})
            if g < K:
                return self._run_groups(K, g, in_dims, args)
        return self._run(K, in_dims, args)

    def _run_groups(self, K: int, g: int, in_dims, args):
        """The models in groups of ``g``, one folded call each; every output the groups' outputs concatenated
        along a leading model dimension. The inputs are split into views (whose backward is one ``cat``)."""
        parts = [t.split(g, dim=d) if torch.is_tensor(t) and d is not None else None for t, d in zip(args, in_dims)]
        outs = []
        for i, k0 in enumerate(range(0, K, g)):
            sub = [p[i] if p is not None else t for p, t in zip(parts, args)]
            outs.append(self._run(min(g, K - k0), in_dims, sub))

        def join(rs, ds):
            if ds[0] is None:
                return rs[0], None
            return torch.cat([r.movedim(d, 0) for r, d in zip(rs, ds)]), 0

        res, dims = outs[0]
        if isinstance(res, (tuple, list)):
            pairs = [join([o[0][j] for o in outs], [o[1][j] for o in outs]) for j in range(len(res))]
            return type(res)(p[0] for p in pairs), tuple(p[1] for p in pairs)
        return join([o[0] for o in outs], [o[1] for o in outs])

    def _run(self, K: int, in_dims, args):
        names = self.names()
        batched = {n for n, t, d in zip(names, args, in_dims) if torch.is_tensor(t) and d is not None}
        heads = bool(batched & self.spec.params)
        a = self.spec.head_axis
        B = None
        for n, t, d in zip(names, args, in_dims):
            if n in batched and n not in self.spec.params:
                size = t.shape[1 if d == 0 else 0] if t.dim() > 1 else None
                if size is None or (B is not None and size != B):
                    raise FoldError(f"{self.name}: argument {n!r} of shape {tuple(t.shape)} has no batch "
                                    f"dimension of size {B}: a per-model parameter needs a FoldSpec "
                                    f"(mixzoo.train.vmapfold.SPECS)")
                B = size
        out = []
        for n, t, d in zip(names, args, in_dims):
            if not torch.is_tensor(t):
                out.append(t)
            elif n in self.spec.params:
                if d is not None:
                    out.append(t.movedim(d, 0).flatten(0, 1))            # (K, H, ...) -> (K*H, ...)
                else:
                    out.append(t.repeat(K, *([1] * (t.dim() - 1))) if heads else t)
            elif d is None and (t.dim() == 0 or t.shape[0] != B):
                out.append(t)                                            # shared, not per sequence
            elif heads and d is not None and d != a and heads_grad() == "contiguous":
                out.append(_HeadsIn.apply(t, d, a))                      # the same, its gradient contiguous
            elif heads:
                t = t.movedim(d, a) if d is not None else t.unsqueeze(a).expand(*t.shape[:a], K, *t.shape[a:])
                out.append(t.flatten(a, a + 1))                          # (B, T, K, H, ...) -> (B, T, K*H, ...)
            else:
                t = t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(K, *t.shape)
                out.append(t.flatten(0, 1))                              # (K, B, ...) -> (K*B, ...)
        pos, kw = out[:self.npos], dict(zip(self.keys, out[self.npos:]))
        res = self.fn(*pos, **kw)
        axis = a if heads else 0

        def unfold(r):
            if r is None or not torch.is_tensor(r):
                return r, None
            if r.dim() <= axis or r.shape[axis] % K:
                raise FoldError(f"{self.name}: output of shape {tuple(r.shape)} cannot be unfolded on axis {axis}")
            return r.unflatten(axis, (K, r.shape[axis] // K)), axis

        if isinstance(res, (tuple, list)):
            pairs = [unfold(r) for r in res]
            return type(res)(p[0] for p in pairs), tuple(p[1] for p in pairs)
        return unfold(res)


def heads_grad() -> str:
    """``MIXZOO_FOLD_HEADS_GRAD`` (``mixzoo.kernels.FOLD_HEADS_GRAD``; the first value is the default)."""
    from ..kernels import FOLD_HEADS_GRAD
    v = os.environ.get("MIXZOO_FOLD_HEADS_GRAD") or FOLD_HEADS_GRAD[0]
    if v not in FOLD_HEADS_GRAD:
        raise ValueError(f"MIXZOO_FOLD_HEADS_GRAD={v!r}; allowed: {', '.join(FOLD_HEADS_GRAD)}")
    return v


class _HeadsIn(torch.autograd.Function):
    """A per-model input (model axis ``d``) moved into an op's heads (axis ``a``): ``t.movedim(d, a).flatten(a, a + 1)``,
    as ``_Call._run`` does, with the gradient handed back contiguous in ``t``'s layout. Through the view operations
    that gradient would be the op's, strided per model (K·H heads side by side); where ``t`` is a piece of a split
    (Mamba-2's ``in_proj(x).split`` and ``conv(xbc).split``), the split's backward then concatenates strided pieces,
    which torch's CUDA ``cat`` does element by element instead of in vectors. One copy here, in the op's backward."""

    @staticmethod
    def forward(ctx, t, d: int, a: int):
        ctx.d, ctx.a, ctx.K = d, a, t.shape[d]
        y = t.movedim(d, a).flatten(a, a + 1)
        same = y.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        return y.clone(memory_format=torch.contiguous_format) if same else y    # a copy, never a view of t

    @staticmethod
    def backward(ctx, g):
        return g.unflatten(ctx.a, (ctx.K, -1)).movedim(ctx.a, ctx.d).contiguous(), None, None


class _Fold(torch.autograd.Function):
    """Only ever entered under vmap: its ``vmap`` rule folds and calls the op on plain tensors."""
    generate_vmap_rule = False

    @staticmethod
    def forward(call, *args):
        raise FoldError("a folded op runs only under vmap")

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise FoldError("a folded op's backward is the op's own")

    @staticmethod
    def vmap(info, in_dims, call, *args):
        return call.run(info.batch_size, in_dims[1:], args)


def _argnames(fn) -> tuple[str, ...]:
    import inspect
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


@dataclass
class _OwnRule:
    """An op's own fold rule (its ``__mixzoo_fold__``): ``rule(K, in_dims, *args)`` -> (out, out_dims),
    called on plain tensors with each argument's vmapped dimension (or None)."""
    rule: Callable
    name: str

    def run(self, K: int, in_dims, args):
        return self.rule(K, tuple(in_dims), *args)


def foldable(fn: Callable, name: str | None = None, spec: FoldSpec | None = None) -> Callable:
    """``fn`` itself outside vmap; under vmap, ``fn`` called once with the vmapped dimension folded
    into its batch or heads (module docstring), or by its own rule where it has one: an op whose
    models need more than folding (K per-model weights applied in the op, as ``mixzoo.kernels.rmsnorm``)
    sets ``fn.__mixzoo_fold__ = rule`` (``_OwnRule``; positional arguments only). Idempotent."""
    if getattr(fn, "_mixzoo_folded", False):
        return fn
    own = getattr(fn, "__mixzoo_fold__", None)
    if own is not None:
        rule = _OwnRule(own, name or getattr(fn, "__name__", "op"))

        @functools.wraps(fn)
        def call_own(*args):
            if not torch._C._are_functorch_transforms_active():
                return fn(*args)
            return _Fold.apply(rule, *args)

        call_own._mixzoo_folded = True
        call_own.__wrapped_op__ = fn
        return call_own
    name = name or getattr(fn, "__name__", "op")
    spec = spec or SPECS.get(name, FoldSpec())
    argnames = _argnames(fn)
    rewrite = REWRITES.get(name)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not torch._C._are_functorch_transforms_active():
            return fn(*args, **kwargs)
        if rewrite is not None:
            args, kwargs = rewrite(argnames, args, kwargs)
        keys = tuple(kwargs)
        return _Fold.apply(_Call(fn, name, spec, len(args), keys, argnames), *args, *kwargs.values())

    call._mixzoo_folded = True
    call.__wrapped_op__ = fn
    return call


@dataclass
class _NormCall:
    """``F.rms_norm(input, normalized_shape, eps=eps)`` (no weight) on the K models' rows at once:
    the model dimension moved in front, outside the normalized dimensions."""
    fn: Callable
    name: str = "rms_norm"

    def run(self, K: int, in_dims, args):
        x, shape, eps = args
        d = in_dims[0]
        if d is None:
            return self.fn(x, shape, None, eps), None
        return self.fn(x.movedim(d, 0), shape, None, eps), 0


def foldable_rms_norm(fn: Callable) -> Callable:
    """``fn`` (``F.rms_norm``'s signature) itself outside vmap; under vmap one call of ``fn`` without
    weight on every model's rows, times the weight (module docstring). Idempotent."""
    if getattr(fn, "_mixzoo_folded", False):
        return fn
    norm = _NormCall(fn)

    @functools.wraps(fn)
    def rms_norm(input, normalized_shape, weight=None, eps=None):
        if not torch._C._are_functorch_transforms_active():
            return fn(input, normalized_shape, weight, eps)
        y = _Fold.apply(norm, input, tuple(normalized_shape), eps)
        return y if weight is None else y * weight

    rms_norm._mixzoo_folded = True
    rms_norm.__wrapped_op__ = fn
    return rms_norm


_lock = threading.Lock()
_depth = 0
_saved: dict[str, object] = {}


@contextlib.contextmanager
def folding():
    """Within the block, SDPA, RMS norms and the fla ops mechanisms look up are foldable (module docstring).
    Re-entrant; the originals are back when the outermost block ends."""
    global _depth
    from ..models import _fla
    with _lock:
        if _depth == 0:
            _saved["sdpa"] = F.scaled_dot_product_attention
            _saved["rms_norm"] = F.rms_norm
            if os.environ.get("MIXZOO_FOLD_RMS_NORM", "1") != "0":
                F.rms_norm = foldable_rms_norm(F.rms_norm)
            _saved["op"] = _fla._op
            F.scaled_dot_product_attention = foldable(F.scaled_dot_product_attention, "scaled_dot_product_attention")
            orig = _fla._op

            @functools.cache
            def op(module: str, fn: str):
                f = orig(module, fn)
                return None if f is None else foldable(f, fn)
            _fla._op = op
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                F.scaled_dot_product_attention = _saved.pop("sdpa")
                F.rms_norm = _saved.pop("rms_norm")
                _fla._op = _saved.pop("op")
