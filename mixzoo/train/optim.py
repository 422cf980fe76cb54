"""Optimizers and schedules of a run: AdamW or Muon (with AdamW beside it), cosine or
warmup-stable-decay, and the Parallax paper's weight-decay annealing.

Muon's parameters: every 2-D weight matrix of the hidden layers, i.e. every 2-D parameter except
the input embedding, the vocabulary head and the vector read-in/read-out (``embed``, ``head``,
``read_in``, ``read_out``; a head tied to the embedding is the embedding). Everything else goes to
AdamW: those input/output matrices, norms, biases, scalar and per-head parameters (ridges, decays,
gates' biases), and convolution kernels (depthwise short-convolution filters are (C, 1, k) tensors,
not matrices a Newton-Schulz orthogonalization means anything for). This is Keller Jordan's
convention for Muon (modded-nanogpt), the one torch.optim.Muon's documentation shows.

Muon runs ``torch.optim.Muon`` with ``adjust_lr_fn="match_rms_adamw"`` (Moonshot's scaling, 0.2 *
sqrt(max(A, B))): its update then has AdamW's RMS, so one learning rate and weight decay serve both
groups, which is what lets a sweep search one ``lr`` for either optimizer (``muon_lr`` overrides
Muon's). A run whose step is one CUDA graph (``train.graphed``) runs :class:`GraphMuon`, the same
update with the learning rate a device tensor.

Schedules (a multiplier of the learning rate per step): ``cosine`` (linear warm-up, cosine to
``min_lr_frac``) and ``wsd`` (linear warm-up, constant, then a linear decay to ``min_lr_frac`` over the
last ``decay_frac`` of the steps). ``wd_anneal_gamma`` = γ scales every group's weight decay by
(1 - t)^γ during the decay phase, t going 0 -> 1 through it (the Parallax paper, γ = 2; the decay
phase of ``cosine`` is everything after warm-up).
"""
from __future__ import annotations

import math

import torch
from torch import nn

IO_MODULES = ("embed", "head", "read_in", "read_out")


