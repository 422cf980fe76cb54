"""``mixzoo check-mixer``: check mechanisms against the mixer contract.

A mechanism passes when, at a tiny shape, it builds with no knobs, maps (B, T, D) to (B, T, D)
with finite values at odd and even lengths, is causal (changing inputs after position t never
changes outputs up to t), sends a gradient to every trainable parameter, is deterministic,
names its path in ``backend``, and lowers a loss in a few optimizer steps. A registered
functional core is checked for shape and causality. On a GPU the fast path is compared with
the reference path (``backend="torch"``) in bf16, forward and gradients, and a training step
(forward and backward under bf16 autocast, after two warm-up steps) must not make the host wait
for the device (``torch.cuda.set_sync_debug_mode``): a per-step sync stalls a launch-bound
training loop by the device's queued work.

Python: ``check_mixer(name) -> list[CheckResult]``.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

from .errors import UsageError


@dataclass
class CheckResult:
    mechanism: str
    check: str
    status: str            # "pass" | "fail" | "skip"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fail"


TRAILING = "names"         # names after the options are mechanism names too


def configure(name: str, p) -> None:
    p.add_argument("names", nargs="*", metavar="NAME[:KEY=V,...]",
                   help="mechanisms to check (default: all registered), optionally with their knobs")
    p.add_argument("--models", help="the same mechanisms, comma-separated (as elsewhere)")
    p.add_argument("--set", "--hp", "--knob", dest="knob", action="append", metavar="KEY=V",
                   help="constructor knob passed to every checked mechanism (repeatable; mixer.KEY=V too)")
    p.add_argument("--seq-len", type=int, default=33, help="length of the test inputs (default 33)")
    p.add_argument("--d-model", type=int, default=32, help="width of the test inputs (default 32)")
    p.add_argument("--heads", type=int, default=2, help="heads (default 2)")


def _rel(a, b) -> float:
    """Norm-relative difference |a - b| / |b|."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def causal_leak(m, x, *, y=None, generator=None, points=None, stacked: bool = False):
    """How far outputs up to position t move when the inputs after t change: ``(worst, t, tol)``,
    the largest absolute change over the cut points ``points`` (default 0, T/3, T/2, T-2), the
    point where it was seen (None when nothing moved) and the tolerance, ``1e-4 * (max|y| + 1)``.
    ``m`` is causal when ``worst <= tol``. The inputs after t are replaced with draws 3x as large
    from ``generator``; ``y = m(x)`` when the caller has it. ``stacked``: every perturbed copy and
    ``x`` itself go through one forward pass, as one batch (the cheap check before a run);
    otherwise one pass each. Run under ``torch.no_grad``; what ``m`` raises propagates."""
    import torch
    B, T, D = x.shape
    points = sorted({t for t in (points if points is not None else (0, T // 3, T // 2, T - 2))
                     if 0 <= t < T - 1})
    with torch.no_grad():
        perturbed = []
        for t in points:
            x2 = x.clone()
            x2[:, t + 1:] = 3.0 * torch.randn(B, T - t - 1, D, generator=generator).to(x.device, x.dtype)
            perturbed.append(x2)
        if stacked:
            outs = m(torch.cat([x, *perturbed])).split(B)
            y, outs = outs[0], outs[1:]
        else:
            y = m(x) if y is None else y
            outs = [m(x2) for x2 in perturbed]
        worst, where = 0.0, None
        for t, o in zip(points, outs):
            diff = float((o[:, : t + 1] - y[:, : t + 1]).abs().max())
            if diff > worst:
                worst, where = diff, t
        tol = 1e-4 * (float(y.abs().max()) + 1.0)
    return worst, where, tol


def _accepts(cls, kw: str) -> bool:
    params = inspect.signature(cls.__init__).parameters
    return kw in params


def check_mixer(name: str, *, knobs: dict | None = None, device: str = "cpu", d_model: int = 32,
                num_heads: int = 2, batch: int = 2, seq_len: int = 33, seed: int = 0,
                train_steps: int = 8) -> list[CheckResult]:
    """Run every contract check of mechanism ``name``; returns one result per check."""
    import torch

    from .registry import build_mixer, get_mixer
    spec = get_mixer(name)
    knobs = dict(knobs or {})
    dev = torch.device(device)
    out: list[CheckResult] = []
    res = lambda check, ok, detail="": out.append(
        CheckResult(name, check, "pass" if ok else "fail", detail))
    skip = lambda check, why: out.append(CheckResult(name, check, "skip", why))
    B, T, D = batch, seq_len, d_model

    def build():
        torch.manual_seed(seed)
        return build_mixer(spec, D, num_heads=num_heads, layer_idx=0, l_max=T, **knobs).to(dev)

    # build ---------------------------------------------------------------------------------
    try:
        m = build()
    except Exception as e:
        res("build", False, f"{type(e).__name__}: {e}")
        return out
    n_params = sum(p.numel() for p in m.parameters())
    st = None
    if hasattr(m, "state_size"):
        try:
            st = int(m.state_size(T))
        except Exception as e:
            res("build", False, f"state_size({T}) raised {type(e).__name__}: {e}")
            return out
    res("build", isinstance(m, torch.nn.Module),
        f"{n_params} params, state_size({T}) = {st if st is not None else 'not reported'}")
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    x = torch.randn(B, T, D, generator=g).to(dev)

    # forward -------------------------------------------------------------------------------
    try:
        with torch.no_grad():
            y = m(x)
            y_even = m(x[:, : T - 1])
        bad = []
        if tuple(y.shape) != (B, T, D):
            bad.append(f"shape {tuple(y.shape)}, want {(B, T, D)}")
        if tuple(y_even.shape) != (B, T - 1, D):
            bad.append(f"length {T - 1}: shape {tuple(y_even.shape)}")
        if not torch.isfinite(y).all():
            bad.append("non-finite outputs")
        res("forward", not bad, "; ".join(bad) or f"(B, T, D) -> {tuple(y.shape)}, lengths {T - 1} and {T}")
    except Exception as e:
        res("forward", False, f"{type(e).__name__}: {e}")
        return out

    # backend -------------------------------------------------------------------------------
    if not hasattr(m, "backend"):        # a plugin written for another harness (zoology's mixers)
        res("backend", True, f"no 'backend' attribute: backend defaults to the class name "
                             f"({spec.impl.__name__!r})")
    else:
        backend = m.backend
        res("backend", isinstance(backend, str) and bool(backend),
            f"backend = {backend!r}" if backend else "'backend' does not name the path used")

    # causality -----------------------------------------------------------------------------
    try:
        worst, where, tol = causal_leak(m, x, y=y, generator=g)
        res("causal", worst <= tol,
            f"max change of outputs up to t when inputs after t change: {worst:.2e}"
            + (f" (at t={where}; tolerance {tol:.1e})" if worst > tol else ""))
    except Exception as e:
        res("causal", False, f"{type(e).__name__}: {e}")

    # gradients -----------------------------------------------------------------------------
    try:
        m.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        w = torch.randn(B, T, D, generator=g).to(dev)
        (m(xg) * w).sum().backward()
        missing, zero, nonfinite = [], [], []
        for pn, p in m.named_parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                missing.append(pn)
            elif not torch.isfinite(p.grad).all():
                nonfinite.append(pn)
            elif not p.grad.abs().sum() > 0:
                zero.append(pn)
        if xg.grad is None or not torch.isfinite(xg.grad).all():
            missing.append("<input>")
        bad = ([f"no gradient: {', '.join(missing)}"] if missing else []) + \
              ([f"non-finite gradient: {', '.join(nonfinite)}"] if nonfinite else []) + \
              ([f"zero gradient: {', '.join(zero)}"] if zero else [])
        n_tr = sum(1 for p in m.parameters() if p.requires_grad)
        res("gradients", not bad, "; ".join(bad) or f"all {n_tr} trainable tensors and the input")
    except Exception as e:
        res("gradients", False, f"{type(e).__name__}: {e}")

    # determinism ---------------------------------------------------------------------------
    try:
        with torch.no_grad():
            a, b = m(x), m(x)
        same = torch.equal(a, b) if dev.type == "cpu" else _rel(a, b) < 1e-5
        res("deterministic", same, "two forward passes agree" if same else f"differ by {_rel(a, b):.2e}")
    except Exception as e:
        res("deterministic", False, f"{type(e).__name__}: {e}")

    # training ------------------------------------------------------------------------------
    try:
        mt = build()
        target = torch.randn(B, T, D, generator=g).to(dev)
        opt = torch.optim.Adam([p for p in mt.parameters() if p.requires_grad], lr=1e-2)
        losses = []
        for _ in range(train_steps):
            loss = torch.nn.functional.mse_loss(mt(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        with torch.no_grad():
            final = float(torch.nn.functional.mse_loss(mt(x), target))
        ok = final < losses[0] * 0.999 and all(map(lambda v: v == v, losses))
        res("train", ok, f"loss {losses[0]:.4f} -> {final:.4f} in {train_steps} Adam steps")
    except Exception as e:
        res("train", False, f"{type(e).__name__}: {e}")

    # functional core -----------------------------------------------------------------------
    if spec.core is None:
        skip("core", "no functional core registered")
    else:
        try:
            gd = torch.Generator(device="cpu").manual_seed(seed + 2)
            q, k, v = (torch.randn(2, 3, 17, 8, generator=gd, dtype=torch.float64) for _ in range(3))
            o = spec.core(q, k, v)
            bad = [] if tuple(o.shape) == (2, 3, 17, 8) else [f"shape {tuple(o.shape)}"]
            k2, v2 = k.clone(), v.clone()
            k2[..., 9:, :] += torch.randn(2, 3, 8, 8, generator=gd, dtype=torch.float64)
            v2[..., 9:, :] += torch.randn(2, 3, 8, 8, generator=gd, dtype=torch.float64)
            q2 = q.clone()
            q2[..., 9:, :] += 1.0
            diff = float((spec.core(q2, k2, v2)[..., :9, :] - o[..., :9, :]).abs().max())
            if diff > 1e-8 * (1 + float(o.abs().max())):
                bad.append(f"not causal: outputs up to 8 changed by {diff:.2e}")
            if not torch.isfinite(o).all():
                bad.append("non-finite outputs")
            for knob, vals in spec.core_grid.items():
                if vals:
                    spec.core(q, k, v, **{knob: vals[0]})
            res("core", not bad, "; ".join(bad) or
                f"(..., T, D) -> (..., T, D), causal; grid {dict(spec.core_grid) or '{}'}")
        except Exception as e:
            res("core", False, f"{type(e).__name__}: {e}")

    # host syncs in a training step --------------------------------------------------------------
    if dev.type != "cuda":
        skip("host-syncs", "no GPU")
    else:
        try:
            w = torch.randn(B, T, D, generator=g).to(dev)

            def step():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    yy = m(x)
                (yy.float() * w).sum().backward()
            for _ in range(2):
                step()
            torch.cuda.synchronize(dev)
            where = host_syncs(step)
            res("host-syncs", not where, f"{len(where)} in one forward+backward, first at {where[0]}"
                if where else "none in one forward+backward (bf16 autocast)")
        except Exception as e:
            res("host-syncs", False, f"{type(e).__name__}: {e}")

    # fast path vs reference ----------------------------------------------------------------
    if dev.type != "cuda":
        skip("fast-vs-ref", "no GPU")
    elif not _accepts(spec.impl, "backend") or "backend" in knobs:
        skip("fast-vs-ref", "no backend switch (a single path)")
    else:
        out.append(fast_vs_reference(name, knobs=knobs, device=device, d_model=D, num_heads=num_heads,
                                     batch=B, seq_len=max(T, 64), seed=seed))
    return out


@contextlib.contextmanager
def recording_host_syncs():
    """Within the block, CUDA's sync debugging is on; yields a list that, when the block ends,
    holds where each host sync was asked for ("file:line: message")."""
    import warnings

    import torch
    where: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield where
        finally:
            torch.cuda.set_sync_debug_mode("default")
            where += [f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}" for w in caught
                      if "called a synchronizing CUDA operation" in str(w.message)]


def host_syncs(fn) -> list[str]:
    """Run ``fn()`` under :func:`recording_host_syncs`; empty when the device was never waited for."""
    with recording_host_syncs() as where:
        fn()
    return where


def fast_vs_reference(name: str, *, knobs: dict | None = None, device: str = "cuda", d_model: int = 32,
                      num_heads: int = 2, batch: int = 2, seq_len: int = 64, seed: int = 0,
                      tol: float = 0.05) -> CheckResult:
    """Compare the automatically chosen path with ``backend="torch"`` under bf16 autocast:
    norm-relative error of outputs and of every parameter's gradient below ``tol``."""
    import torch

    from .registry import build_mixer, get_mixer
    spec = get_mixer(name)
    dev = torch.device(device)
    models = []
    for backend in ("torch", "auto"):
        torch.manual_seed(seed)
        models.append(build_mixer(spec, d_model, num_heads=num_heads, layer_idx=0, l_max=seq_len,
                                  **{**(knobs or {}), "backend": backend}).to(dev))
    g = torch.Generator(device="cpu").manual_seed(seed + 3)
    x = torch.randn(batch, seq_len, d_model, generator=g).to(dev)
    w = torch.randn(batch, seq_len, d_model, generator=g).to(dev)
    ys = []
    for m in models:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        (y.float() * w).sum().backward()
        ys.append(y.float())
    ref, fast = models
    if ref.backend == fast.backend:
        return CheckResult(name, "fast-vs-ref", "skip", f"one path on this machine ({fast.backend})")
    errs = {"output": _rel(ys[1], ys[0])}
    for (pn, pr), (_, pf) in zip(ref.named_parameters(), fast.named_parameters()):
        if pr.grad is not None and pf.grad is not None and pr.grad.norm() > 0:
            errs[f"grad {pn}"] = _rel(pf.grad, pr.grad)
    worst = max(errs, key=errs.get)
    ok = errs[worst] < tol
    return CheckResult(name, "fast-vs-ref", "pass" if ok else "fail",
                       f"{fast.backend} vs {ref.backend} (bf16): output rel err {errs['output']:.1e}, "
                       f"worst {worst} {errs[worst]:.1e} (tolerance {tol})")


def _device(arg: str) -> str:
    import torch
    if arg in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if arg.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {arg!r}: no CUDA device here")
    return arg


def main(args) -> int:
    from .commands import literal, parse_pairs, split_model
    from .registry import get_mixer, mixers
    given = [*args.names, *[m.strip() for m in (args.models or "").split(",") if m.strip()]]
    per_name: dict[str, dict] = {}
    for text in given:
        n, items = split_model(text)
        per_name.setdefault(n, {}).update({k: literal(v) for k, v in parse_pairs(items, f"{n}:").items()})
    names = list(per_name) or list(mixers())
    for n in names:
        get_mixer(n)                       # unknown name -> usage error naming the allowed ones
    shared = {k.removeprefix("mixer."): literal(v) for k, v in parse_pairs(args.knob, "--set").items()}
    device = _device(getattr(args, "device", "auto"))
    print(f"check-mixer: {len(names)} mechanism(s) on {device} "
          f"(B=2, T={args.seq_len}, d={args.d_model}, {args.heads} heads)", flush=True)
    failed: list[str] = []
    for n in names:
        knobs = {**shared, **per_name.get(n, {})}
        results = check_mixer(n, knobs=knobs, device=device, d_model=args.d_model, num_heads=args.heads,
                              seq_len=args.seq_len)
        bad = [r.check for r in results if not r.ok]
        print(f"{n}: {'FAIL' if bad else 'ok'}")
        for r in results:
            tag = {"pass": "pass", "fail": "FAIL", "skip": "skip"}[r.status]
            print(f"  {tag}  {r.check:<14} {r.detail}")
        if bad:
            failed.append(f"{n} ({', '.join(bad)})")
        print(flush=True)
    if failed:
        print(f"FAILED: {len(failed)} of {len(names)}: {'; '.join(failed)}")
        return 1
    print(f"all {len(names)} passed")
    return 0
