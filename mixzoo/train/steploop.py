"""What the plain (non-Lightning) training loops of ``step_mode`` graphed and stacked share with
``loop.train``: the data a run trains on, and the bookkeeping of one run (validation every
``eval_every`` steps, history, best weights on validation, early stop, divergence, test score).

Each piece does what ``loop.train`` does, in the same order, with the same helpers, so a run in
another step mode gives the same RunResult (up to floating-point reordering in the step itself).
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import kernels
from ..models import mixers_of
from ..models.backbones import TokenModel
from ..tasks.base import Batch, Task
from .config import RunResult, TrainConfig
from .diagnostics import mixer_diagnostics
from .loop import DIAG_EXAMPLES, batch_order, evaluate, failure_reason


def seed_all(seed: int) -> None:
    """What ``lightning.pytorch.seed_everything`` seeds (Python's, NumPy's and torch's generators),
    without importing Lightning."""
    import os
    import random
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    os.environ["PL_SEED_WORKERS"] = "0"


def precision_of(cfg: TrainConfig, dev: torch.device) -> str:
    return cfg.precision if cfg.precision != "auto" else ("bf16-mixed" if dev.type == "cuda" else "32-true")


def autocast(precision: str, dev: torch.device):
    """The training step's autocast: Lightning's bf16-mixed is ``torch.autocast(bf16)``; the weight
    cache is off, as CUDA graphs require (the cast values are the same either way)."""
    if precision.startswith("bf16"):
        return torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def splits(task: Task, cfg: TrainConfig, seed: int, dev: torch.device, data: dict[str, Batch] | None):
    if data is not None:
        return {k: v.to(dev) for k, v in data.items()}
    sizes = {k: v for k, v in (("train", cfg.n_train), ("val", cfg.n_val), ("test", cfg.n_test)) if v is not None}
    return task.generate_splits(seed, dev, sizes)


def supervised_positions_k(mask: torch.Tensor, K: int) -> torch.Tensor:
    """``loop.supervised_positions`` at a given width K (>= every example's count): each example's
    supervised positions first, in order, padded with unsupervised ones."""
    return torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :K].contiguous()


def sparse_width(masks: list[torch.Tensor], cfg: TrainConfig, task: Task, model) -> int | None:
    """The common sparse-head width of several training sets (None: the full head), as
    ``loop.supervised_positions`` decides for one: the most supervised positions of any example,
    unless that is more than half the length."""
    if not (cfg.sparse_head and task.kind == "classification" and isinstance(model, TokenModel)):
        return None
    K = max(int(m.sum(1).max()) if m.numel() else 0 for m in masks)
    if K == 0 or 2 * K > masks[0].shape[1]:
        return None
    return K


@dataclass
class TrainData:
    """A run's training split as the step reads it: the batch order (steps, B), and with the sparse
    head the supervised positions (N, K) and the training targets gathered at them."""
    data: dict[str, Batch]
    train: Batch
    sel: torch.Tensor | None
    order: torch.Tensor


def train_data(data: dict[str, Batch], cfg: TrainConfig, seed: int, width: int | None, dev) -> TrainData:
    tr = data["train"]
    sel = None if width is None else supervised_positions_k(tr.mask, width)
    train = tr if sel is None else Batch(tr.inputs, tr.targets.gather(1, sel), tr.mask.gather(1, sel))
    order = batch_order(len(tr), cfg.steps, cfg.batch_size, seed).to(dev)
    return TrainData(data, train, sel, order)


def peak_mem(dev: torch.device) -> int:
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def due(step: int, cfg: TrainConfig) -> bool:
    """Whether a validation follows global step ``step`` (as loop.train's Evaluator decides)."""
    return step % cfg.eval_every == 0 or step >= cfg.steps


class Book:
    """One run's bookkeeping (loop.train's Evaluator and epilogue, for a plain loop)."""

    def __init__(self, task: Task, cfg: TrainConfig, precision: str, res: RunResult,
                 on_eval: Callable[[int, dict[str, float]], None] | None = None,
                 log: Callable[[str], None] | None = None):
        self.task, self.cfg, self.precision, self.res = task, cfg, precision, res
        self.on_eval, self.log = on_eval, log
        kernels.reset()              # before training: what the run's kernels are (finish reads them)
        self.best: dict[str, torch.Tensor] | None = None
        self.best_val: float | None = None
        self.active = True           # still training (not stopped, failed or pruned)
        self.hook_error: BaseException | None = None
        self.elapsed: float | None = None     # training time at the last validation

    def _better(self, a: float) -> bool:
        b = self.best_val
        return b is None or (a > b if self.task.primary.higher_is_better else a < b)

    def validate(self, model, data: dict[str, Batch], step: int, train_loss: float, elapsed: float,
                 val: dict[str, float] | None = None) -> None:
        """One validation after global step ``step``; ``model`` holds this run's weights. ``val``: its metrics on
        the validation split where the caller has them (a stacked run's ``evaluate_stack``), else evaluated here.
        Sets ``active`` False on divergence (the run FAILs), early stop, or an exception from ``on_eval``
        (kept in ``hook_error``; the caller decides whether to raise it). A KeyboardInterrupt from
        ``on_eval`` (Ctrl-C, SIGTERM) is raised: it stops every run of a stacked batch."""
        cfg, res, primary = self.cfg, self.res, self.task.primary
        self.elapsed = elapsed
        if val is None:
            val = evaluate(model, self.task, data["val"], cfg.eval_batch_size, self.precision)
        rate = step / max(elapsed, 1e-9)
        diag = mixer_diagnostics(model, data["val"].inputs[:DIAG_EXAMPLES], self.precision)
        if diag:
            res.diagnostics = diag
        res.history.append({"step": step, "train_loss": train_loss, **val,
                            **{f"diag/{k}": v for k, v in diag.items()},
                            "steps_per_s": rate, "train_time_s": elapsed})
        res.steps = step
        if self.log:
            self.log(f"  step {step:>6}/{cfg.steps} | loss {train_loss:.4f} | val {primary.name} "
                     f"{val[primary.name]:.4f} | {rate:.1f} steps/s "
                     f"{rate * cfg.batch_size * self.task.seq_len / 1e3:.0f}k tok/s")
        if not (math.isfinite(train_loss) and math.isfinite(val[primary.name])):
            res.state, res.reason = "FAIL", (f"non-finite loss at step {step} (train {train_loss}, "
                                             f"val {primary.name} {val[primary.name]})")
            self.active = False
            return
        if self._better(val[primary.name]):
            self.best_val = val[primary.name]
            self.best = {k: v.detach().clone() for k, v in model.state_dict().items()}
            res.best_step = step
            res.val = val
        if self.on_eval is not None:
            try:
                self.on_eval(step, val)
            except KeyboardInterrupt:
                raise                       # Ctrl-C or SIGTERM stops every run, not this one alone
            except BaseException as e:      # noqa: BLE001 - handed to the caller
                self.hook_error = e
                self.active = False
                return
        if cfg.early_stop is not None and (val[primary.name] >= cfg.early_stop if primary.higher_is_better
                                           else val[primary.name] <= cfg.early_stop):
            self.active = False

    def fail(self, e: BaseException) -> None:
        self.res.state, self.res.reason = "FAIL", failure_reason(e)
        self.active = False

    def finish(self, model, data: dict[str, Batch], dev: torch.device, train_time: float, t_start: float) -> RunResult:
        """Backend, state size, the test score of the best weights, timings, peak memory."""
        res, task = self.res, self.task
        res.train_time_s = train_time
        res.steps_per_s = res.steps / train_time if train_time > 0 else 0.0
        res.tokens_per_s = res.steps_per_s * self.cfg.batch_size * task.seq_len
        try:
            mixers = mixers_of(model)
            res.backend = "+".join(sorted({getattr(m, "backend", "torch") for m in mixers}))
            res.kernels = kernels.ran()
            res.state_size = sum(int(m.state_size(task.seq_len)) for m in mixers if hasattr(m, "state_size"))
        except Exception as e:
            if res.state == "COMPLETE":
                self.fail(e)
        if res.state == "COMPLETE":
            try:
                if self.best is not None:
                    model.load_state_dict(self.best)
                res.test = evaluate(model, task, data["test"], self.cfg.eval_batch_size, self.precision)
            except Exception as e:
                self.fail(e)
            else:
                if not math.isfinite(res.test[task.primary.name]):
                    res.state, res.reason = "FAIL", "non-finite test metric"
        with contextlib.suppress(Exception):
            res.peak_mem_bytes = peak_mem(dev)
        res.wall_time_s = time.perf_counter() - t_start
        return res


def mark(res: RunResult, mode: str, reason: str = "") -> RunResult:
    """Record on a result the step mode that ran and, where it is not the one asked for, why.
    (Attributes beside RunResult's fields: ``step_mode``, ``step_mode_reason``.)"""
    res.step_mode = mode
    res.step_mode_reason = reason
    return res
