"""What the GPU layer tests share: a norm-relative error, and one forward and backward of a layer (under bf16
autocast or not) with its output, input gradient and every parameter's gradient."""
from __future__ import annotations

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def layer_grads(mod: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, amp: bool) -> list[torch.Tensor]:
    """[output, dL/dx, each parameter's gradient] of L = Σ mod(x)·dy, under bf16 autocast when ``amp``."""
    x = x.clone().requires_grad_()
    mod.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        y = mod(x)
    (y.to(dy.dtype) * dy).sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in mod.parameters()]
