"""Capture the first non-finite training step, for diagnosing a divergence.

``NonFiniteCapture(dir)`` is a Lightning callback for ``train(..., callbacks=[...])``. After every
backward it checks the loss and every gradient (one host read per step: a debugging aid, never on by
default). At the first non-finite one, with the parameters still as that step's forward saw them, it
replays the step with hooks on every module and saves, to ``dir/nonfinite-step<N>.pt``:

* the step, the batch (inputs, targets, mask, selected positions) and the parameters;
* which parameters got a non-finite gradient, and the loss;
* the first module (in execution order) whose forward output is non-finite, and the first module (in
  backward order) whose gradient with respect to its output is non-finite;
* every mixer's input and the gradient with respect to its output, so that a mechanism's fast path can
  be compared with its float64 reference on exactly this step (``replay_mixer``).

Then training stops with ``Diverged`` naming the step, the modules and the file.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models import mixers_of


def _finite(t) -> bool:
    return not torch.is_tensor(t) or not t.is_floating_point() or bool(torch.isfinite(t).all())


def _tensors(x):
    if torch.is_tensor(x):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for e in x for t in _tensors(e)]
    return []


def locate_nonfinite(model: nn.Module, run_forward, loss_of, keep: int | None = None) -> dict[str, Any]:
    """Run ``loss_of(run_forward())`` and its backward with hooks on every named module.

    Returns the first module with a non-finite forward output, the first (in backward order) with a
    non-finite gradient of its output, the largest |output| and |gradient of the output| of every
    module, each mixer's input and output gradient (the first ``keep`` examples; all by default),
    every parameter's gradient norm (float64), and the loss."""
    names = {m: n for n, m in model.named_modules() if n}
    mixers = {id(m): i for i, m in enumerate(mixers_of(model))}
    found: dict[str, Any] = {"forward": None, "backward": None, "mixer_in": {}, "mixer_grad_out": {},
                             "forward_max_abs": {}, "backward_max_abs": {}}
    handles = []

    def fwd(mod, args, out):
        name = names[mod]
        outs = _tensors(out)
        if outs and outs[0].is_floating_point():
            found["forward_max_abs"][name] = float(outs[0].detach().float().abs().nan_to_num(math.inf).max())
        if found["forward"] is None and not all(_finite(t) for t in outs):
            found["forward"] = name
        if id(mod) in mixers:
            found["mixer_in"][mixers[id(mod)]] = args[0].detach()[:keep].cpu()

    def bwd(mod, grad_in, grad_out):
        gos = [t for t in _tensors(grad_out) if t.is_floating_point()]
        if gos:
            found["backward_max_abs"][names[mod]] = float(gos[0].detach().double().abs().nan_to_num(math.inf).max())
        if found["backward"] is None and not all(_finite(t) for t in gos):
            found["backward"] = names[mod]
        if id(mod) in mixers:
            found["mixer_grad_out"][mixers[id(mod)]] = grad_out[0].detach()[:keep].cpu()

    for m in names:
        handles.append(m.register_forward_hook(fwd))
        handles.append(m.register_full_backward_hook(bwd))
    try:
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings():      # "full backward hook ... no inputs require gradients"
            warnings.simplefilter("ignore", UserWarning)
            loss = loss_of(run_forward())
            found["loss"] = float(loss.detach())
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    found["nonfinite_grads"] = [n for n, p in model.named_parameters()
                                if p.grad is not None and not _finite(p.grad)]
    # in float64: a float32 norm overflows to inf for gradients of finite elements above ~1e19
    found["grad_norms"] = {n: float(p.grad.double().norm()) for n, p in model.named_parameters()
                           if p.grad is not None}
    return found