def split_params(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(Muon's, AdamW's) trainable (name, parameter) pairs, each parameter once (module docstring)."""
    io = {id(p) for name in IO_MODULES if hasattr(model, name) for p in getattr(model, name).parameters()}
    muon, adamw, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (muon if p.dim() == 2 and id(p) not in io else adamw).append((name, p))
    return muon, adamw


def _decay_groups(named, wd: float):
    """AdamW's groups: matrices and other >= 2-D tensors decay, vectors and scalars do not."""
    decay = [p for _, p in named if p.dim() >= 2]
    other = [p for _, p in named if p.dim() < 2]
    return [g for g in ({"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0})
            if g["params"]]


class Combined(torch.optim.Optimizer):
    """Several optimizers stepped as one, for Lightning's automatic optimization (which takes one
    optimizer per step). The param_groups are the inner optimizers' own group dicts, so a learning-rate
    scheduler or a weight-decay schedule that edits them edits the inner optimizers."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        super().__init__(params, {})
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state):
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


MUON_NS = (3.4445, -4.7750, 2.0315)    # torch.optim.Muon's quintic Newton-Schulz coefficients


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """torch.optim.Muon's orthogonalization of a 2-D update (bf16, the wide orientation, normalized,
    ``steps`` quintic iterations), the same operations in the same order."""
    a, b, c = MUON_NS
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class GraphMuon(torch.optim.Optimizer):
    """Muon as ``torch.optim.Muon(..., nesterov=True, adjust_lr_fn="match_rms_adamw")`` computes it,
    with the learning rate a 0-dim float64 tensor on the parameters' device that the step reads on
    the device. Why not torch.optim.Muon itself: it reads a tensor learning rate on the host
    (``_to_scalar``), which a CUDA graph capture refuses, and a float one would be frozen into the
    graph, schedule and all. The update per matrix p of shape (A, B): momentum buffer b ← lerp(b, g,
    1 - μ); u = NS(lerp(g, b, μ)); p ← p (1 - lr λ); p ← p - 0.2 sqrt(max(A, B)) lr u."""

    def __init__(self, params, lr: torch.Tensor, weight_decay: float, momentum: float = 0.95, ns_steps: int = 5,
                 eps: float = 1e-7):
        if not (isinstance(lr, torch.Tensor) and lr.dim() == 0):
            raise ValueError("GraphMuon: lr must be a 0-dim tensor")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "ns_steps": ns_steps, "eps": eps})
        for g in self.param_groups:
            if any(p.dim() != 2 for p in g["params"]):
                raise ValueError("GraphMuon: matrices only")

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            lr, wd, mu = g["lr"], g["weight_decay"], g["momentum"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = st["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                u = newton_schulz(p.grad.lerp(buf, mu), g["ns_steps"], g["eps"])
                p.mul_(1 - lr * wd)
                p.addcmul_(u, lr * (-0.2 * math.sqrt(max(p.shape[0], p.shape[1]))))


def build_optimizer(model: nn.Module, cfg, fused: bool) -> torch.optim.Optimizer:
    """AdamW (betas 0.9, 0.98) over every parameter, or Muon over the hidden matrices and AdamW over
    the rest (``cfg.optimizer``). Every group remembers its weight decay as ``base_weight_decay``."""
    if cfg.optimizer == "adamw":
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        seen, uniq = set(), []
        for n, p in named:
            if id(p) not in seen:
                seen.add(id(p))
                uniq.append((n, p))
        opt = torch.optim.AdamW(_decay_groups(uniq, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98), fused=fused)
    else:
        muon, rest = split_params(model)
        opts = []
        if muon:
            opts.append(torch.optim.Muon([p for _, p in muon], lr=cfg.muon_lr or cfg.lr, weight_decay=cfg.weight_decay,
                                         momentum=cfg.muon_momentum, adjust_lr_fn="match_rms_adamw"))
        if rest:
            opts.append(torch.optim.AdamW(_decay_groups(rest, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98),
                                          fused=fused))
        opt = opts[0] if len(opts) == 1 else Combined(opts)
    for g in opt.param_groups:
        g["base_weight_decay"] = g["weight_decay"]
    return opt


def phases(cfg) -> tuple[int, int]:
    """(warm-up steps, first step of the decay phase)."""
    warm = max(1, int(cfg.warmup_frac * cfg.steps))
    if cfg.schedule == "wsd":
        return warm, max(warm, cfg.steps - int(round(cfg.decay_frac * cfg.steps)))
    return warm, warm


def lr_lambda(cfg):
    """The learning-rate multiplier of step ``s`` (module docstring)."""
    warm, decay_start = phases(cfg)

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        p = min(1.0, (step - decay_start) / max(1, cfg.steps - decay_start)) if step >= decay_start else 0.0
        if cfg.schedule == "wsd":
            return 1.0 - (1.0 - cfg.min_lr_frac) * p
        return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def wd_multiplier(cfg, step: int) -> float:
    """(1 - t)^γ in the decay phase (t its progress), else 1; 1 everywhere without ``wd_anneal_gamma``."""
    if cfg.wd_anneal_gamma is None:
        return 1.0
    _, decay_start = phases(cfg)
    if step < decay_start:
        return 1.0
    t = min(1.0, (step - decay_start) / max(1, cfg.steps - decay_start))
    return (1.0 - t) ** cfg.wd_anneal_gamma


def anneal_weight_decay(opt: torch.optim.Optimizer, cfg, step: int) -> None:
    """Set every group's weight decay for ``step`` (host-side floats: no device work, no sync)."""
    m = wd_multiplier(cfg, step)
    for g in opt.param_groups:
        g["weight_decay"] = g["base_weight_decay"] * m
