"""Mechanism diagnostics: named scalars a mixer reports about itself (``diagnostics(x) -> dict``,
optional in the mixer contract), read by the trainer at every validation on the mixers' inputs for
a few validation examples, and kept in the run's history (``diag/layer<i>/<name>``) and, as of the
last validation, in the row's ``diagnostics_json``. Only mixers that define the method cost anything.
"""
from __future__ import annotations

import torch

from ..models import mixers_of


@torch.no_grad()
def mixer_diagnostics(model: torch.nn.Module, inputs: torch.Tensor, precision: str) -> dict[str, float]:
    """Every mixer's diagnostics on its own input for ``inputs`` (a few examples): {"layer<i>/<name>": v}."""
    mixers = [m for m in mixers_of(model)]
    want = {i for i, m in enumerate(mixers) if callable(getattr(m, "diagnostics", None))}
    if not want:
        return {}
    seen: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0].detach()))
             for i, m in enumerate(mixers) if i in want]
    was = model.training
    model.eval()
    ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if precision.startswith("bf16") and inputs.is_cuda
           else torch.autocast(inputs.device.type, enabled=False))
    try:
        with ctx:
            model(inputs)
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    out = {}
    for i in sorted(seen):
        for name, value in mixers[i].diagnostics(seen[i].float()).items():
            out[f"layer{i}/{name}"] = float(value)
    return out
