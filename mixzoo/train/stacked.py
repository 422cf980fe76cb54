"""``step_mode="stacked"``: K runs of one architecture trained as one batched model.

K configurations that differ only in seed, ``lr`` (and ``muon_lr``) and ``weight_decay`` (a sweep's trials, or the
seeds of its best configuration) are built as K models exactly as ``loop.train`` builds each (same
seed, same initialization, same training set and batch order), then trained together:

* **weights** stacked along a leading dimension: every trainable parameter is a (K, ...) view of one
  flat (K, N) float32 buffer (matrices first, then vectors);
* **forward** ``torch.func.vmap`` of ``functional_call`` over the K weight sets and the K batches: a
  Linear becomes one batched matmul for all K models, a norm or a convolution one kernel. A
  mechanism's core, where it is a custom op (SDPA, fla's Triton kernels), runs once for all K models
  with the models folded into its batch or its heads (``mixzoo.train.vmapfold``);
* **loss** each model's mean over its supervised positions, summed over the models for one backward
  (the models share no weight, so each model's gradient is its own loss's);
* **clipping** per model: the norm over that model's gradients, as ``clip_grad_norm_`` computes it;
* **optimizer** AdamW as ``torch.optim.AdamW`` computes it (decoupled weight decay on matrices only,
  betas 0.9/0.98), written as a functional step on the flat buffer with per-model learning rate and
  weight decay as (K, 1) tensors: one set of about a dozen kernels for all K models and every
  parameter, whatever K. (The alternative, one ``torch.optim`` param group per model, needs the
  weights as K separate tensors and a stack of every weight at every step.) Its state (step,
  schedule, per-model rates) lives on the device, so the step can be captured in a CUDA graph
  (``step_mode="stacked+graphed"``). With ``optimizer="muon"``: Muon as torch.optim.Muon computes it
  on each hidden matrix (``optim.split_params``), batched over the K models (one Newton-Schulz
  iteration of batched matmuls per matrix for all K), and that AdamW on the rest of the buffer.

Each model's validation, best weights, early stop, divergence and test score are its own, with the
same code as ``loop.train`` (``steploop.Book``). A model that stops (early stop, non-finite loss, its
``on_eval`` raising, e.g. a pruned trial) is frozen (learning rate 0: its weights do not move) while
the others go on, and the stack is compacted at that validation: rebuilt with the models still
training only (``Stack.take``: their weights, optimizer state, step counter and schedule position,
rates, batch orders and training sets, copied; graphed, a new capture after a few eager steps, the old
graph released), the stopped models' weights kept aside for their results, so that later steps compute
the survivors only (the last one goes on as a stack of one). It is rebuilt where the steps saved
outweigh a rebuild's cost (``worth_compacting``), says so in the log ("stacked: compacted 6 -> 4 at
step 500"), and ``MIXZOO_STACK_COMPACT=0`` turns it off (stopped models stay in the stack, frozen).
Results match training each model alone up to floating-point reordering (tests/test_stacked.py).

Not supported (``train_stacked`` raises UsageError): ``compile``, configurations differing in
anything but seed, lr and weight_decay. Where the stacked step cannot run (a mechanism that does not
vmap, e.g. a host read in its forward), ``train_stacked`` falls back to K separate eager runs and
says why (``result.step_mode_reason``).
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from ..models import ModelConfig, build_model
from ..tasks.base import IGNORE, Batch, Task
from .config import RunResult, TrainConfig, physical_gpu
from .loop import count_params, eval_autocast, failure_reason, loss_fn, resolve_device
from .metrics import Accumulator
from .optim import MUON_NS, lr_lambda, split_params, wd_multiplier
from .steploop import Book, autocast, mark, peak_mem, precision_of, seed_all, sparse_width, splits, train_data
from .vmapfold import folding

PER_MODEL = ("lr", "muon_lr", "weight_decay", "step_mode")     # what may differ between the K configurations


class StackedModel:
    """K models of one architecture as one: stacked weights, a vmapped forward."""

    def __init__(self, models: Sequence[nn.Module], first: Sequence[str] = ()):
        """``first``: names of matrices laid out before every other parameter (Muon's, whose
        region is then ``flat[:, :n_first]``; ``first_views`` gives (name, offset, shape))."""
        self.K = K = len(models)
        self.template = models[0]
        named = list(self.template.named_parameters())          # tied weights once
        by_model = [dict(m.named_parameters()) for m in models]
        for name, p in named:
            if p.dtype != torch.float32:
                raise UsageError(f"stacked: parameter {name} is {p.dtype}; stacking needs float32 weights")
        train = [(n, p) for n, p in named if p.requires_grad]
        first = set(first)
        # stable: `first` matrices, then the other matrices (decayed), then vectors
        train.sort(key=lambda np_: 0 if np_[0] in first else 1 if np_[1].dim() >= 2 else 2)
        self.names = [n for n, _ in train]
        self.n_decay = sum(p.numel() for _, p in train if p.dim() >= 2)
        self.n_first = sum(p.numel() for n, p in train if n in first)
        self.layout, off = [], 0                    # (name, offset, shape) of each trainable parameter
        for n, p in train:
            self.layout.append((n, off, tuple(p.shape)))
            off += p.numel()
        self.first_views = [v for v in self.layout if v[0] in first]
        dev = named[0][1].device
        with torch.no_grad():
            flat = torch.cat([torch.stack([m[n].detach() for m in by_model]).reshape(K, -1) for n, _ in train],
                             dim=1) if train else torch.empty(K, 0, device=dev)
            fixed = {n: torch.stack([m[n].detach() for m in by_model]) for n, p in named if not p.requires_grad}
            bufs = [dict(m.named_buffers()) for m in models]
            buffers = {n: torch.stack([b[n] for b in bufs]) for n in bufs[0]}
            self._bind(flat, fixed, buffers)

    def _bind(self, flat: torch.Tensor, fixed: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> None:
        """Set the weights: ``flat`` (K, N), its trainable views, the untrained parameters and buffers."""
        self.K = K = flat.shape[0]
        self.flat = flat
        self.params = {n: flat[:, off:off + math.prod(shape)].view(K, *shape).requires_grad_()
                       for n, off, shape in self.layout}
        self.params.update(fixed)
        self.buffers = buffers
        self.leaves = [self.params[n] for n in self.names]

    @torch.no_grad()
    def take(self, rows: Sequence[int]) -> StackedModel:
        """Models ``rows`` (positions in this stack) as a stack of their own: copies of their weights
        and buffers, in the same layout (compaction: ``_run``)."""
        r = torch.tensor(list(rows), dtype=torch.long, device=self.flat.device)
        new = object.__new__(StackedModel)
        new.template, new.names, new.n_decay, new.n_first = self.template, self.names, self.n_decay, self.n_first
        new.layout, new.first_views = self.layout, self.first_views
        fixed = {n: p.index_select(0, r) for n, p in self.params.items() if n not in self.names}
        new._bind(self.flat.detach().index_select(0, r), fixed,
                  {n: b.index_select(0, r) for n, b in self.buffers.items()})
        return new

    def forward(self, inputs: torch.Tensor, select: torch.Tensor | None = None) -> torch.Tensor:
        """(K, B, ...) inputs (and (K, B, S) positions) -> (K, B, ..., out)."""
        from torch.func import functional_call, vmap

        def one(params, buffers, x, sel):
            kw = {} if sel is None else {"select": sel}
            return functional_call(self.template, (params, buffers), (x,), kw)
        return vmap(one, in_dims=(0, 0, 0, None if select is None else 0), randomness="error")(
            self.params, self.buffers, inputs, select)

    def flat_grad(self) -> torch.Tensor:
        missing = [n for n, p in zip(self.names, self.leaves) if p.grad is None]
        if missing:
            raise RuntimeError(f"stacked: no gradient reached {', '.join(missing[:3])}")
        return torch.cat([p.grad.reshape(self.K, -1) for p in self.leaves], dim=1)

    @torch.no_grad()
    def load_into(self, k: int, module: nn.Module) -> nn.Module:
        """Copy model ``k``'s weights into ``module`` (an unstacked model of the same architecture)."""
        for n, p in module.named_parameters():
            p.copy_(self.params[n][k])
        for n, b in module.named_buffers():
            b.copy_(self.buffers[n][k])
        return module