class NonFiniteCapture:
    """Lightning callback (built lazily so importing this module does not import Lightning)."""

    def __new__(cls, out_dir: str | Path, *, meta: dict[str, Any] | None = None):
        import lightning.pytorch as pl

        class _Capture(pl.Callback):
            def __init__(self):
                self.dir, self.meta, self.path, self.step = Path(out_dir), dict(meta or {}), None, None

            def on_before_optimizer_step(self, trainer, module, optimizer):
                params = [p for p in module.parameters() if p.grad is not None]
                norms = torch._foreach_norm([p.grad for p in params]) if params else []
                total = torch.stack([n.float() for n in norms]).sum() if norms else torch.zeros(())
                last = module.last_loss
                if bool(torch.isfinite(total)) and bool(torch.isfinite(last)):
                    return
                self.step = trainer.global_step
                self.path = self._save(module, trainer.global_step, float(last))
                from .loop import Diverged
                raise Diverged(self.summary)

            def _save(self, module, step: int, loss: float) -> Path:
                b, select = module.last_batch
                model = module.model
                state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
                bad = [n for n, p in model.named_parameters()
                       if p.grad is not None and not _finite(p.grad)]
                step_norms = {n: float(p.grad.double().norm()) for n, p in model.named_parameters()
                              if p.grad is not None}
                dev = b.inputs.device
                ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda"
                       else torch.autocast("cpu", enabled=False))

                def run():
                    with ctx:
                        return model(b.inputs) if select is None else model(b.inputs, select=select)
                found = locate_nonfinite(model, run, lambda out: module.loss_of(out, b))
                rec = {"step": step, "loss": loss, "nonfinite_grads_in_step": bad, "grad_norms_in_step": step_norms,
                       "state_dict": state, "meta": self.meta, **found,
                       "batch": {"inputs": b.inputs.cpu(), "targets": b.targets.cpu(), "mask": b.mask.cpu(),
                                 "select": None if select is None else select.cpu()}}
                self.dir.mkdir(parents=True, exist_ok=True)
                path = self.dir / f"nonfinite-step{step}.pt"
                tmp = path.with_suffix(".pt.tmp")
                torch.save(rec, tmp)
                tmp.replace(path)
                first = bad[0] if bad else "none"
                top = max(step_norms, key=step_norms.get) if step_norms else "none"
                self.summary = (f"non-finite at step {step} (loss {loss}; {len(bad)} parameters with a "
                                f"non-finite gradient, first {first}; largest gradient norm {top} "
                                f"{step_norms.get(top, math.nan):.3g}; replay: forward first non-finite at "
                                f"{found['forward']}, backward at {found['backward']}); capture: {path}")
                return path

        return _Capture()


def replay_mixer(mixer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, *, device,
                 fast_kw: dict | None = None) -> dict[str, Any]:
    """One mixer on a captured input: its fast path under bf16 autocast (as trained) against its
    reference path (``backend="torch"`` where the mechanism has one) in float64, both backpropagating
    the captured output gradient. Returns relative errors and finiteness of output, input gradient and
    every parameter gradient."""
    import copy
    res: dict[str, Any] = {}
    runs = {}
    for tag in ("fast", "f64"):
        m = copy.deepcopy(mixer).to(device)
        if tag == "f64":
            m = m.double()
            if hasattr(m, "requested"):
                m.requested = "torch"
        xi = x.detach().to(device, torch.float64 if tag == "f64" else torch.float32).clone().requires_grad_(True)
        ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if (tag == "fast" and xi.is_cuda)
               else torch.autocast(xi.device.type, enabled=False))
        with ctx:
            o = m(xi)
        (o.float() * grad_out.to(device).float()).sum().backward() if tag == "fast" else \
            (o * grad_out.to(device, torch.float64)).sum().backward()
        runs[tag] = (o.detach().double(), xi.grad.detach().double(),
                     {n: p.grad.detach().double() for n, p in m.named_parameters() if p.grad is not None})
        res[f"{tag}_dx_max_per_example"] = xi.grad.detach().double().abs().flatten(1).max(1).values.cpu().tolist()
        res[f"{tag}_backend"] = getattr(m, "backend", "?")

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))
    (of, gf, pf), (o64, g64, p64) = runs["fast"], runs["f64"]
    res.update(out_finite=_finite(of), dx_finite=_finite(gf), ref_out_finite=_finite(o64),
               ref_dx_finite=_finite(g64), out_rel=rel(of, o64), dx_rel=rel(gf, g64),
               grads={n: (rel(pf[n], p64[n]), _finite(pf[n]), _finite(p64[n])) for n in p64 if n in pf},
               out_abs_max=float(o64.abs().max()), out_rms=float(o64.pow(2).mean().sqrt()))
    return res