def clip_per_model_(g: torch.Tensor, max_norm: float) -> None:
    """``clip_grad_norm_`` for each row of the flat (K, N) gradient (its total norm over all of that
    model's gradients, scale min(1, max_norm / (norm + 1e-6)))."""
    norm = torch.linalg.vector_norm(g, 2, dim=1, keepdim=True)
    g.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))


class StackedAdamW:
    """AdamW on the flat (K, N) weights with per-model lr and weight decay (module docstring).

    The update is torch.optim.AdamW's (decoupled weight decay, bias-corrected moments), per element:
    p *= 1 - lr_k * wd_k (matrices only); m = lerp(m, g, 1 - b1); v = b2 v + (1 - b2) g²;
    p -= lr_k / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). Per step, lr_k is its base rate
    times the schedule's multiplier (``optim.lr_lambda``), read from a table on the device at the
    device step counter, so that nothing of the step lives on the host."""

    def __init__(self, sm: StackedModel, cfgs: Sequence[TrainConfig], betas=(0.9, 0.98), eps: float = 1e-8,
                 start: int = 0):
        """``start``: the update covers ``flat[:, start:]`` only (Muon takes the columns before it)."""
        cfg = cfgs[0]
        dev, K = sm.flat.device, sm.K
        f64 = dict(device=dev, dtype=torch.float64)
        self.sm, self.b1, self.b2, self.eps, self.start = sm, betas[0], betas[1], eps, start
        self.m = torch.zeros_like(sm.flat[:, start:])
        self.v = torch.zeros_like(sm.flat[:, start:])
        self.t = torch.zeros((), **f64)
        self.lr = torch.tensor([[c.lr] for c in cfgs], **f64)
        self.wd = torch.tensor([[c.weight_decay] for c in cfgs], **f64)
        self.on = torch.ones(K, 1, **f64)                      # 0: frozen (stopped or failed)
        sched = lr_lambda(cfg)
        self.lr_table = torch.tensor([sched(s) for s in range(cfg.steps)], **f64)
        self.wd_table = torch.tensor([wd_multiplier(cfg, s) for s in range(cfg.steps)], **f64)

    def freeze(self, k: int) -> None:
        self.on[k] = 0.0

    @torch.no_grad()
    def take(self, sm: StackedModel, rows: Sequence[int]) -> StackedAdamW:
        """This optimizer's state for models ``rows`` over ``sm`` (``StackedModel.take`` of the same
        rows): their moments, rates and freeze flags, the step counter and the schedule tables."""
        r = torch.tensor(list(rows), dtype=torch.long, device=self.m.device)
        new = object.__new__(StackedAdamW)
        new.__dict__.update(self.__dict__)              # betas, eps, start, the schedule tables
        new.sm, new.t = sm, self.t.clone()
        for name in ("m", "v", "lr", "wd", "on"):
            setattr(new, name, getattr(self, name).index_select(0, r))
        return new

    @torch.no_grad()
    def step(self, g: torch.Tensor, idx: torch.Tensor) -> None:
        """One update with the flat gradient ``g``, at schedule step ``idx`` (a (1,) long tensor)."""
        s = self.start
        p, m, v, g = self.sm.flat[:, s:], self.m, self.v, g[:, s:]
        self.t += 1
        lr = self.lr * self.lr_table.index_select(0, idx) * self.on             # (K, 1) float64
        if self.sm.n_decay > s:
            wd = self.wd * self.wd_table.index_select(0, idx)
            p[:, :self.sm.n_decay - s].mul_((1 - lr * wd).float())
        m.lerp_(g, 1 - self.b1)
        v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
        step_size = (lr / (1 - self.b1 ** self.t)).float()
        bc2_sqrt = (1 - self.b2 ** self.t).sqrt().float()
        denom = (v.sqrt() / bc2_sqrt).add_(self.eps)
        p.add_(m.div(denom).mul_(-step_size))


def newton_schulz_stacked(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """``optim.newton_schulz`` of each (A, B) matrix of a (K, A, B) stack (per-matrix norms, batched
    matmuls)."""
    a, b, c = MUON_NS
    x = g.bfloat16()
    tall = g.size(1) > g.size(2)
    if tall:
        x = x.mT
    x = x / torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class StackedMuon:
    """Muon on the hidden matrices of K stacked models (``flat[:, :n_first]``), with AdamW
    (``StackedAdamW``) on the rest: per model and matrix p of shape (A, B) the update of
    torch.optim.Muon(nesterov=True, adjust_lr_fn="match_rms_adamw") with that model's rate:
    b ← lerp(b, g, 1 - μ); u = NS(lerp(g, b, μ)); p ← p (1 - lr_k λ_k); p ← p - 0.2 sqrt(max(A, B)) lr_k u.
    lr_k is ``muon_lr`` (or ``lr``) times the schedule, λ_k the weight decay times its annealing."""

    def __init__(self, sm: StackedModel, cfgs: Sequence[TrainConfig]):
        cfg = cfgs[0]
        f64 = dict(device=sm.flat.device, dtype=torch.float64)
        self.sm, self.mu = sm, cfg.muon_momentum
        self.adamw = StackedAdamW(sm, cfgs, start=sm.n_first)
        self.buf = torch.zeros_like(sm.flat[:, :sm.n_first])
        self.lr = torch.tensor([[c.muon_lr or c.lr] for c in cfgs], **f64)
        self.wd = torch.tensor([[c.weight_decay] for c in cfgs], **f64)

    def freeze(self, k: int) -> None:
        self.adamw.freeze(k)

    @torch.no_grad()
    def take(self, sm: StackedModel, rows: Sequence[int]) -> StackedMuon:
        """``StackedAdamW.take`` for Muon: the momentum buffers and rates of models ``rows`` too."""
        r = torch.tensor(list(rows), dtype=torch.long, device=self.buf.device)
        new = object.__new__(StackedMuon)
        new.sm, new.mu, new.adamw = sm, self.mu, self.adamw.take(sm, rows)
        new.buf, new.lr, new.wd = (t.index_select(0, r) for t in (self.buf, self.lr, self.wd))
        return new

    @torch.no_grad()
    def step(self, g: torch.Tensor, idx: torch.Tensor) -> None:
        a, K = self.adamw, self.sm.K
        lr = self.lr * a.lr_table.index_select(0, idx) * a.on                     # (K, 1) float64
        decay = (1 - lr * self.wd * a.wd_table.index_select(0, idx)).float()[:, :, None]
        for _, off, (A, B) in self.sm.first_views:
            n = A * B
            p = self.sm.flat[:, off:off + n].view(K, A, B)
            gk = g[:, off:off + n].view(K, A, B)
            buf = self.buf[:, off:off + n].view(K, A, B)
            buf.lerp_(gk, 1 - self.mu)
            u = newton_schulz_stacked(gk.lerp(buf, self.mu))
            p.mul_(decay)
            p.add_(u * (lr * (-0.2 * (max(A, B) ** 0.5))).float()[:, :, None])
        a.step(g, idx)


def stacked_eval() -> str:
    """How a stacked run validates: ``MIXZOO_STACKED_EVAL`` (``kernels.STACKED_EVAL``; its first is the default)."""
    from ..kernels import chosen
    return chosen("MIXZOO_STACKED_EVAL")


# the most output elements (K models x sequences x length x vocabulary) one vmapped validation batch makes: MQAR's
# V = 8192, L = 512 would make 6.4e9 at K = 6 and batches of 256
EVAL_ELEMENTS = 2 ** 28


@torch.no_grad()
def evaluate_stack(sm: StackedModel, task: Task, datas: Sequence[Batch], batch_size: int, precision: str,
                   max_elements: int = EVAL_ELEMENTS) -> list[dict[str, float]]:
    """``loop.evaluate`` of each model of the stack, row r on ``datas[r]`` (splits of one size), the K models in one
    vmapped forward a batch: batches of ``batch_size`` sequences a model, fewer where the K models' outputs would
    pass ``max_elements``. The same metrics as evaluating each model on its own, up to float32 reordering."""
    K, first = sm.K, datas[0]
    same = all(d is first for d in datas)        # the trials of one study: one validation split
    width = task.vocab_size if task.kind == "classification" else task.d_out
    rows = max(1, min(batch_size, max_elements // max(1, K * first.inputs.shape[1] * width)))
    accs = [Accumulator(task.kind, task.vocab_size if task.kind == "classification" else 0) for _ in range(K)]
    ctx = eval_autocast(precision, first.inputs.device)
    tpl = sm.template
    was = tpl.training
    tpl.eval()
    try:
        with folding():                          # re-entrant: a stacked run's validations are inside its own
            for a in range(0, len(first), rows):
                bs = [first.index(slice(a, a + rows))] * K if same else [d.index(slice(a, a + rows)) for d in datas]
                x = bs[0].inputs.unsqueeze(0).expand(K, *bs[0].inputs.shape) if same else \
                    torch.stack([b.inputs for b in bs])
                with ctx:
                    out = sm.forward(x)
                for r, b in enumerate(bs):
                    _, lsum = loss_fn(task.kind, out[r], b)
                    accs[r].update(out[r], b.targets, b.mask, b.slices, lsum)
    finally:
        tpl.train(was)
    return [acc.compute() for acc in accs]


def per_model_loss(kind: str, out: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(K,) each model's ``loop.loss_fn`` loss: its mean over its supervised positions."""
    K = out.shape[0]
    if kind == "classification":
        tgt = torch.where(mask, targets, IGNORE)
        s = F.cross_entropy(out.flatten(0, -2).float(), tgt.flatten(), ignore_index=IGNORE,
                            reduction="none").view(K, -1).sum(1)
    else:
        s = (((out.float() - targets.float()) ** 2).mean(-1) * mask).view(K, -1).sum(1)
    return s / mask.view(K, -1).sum(1).clamp_min(1)


def check_configs(cfgs: Sequence[TrainConfig]) -> None:
    if not cfgs:
        raise UsageError("stacked: no configurations")
    first = {k: v for k, v in cfgs[0].as_dict().items() if k not in PER_MODEL}
    for c in cfgs[1:]:
        other = {k: v for k, v in c.as_dict().items() if k not in PER_MODEL}
        diff = sorted(k for k in first if first[k] != other.get(k))
        if diff:
            raise UsageError(f"stacked: configurations differ in {', '.join(diff)}; only seed, lr and "
                             f"weight_decay may differ")
    c = cfgs[0]
    if c.optimizer not in ("adamw", "muon"):
        raise UsageError(f"stacked: optimizer={c.optimizer!r}; stacked training runs adamw and muon only")
    if c.compile != "off":
        raise UsageError(f"stacked: compile={c.compile!r}; stacked training runs with compile=off")


class _Setup(Exception):
    """Raised for a failure before the first stacked step completed (then: separate eager runs)."""


def train_stacked(task: Task, mixer: str, knobs: dict[str, Any] | None = None,
                  model_cfg: ModelConfig | None = None, cfgs: Sequence[TrainConfig] = (),
                  seeds: Sequence[int] = (), device: str | None = "auto",
                  on_eval: Sequence[Callable[[int, dict[str, float]], None] | None] | None = None,
                  log: Callable[[str], None] | None = None, data: dict[str, Batch] | None = None,
                  graphed: bool | None = None, keep_weights: bool = False) -> list[RunResult]:
    """Train K = len(cfgs) runs of ``mixer`` on ``task`` as one stacked model; one RunResult each,
    as ``loop.train`` would give for (cfgs[k], seeds[k]).

    ``data``: one set of splits for every run (else each seed's own, as loop.train generates them).
    ``on_eval[k](step, val)`` is called after each of run k's validations; what it raises stops run k
    only, and is kept in ``results[k].hook_error`` (the caller decides: e.g. a pruned trial); a
    KeyboardInterrupt (Ctrl-C, SIGTERM) stops them all and is raised.
    ``graphed``: capture the step in a CUDA graph (default: where cfgs[0].step_mode asks for it and the
    device is CUDA). Each result says which step mode ran (``step_mode``) and why, where it is not the
    one asked for (``step_mode_reason``). ``keep_weights``: also keep each model's weights after its
    last step in ``results[k].final_state_dict`` (before its best weights are loaded to score test)."""
    cfgs, seeds = list(cfgs), [int(s) for s in seeds]
    if len(cfgs) != len(seeds):
        raise UsageError(f"stacked: {len(cfgs)} configurations but {len(seeds)} seeds")
    check_configs(cfgs)
    knobs, model_cfg = dict(knobs or {}), model_cfg or ModelConfig()
    hooks = list(on_eval) if on_eval is not None else [None] * len(cfgs)
    dev = resolve_device(device)
    want_graph = (cfgs[0].step_mode == "stacked+graphed") if graphed is None else bool(graphed)
    reason = ""
    if want_graph and dev.type != "cuda":
        want_graph, reason = False, "CUDA graphs need a CUDA device"
    try:
        results, graph_reason = _run(task, mixer, knobs, model_cfg, cfgs, seeds, dev, hooks, log, data, want_graph,
                                     keep_weights)
        mode = "stacked+graphed" if want_graph and not graph_reason else "stacked"
        return [mark(r, mode, reason or graph_reason) for r in results]
    except _Setup as e:
        why = failure_reason(e.__cause__ or e)
    if log:
        log(f"stacked: running the {len(cfgs)} runs one by one (eager): {why}")
    from .loop import train
    out = []
    for c, s, h in zip(cfgs, seeds, hooks):
        r = train(task, mixer, knobs, model_cfg, dataclasses.replace(c, step_mode="eager"), seed=s,
                  device=str(dev), on_eval=h, log=log, data=data)
        out.append(mark(r, "eager", f"stacked step failed: {why}"))
    return out


class Stack:
    """The K runs' models, data and stacked step, built as ``loop.train`` builds one run's
    (``step()`` trains all K models one step: no host sync, no host state, capturable)."""

    def __init__(self, task: Task, mixer: str, knobs: dict[str, Any], model_cfg: ModelConfig,
                 cfgs: Sequence[TrainConfig], seeds: Sequence[int], dev: torch.device,
                 data: dict[str, Batch] | None = None):
        K, cfg = len(cfgs), cfgs[0]
        self.task, self.cfg, self.dev = task, cfg, dev
        self.precision = precision_of(cfg, dev)
        self.by_seed: dict[int, dict[str, Batch]] = {}
        self.models = []
        for s in seeds:        # as loop.train: the data, then the seed, then the model
            if s not in self.by_seed:
                self.by_seed[s] = splits(task, cfg, s, dev, data)
            seed_all(s)
            self.models.append(build_model(task.backbone, mixer, knobs, model_cfg,
                                           vocab=task.vocab_size if task.kind == "classification" else 0,
                                           d_in=task.d_in, d_out=task.d_out).to(dev))
        uniq = list(self.by_seed)
        width = sparse_width([self.by_seed[s]["train"].mask for s in uniq], cfg, task, self.models[0])
        tds = {s: train_data(self.by_seed[s], cfg, s, width, dev) for s in uniq}
        self.src = torch.tensor([uniq.index(s) for s in seeds], device=dev)[:, None]      # (K, 1)
        self.inputs = torch.stack([tds[s].train.inputs for s in uniq])
        self.targets = torch.stack([tds[s].train.targets for s in uniq])
        self.mask = torch.stack([tds[s].train.mask for s in uniq])
        self.sel = None if width is None else torch.stack([tds[s].sel for s in uniq])
        self.order = torch.stack([tds[s].order for s in seeds])                           # (K, steps, B)
        if cfg.optimizer == "muon":
            self.sm = StackedModel(self.models, first=[n for n, _ in split_params(self.models[0])[0]])
            self.opt = StackedMuon(self.sm, cfgs)
        else:
            self.sm = StackedModel(self.models)
            self.opt = StackedAdamW(self.sm, cfgs)
        self.idx = torch.zeros(1, dtype=torch.long, device=dev)                           # the step counter
        self.loss_sum = torch.zeros(K, device=dev)
        self.loss_n = torch.zeros((), device=dev)
        self.amp = autocast(self.precision, dev)

    @torch.no_grad()
    def take(self, rows: Sequence[int]) -> Stack:
        """The runs at positions ``rows`` of this stack as a stack of their own (compaction: ``_run``): their
        weights, optimizer state, batch order, training sets, loss sums and the step counter,
        copied; this stack is left as it was."""
        new = object.__new__(Stack)
        new.__dict__.update(self.__dict__)          # task, cfg, dev, precision, by_seed, amp
        r = torch.tensor(list(rows), dtype=torch.long, device=self.dev)
        new.models = [self.models[j] for j in rows]
        src = self.src.index_select(0, r)
        used = sorted(set(src.flatten().tolist()))          # the training sets still read
        u = torch.tensor(used, dtype=torch.long, device=self.dev)
        new.src = torch.tensor([[used.index(i)] for i in src.flatten().tolist()], device=self.dev)
        new.inputs, new.targets, new.mask = (t.index_select(0, u) for t in (self.inputs, self.targets, self.mask))
        new.sel = None if self.sel is None else self.sel.index_select(0, u)
        new.order = self.order.index_select(0, r)
        new.sm = self.sm.take(rows)
        new.opt = self.opt.take(new.sm, rows)
        new.idx, new.loss_n = self.idx.clone(), self.loss_n.clone()
        new.loss_sum = self.loss_sum.index_select(0, r)
        return new

    def step(self) -> None:
        src, sm = self.src, self.sm
        rows = self.order.index_select(1, self.idx).squeeze(1)                             # (K, B)
        x, tgt, m = self.inputs[src, rows], self.targets[src, rows], self.mask[src, rows]
        pick = None if self.sel is None else self.sel[src, rows]
        with self.amp:
            loss = per_model_loss(self.task.kind, sm.forward(x, pick), tgt, m)
        for p in sm.leaves:
            p.grad = None
        loss.sum().backward()
        g = sm.flat_grad()
        if self.cfg.grad_clip:
            clip_per_model_(g, self.cfg.grad_clip)
        self.opt.step(g, self.idx)
        self.loss_sum.add_(loss.detach().float())
        self.loss_n.add_(1)
        self.idx.add_(1)


# Compaction (``_run``): when runs of a stack stop, the survivors are rebuilt as a smaller stack, so
# that later steps compute only them. Each rebuild costs something: a copy of the survivors' state,
# the first steps at the new batch (fla autotunes its batch-keyed kernels the first time a process
# sees one) and, graphed, ``graphed.WARMUP`` eager steps and a new capture. It pays back (K - K') / K
# of a step for every step left, a step's time being about proportional to K (README, "Step modes at
# MAD's baseline shape": per model, stacked+graphed K = 3 is within 20% of K = 6 for every mechanism).
# So a stack is rebuilt when that saving over the steps left is at least a rebuild's cost, counted in
# steps of the current stack (REBUILD_STEPS: estimates, not measurements; eager: the copies and a
# first step at new shapes; graphed: 3 eager steps of a few replays each, the capture, autotuning).
# This rather than a fixed fraction (rebuild once a quarter of the stack has stopped) because the
# steps left matter as much as the fraction: at MAD's sweep shape (2000 steps, validation every 250,
# K = 6, graphed) one stopped run is worth a rebuild up to step 1500 (1 x 500 >= 6 x 50) and two at
# step 1750; at K = 16 one stop is worth it up to step 1000, two up to 1500, four at 1750. At most
# one rebuild a validation; ``MIXZOO_STACK_COMPACT=0`` turns compaction off (stopped runs stay in the
# stack, frozen, as before).
REBUILD_STEPS = {False: 2, True: 50}          # by whether the step is captured


def compaction_on() -> bool:
    return os.environ.get("MIXZOO_STACK_COMPACT", "1") != "0"


def worth_compacting(k_now: int, k_left: int, steps_left: int, graphed: bool) -> bool:
    """Whether to rebuild a stack of ``k_now`` runs as one of the ``k_left`` still training, with
    ``steps_left`` steps to go (the rule above)."""
    return 0 < k_left < k_now and (k_now - k_left) * steps_left >= k_now * REBUILD_STEPS[graphed]


def _run(task, mixer, knobs, model_cfg, cfgs, seeds, dev, hooks, log, data,
         want_graph, keep_weights) -> tuple[list[RunResult], str]:
    cfg, K = cfgs[0], len(cfgs)
    t_start = time.perf_counter()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    try:
        st = Stack(task, mixer, knobs, model_cfg, cfgs, seeds, dev, data)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        results = [RunResult(state="COMPLETE", device_name=name, gpu=physical_gpu(dev), params=count_params(m))
                   for m in st.models]
        books = [Book(task, c, st.precision, r, h, log if k == 0 else None)
                 for k, (c, r, h) in enumerate(zip(cfgs, results, hooks))]
    except UsageError:
        raise
    except Exception as e:
        raise _Setup() from e
    by_seed, tpl = st.by_seed, st.sm.template
    compact = compaction_on()
    pos: list[int | None] = list(range(K))      # run k's row in the current stack; None: compacted away
    parked: dict[int, StackedModel] = {}        # the runs compacted away: their weights (a stack of one)

    def weights(k: int) -> nn.Module:
        """The template, holding run k's weights."""
        return parked[k].load_into(0, tpl) if pos[k] is None else st.sm.load_into(pos[k], tpl)

    from .graphed import Stepper
    stepper = Stepper(st.step, dev, capture=want_graph, keep_going=True)
    base, graph_reason = 0, ""                  # base: the step the current stepper started at

    def capture_failure() -> str:
        if not stepper.reason or base == 0:
            return stepper.reason
        return f"after compacting to {st.sm.K} at step {base}: {stepper.reason} (of the compacted stack)"
    eval_time, done = 0.0, 0
    vmapped = stacked_eval() == "vmapped"       # the K models validated in one forward a batch (evaluate_stack)
    t0 = time.perf_counter()                    # as loop.train: from the start of training
    with folding():
        try:
            for i in range(cfg.steps):
                stepper.run(i - base)
                done = i + 1
                if not (done % cfg.eval_every == 0 or done >= cfg.steps):
                    continue
                losses = (st.loss_sum / st.loss_n.clamp_min(1)).tolist()
                t = time.perf_counter()
                st.loss_sum.zero_()
                st.loss_n.zero_()
                vals = None
                if vmapped:
                    owner = {j: k for k, j in enumerate(pos) if j is not None}      # stack row -> run
                    try:
                        vals = evaluate_stack(st.sm, task, [by_seed[seeds[owner[j]]]["val"] for j in range(st.sm.K)],
                                              cfg.eval_batch_size, st.precision)
                    except Exception as e:  # noqa: BLE001 - e.g. a mechanism's eval path that does not vmap
                        vmapped = False
                        msg = f"stacked: validating the models one at a time from step {done}: {failure_reason(e)}"
                        if log:
                            log(msg)
                        else:
                            warnings.warn(msg, stacklevel=1)
                for k, b in enumerate(books):
                    if b.active:
                        b.validate(weights(k), by_seed[seeds[k]], done, losses[pos[k]], t - t0 - eval_time,
                                   val=None if vals is None else vals[pos[k]])
                        if not b.active:
                            st.opt.freeze(pos[k])
                eval_time += time.perf_counter() - t
                live = [k for k, b in enumerate(books) if b.active]
                if not live:
                    break
                if not (compact and worth_compacting(st.sm.K, len(live), cfg.steps - done, stepper.capture)):
                    continue
                try:        # copies: the current stack is untouched until the new one is whole
                    new = st.take([pos[k] for k in live])
                    gone = {k: st.sm.take([j]) for k, j in enumerate(pos) if j is not None and k not in live}
                except Exception as e:      # e.g. out of memory: the stopped runs stay in the stack, frozen
                    compact = False
                    if log:
                        log(f"stacked: no compaction at step {done}: {failure_reason(e)}")
                    continue
                if log:
                    log(f"stacked: compacted {st.sm.K} -> {new.sm.K} at step {done}")
                graph_reason = graph_reason or capture_failure()
                parked.update(gone)
                capture = stepper.capture
                # the old stack, stepper and graph go (their memory with them); a new capture follows
                # the new stepper's warm-up steps
                st, stepper = new, None
                pos = [live.index(k) if k in live else None for k in range(K)]
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                stepper, base = Stepper(st.step, dev, capture=capture, keep_going=True), done
        except (UsageError, KeyboardInterrupt):
            raise
        except Exception as e:
            if done == 0 and not stepper.replayed:
                raise _Setup() from e
            for b in books:
                if b.res.state == "COMPLETE":
                    b.fail(e)
                    b.res.steps = max(b.res.steps, done)
            if log:
                log(f"stacked run failed at step {done}: {failure_reason(e)}")
    train_time = time.perf_counter() - t0 - eval_time
    out = []
    for k, b in enumerate(books):
        if b.active and b.res.state == "COMPLETE":
            b.res.steps = done
        final = ({k_: v.detach().clone() for k_, v in weights(k).state_dict().items()}
                 if keep_weights else None)
        # a run that stopped before the others trained until its last validation
        own = train_time if b.active or b.elapsed is None else b.elapsed
        out.append(b.finish(weights(k), by_seed[seeds[k]], dev, own, t_start))
        out[-1].hook_error = b.hook_error
        if keep_weights:
            out[-1].final_state_dict = final
    pm = peak_mem(dev)
    for r in out:
        r.peak_mem_bytes = pm
    return out, graph_reason or capture_failure()
