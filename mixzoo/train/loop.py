"""One training run: generate the splits once on the device, train with Lightning,
validate every ``eval_every`` steps, keep the best weights on validation, score test.

Per step there is no host sync: batches are slices of device tensors picked by a
precomputed order, the loss is accumulated on the device, and metrics are read only at
evaluations. Lightning runs ``barebones`` (no logger, progress bar, checkpoints).
"""
from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .. import kernels
from ..errors import UsageError
from ..models import ModelConfig, build_model, mixers_of
from ..models.backbones import TokenModel
from ..tasks.base import IGNORE, Batch, Task
from .config import RunResult, TrainConfig, physical_gpu
from .diagnostics import mixer_diagnostics
from .metrics import Accumulator
from .optim import anneal_weight_decay, build_optimizer, lr_lambda

EvalHook = Callable[[int, dict[str, float]], None]


class Diverged(RuntimeError):
    pass


DIAG_EXAMPLES = 8     # validation examples the mechanisms' diagnostics are computed on


REASON_CHARS = 300


def failure_reason(e: BaseException, limit: int = REASON_CHARS) -> str:
    """``"<ExceptionType>: <first line of its message>"``, one line of at most ``limit``
    characters (the style of the sweep engine's failed trials)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__)[:limit]


def _report_failure(log: Callable[[str], None] | None, what: str, e: BaseException) -> None:
    """The full traceback, once, to ``log`` (or stderr): a failed run is a row, not a crash,
    but whoever debugs the mechanism needs the trace."""
    msg = f"run failed {what}: {failure_reason(e)}\n" + "".join(traceback.format_exception(e)).rstrip()
    if log:
        log(msg)
    else:
        sys.stderr.write(msg + "\n")


def _interrupt_of(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt behind ``e``: Lightning answers one inside ``fit`` with
    ``sys.exit(1)`` (or, off the main thread, with the ValueError of its ``signal.signal``)."""
    return e.__context__ if isinstance(e.__context__, KeyboardInterrupt) else None


def _restore_sigint(handler) -> None:
    """Lightning ignores SIGINT from its KeyboardInterrupt handler on; put the handler back."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not handler:
        signal.signal(signal.SIGINT, handler)


def _raised_by_caller(e: BaseException, hook_error: BaseException | None, callbacks) -> bool:
    """True when ``e`` came from the caller's code (``on_eval``, or a hook of one of the extra
    ``callbacks``): that propagates; the mechanism's own failures end the run as FAIL."""
    if e is hook_error:
        return True
    ids = {id(c) for c in callbacks or ()}
    return bool(ids) and any(id(f.f_locals.get("self")) in ids for f, _ in traceback.walk_tb(e.__traceback__))


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def loss_fn(kind: str, out: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean loss over supervised positions, and its sum (for logging), without host syncs."""
    if kind == "classification":
        tgt = torch.where(b.mask, b.targets, IGNORE)
        s = F.cross_entropy(out.flatten(0, 1).float(), tgt.flatten(), ignore_index=IGNORE,
                            reduction="sum")
    else:
        s = (((out.float() - b.targets.float()) ** 2).mean(-1) * b.mask).sum()
    return s / b.mask.sum().clamp_min(1), s


def supervised_positions(mask: torch.Tensor) -> torch.Tensor | None:
    """(N, K) positions of each example's supervised tokens first (in order), padded with
    unsupervised ones, K the most any example has; None when K > T/2 (too little to gain).
    One host read (K), once per dataset, so the training steps stay free of syncs."""
    K = int(mask.sum(1).max()) if mask.numel() else 0
    if K == 0 or 2 * K > mask.shape[1]:
        return None
    return torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :K].contiguous()


def eval_autocast(precision: str, dev: torch.device):
    """A validation's or test's autocast (``evaluate``, ``stacked.evaluate_stack``)."""
    return (torch.autocast("cuda", dtype=torch.bfloat16) if precision.startswith("bf16")
            else torch.autocast(dev.type, enabled=False))


@torch.no_grad()
def evaluate(model, task: Task, data: Batch, batch_size: int, precision: str) -> dict[str, float]:
    was = model.training
    model.eval()
    acc = Accumulator(task.kind, task.vocab_size if task.kind == "classification" else 0)
    ctx = eval_autocast(precision, data.inputs.device)
    for s in range(0, len(data), batch_size):
        b = data.index(slice(s, s + batch_size))
        with ctx:
            out = model(b.inputs)
        _, lsum = loss_fn(task.kind, out, b)
        acc.update(out, b.targets, b.mask, b.slices, lsum)
    model.train(was)
    return acc.compute()


def batch_order(n: int, steps: int, bs: int, seed: int) -> torch.Tensor:
    """(steps, bs) example indices: a fresh permutation each epoch, same on every device."""
    g = torch.Generator().manual_seed(seed)
    need = steps * bs
    perms = [torch.randperm(n, generator=g) for _ in range(math.ceil(need / n))]
    return torch.cat(perms)[:need].view(steps, bs)


def _quiet_lightning():
    for name in ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero",
                 "lightning.pytorch.accelerators.cuda"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*barebones.*")


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def train(task: Task, mixer: str, knobs: dict[str, Any] | None = None,
          model_cfg: ModelConfig | None = None, cfg: TrainConfig | None = None,
          seed: int = 0, device: str | None = "auto", on_eval: EvalHook | None = None,
          log: Callable[[str], None] | None = None, data: dict[str, Batch] | None = None,
          callbacks: list | None = None) -> RunResult:
    """Train ``mixer`` on ``task`` and score it; returns a RunResult.

    The run is FAIL, with a one-line ``reason``, when it diverges (a non-finite loss or test
    metric) or when the mechanism raises while being built, trained, validated or scored
    (``"RuntimeError: ..."``; the traceback goes to ``log``, or stderr without one); steps,
    timings and peak memory are filled as far as the run got. A UsageError, KeyboardInterrupt
    and SystemExit propagate. ``on_eval(step, val_metrics)`` is called after every validation
    pass; whatever it raises (e.g. a pruning signal) propagates to the caller. ``callbacks``:
    extra Lightning callbacks, run before mixzoo's own at each hook; what they raise propagates.
    """
    knobs, model_cfg, cfg = dict(knobs or {}), model_cfg or ModelConfig(), cfg or TrainConfig()
    if cfg.step_mode != "eager":        # graphed / stacked: train/graphed.py (eager where they cannot run)
        from .graphed import train_mode
        return train_mode(task, mixer, knobs, model_cfg, cfg, seed=seed, device=device, on_eval=on_eval,
                          log=log, data=data, callbacks=callbacks)
    # an eager step is bound by the host's launches, where a Triton launch costs more than the PyTorch
    # forms' (bench throughput, H200: gdn 40.6 eager steps/s with the kernels, 64.2 without the
    # convolution's): the eager loop runs the forms; graphed and stacked steps run the kernels
    with kernels.eager():
        return _train_eager(task, mixer, knobs, model_cfg, cfg, seed, device, on_eval, log, data, callbacks)


def _train_eager(task: Task, mixer: str, knobs: dict[str, Any], model_cfg: ModelConfig, cfg: TrainConfig,
                 seed: int, device: str | None, on_eval: EvalHook | None, log: Callable[[str], None] | None,
                 data: dict[str, Batch] | None, callbacks: list | None) -> RunResult:
    import lightning.pytorch as pl
    _quiet_lightning()
    dev = resolve_device(device)
    precision = cfg.precision if cfg.precision != "auto" else (
        "bf16-mixed" if dev.type == "cuda" else "32-true")
    t_start = time.perf_counter()
    if data is None:
        sizes = {k: v for k, v in (("train", cfg.n_train), ("val", cfg.n_val),
                                   ("test", cfg.n_test)) if v is not None}
        data = task.generate_splits(seed, dev, sizes)
    else:
        data = {k: v.to(dev) for k, v in data.items()}
    pl.seed_everything(seed, verbose=False)
    res = RunResult(state="COMPLETE", gpu=physical_gpu(dev),
                    device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu")
    kernels.reset()

    def fail(e: BaseException, what: str) -> None:
        res.state, res.reason = "FAIL", failure_reason(e)
        _report_failure(log, what, e)

    def peak_mem() -> int:
        if dev.type == "cuda":
            return int(torch.cuda.max_memory_allocated(dev))
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        model = build_model(task.backbone, mixer, knobs, model_cfg,
                            vocab=task.vocab_size if task.kind == "classification" else 0,
                            d_in=task.d_in, d_out=task.d_out).to(dev)
        run_model = model if cfg.compile == "off" else torch.compile(model, mode=cfg.compile)
    except UsageError:
        raise
    except Exception as e:      # a mechanism refusing its knobs, an OOM building it...
        fail(e, f"building {mixer}")
        with contextlib.suppress(Exception):
            res.peak_mem_bytes = peak_mem()
        res.wall_time_s = time.perf_counter() - t_start
        return res
    res.params = count_params(model)
    # the vocabulary head (vocab x width per position) dominates small token models; where few
    # positions are supervised (MQAR: the queries), training applies it to those only
    sel = (supervised_positions(data["train"].mask)
           if cfg.sparse_head and task.kind == "classification" and isinstance(model, TokenModel) else None)
    # the training targets at those positions, gathered once for the whole split
    train_data = data["train"] if sel is None else Batch(
        data["train"].inputs, data["train"].targets.gather(1, sel), data["train"].mask.gather(1, sel))
    order = batch_order(len(data["train"]), cfg.steps, cfg.batch_size, seed).to(dev)
    primary = task.primary
    tokens_per_step = cfg.batch_size * task.seq_len

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model
            self.loss_sum = torch.zeros((), device=dev)
            self.loss_n = torch.zeros((), device=dev)

        def training_step(self, step, _):
            b = train_data.index(order[step])
            pick = None if sel is None else sel[order[step]]
            out = run_model(b.inputs) if pick is None else run_model(b.inputs, select=pick)
            loss = self.loss_of(out, b)
            self.loss_sum += loss.detach().float()
            self.loss_n += 1
            # references for a diagnosing callback (mixzoo.train.capture): no copy, no sync
            self.last_batch, self.last_loss = (b, pick), loss.detach()
            return loss

        def loss_of(self, out, b):
            return loss_fn(task.kind, out, b)[0]

        def on_before_optimizer_step(self, optimizer):
            # our own clipping: Lightning refuses to clip for fused optimizers under AMP;
            # bf16 autocast has no grad scaler, so the gradients here are already unscaled
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip, foreach=True)
            if cfg.wd_anneal_gamma is not None:
                anneal_weight_decay(optimizer, cfg, self.trainer.global_step)

        def configure_optimizers(self):
            opt = build_optimizer(self.model, cfg, fused=dev.type == "cuda")
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    lit = Lit()
    # eval_t: when the validation pass under way started (its time is not training time);
    # hook_error: what on_eval raised, to tell it from the mechanism's own failures
    state = {"best": None, "best_val": None, "eval_time": 0.0, "t0": None, "eval_t": None,
             "hook_error": None}

    def better(a: float, b: float | None) -> bool:
        return b is None or (a > b if primary.higher_is_better else a < b)

    class Evaluator(pl.Callback):
        def on_train_start(self, trainer, module):
            state["t0"] = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = trainer.global_step
            if step % cfg.eval_every and step < cfg.steps:
                return
            # reading the loss waits for the device's queued steps: only then is the clock read, so
            # that training time counts the device's work, not just the host's launches (with CUDA
            # graphs the host runs hundreds of steps ahead)
            train_loss = float(lit.loss_sum / lit.loss_n.clamp_min(1))
            t = state["eval_t"] = time.perf_counter()
            lit.loss_sum.zero_()
            lit.loss_n.zero_()
            val = evaluate(model, task, data["val"], cfg.eval_batch_size, precision)
            elapsed = t - state["t0"] - state["eval_time"]
            rate = step / max(elapsed, 1e-9)
            diag = mixer_diagnostics(model, data["val"].inputs[:DIAG_EXAMPLES], precision)
            if diag:
                res.diagnostics = diag
            res.history.append({"step": step, "train_loss": train_loss, **val,
                                **{f"diag/{k}": v for k, v in diag.items()},
                                "steps_per_s": rate, "train_time_s": elapsed})
            if log:
                log(f"  step {step:>6}/{cfg.steps} | loss {train_loss:.4f} | val {primary.name} "
                    f"{val[primary.name]:.4f} | {rate:.1f} steps/s "
                    f"{rate * tokens_per_step / 1e3:.0f}k tok/s")
            if not (math.isfinite(train_loss) and math.isfinite(val[primary.name])):
                raise Diverged(f"non-finite loss at step {step} (train {train_loss}, "
                               f"val {primary.name} {val[primary.name]})")
            if better(val[primary.name], state["best_val"]):
                state["best_val"] = val[primary.name]
                state["best"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                res.best_step = step
                res.val = val
            state["eval_time"] += time.perf_counter() - t
            state["eval_t"] = None
            if on_eval is not None:
                try:
                    on_eval(step, val)
                except BaseException as e:
                    state["hook_error"] = e
                    raise
            if cfg.early_stop is not None and (
                    val[primary.name] >= cfg.early_stop if primary.higher_is_better
                    else val[primary.name] <= cfg.early_stop):
                trainer.should_stop = True

    trainer = pl.Trainer(accelerator="gpu" if dev.type == "cuda" else "cpu", devices=1,
                         max_steps=cfg.steps, max_epochs=1, precision=precision,
                         barebones=True, callbacks=[*(callbacks or []), Evaluator()])
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sigint = signal.getsignal(signal.SIGINT)
    interrupted = None
    try:
        trainer.fit(lit, train_dataloaders=range(cfg.steps))
    except Diverged as e:
        res.state, res.reason = "FAIL", str(e)
    except UsageError:
        raise
    except SystemExit as e:
        if (interrupted := _interrupt_of(e)) is None:
            raise
    except Exception as e:
        if (interrupted := _interrupt_of(e)) is None:
            if _raised_by_caller(e, state["hook_error"], callbacks):
                raise
            fail(e, f"training {mixer} at step {trainer.global_step}")
    finally:
        state["hook_error"] = None
        _restore_sigint(sigint)
    if interrupted is not None:
        raise interrupted     # as it came: the caller (the command line: exit 130) handles it
    t_end = time.perf_counter()
    if state["eval_t"] is not None:      # failed inside a validation pass
        state["eval_time"] += t_end - state["eval_t"]
    res.steps = trainer.global_step
    train_time = (t_end - state["t0"] - state["eval_time"]) if state["t0"] else 0.0
    res.train_time_s = train_time
    res.steps_per_s = res.steps / train_time if train_time > 0 else 0.0
    res.tokens_per_s = res.steps_per_s * tokens_per_step
    try:
        mixers = mixers_of(model)
        res.backend = "+".join(sorted({getattr(m, "backend", "torch") for m in mixers}))
        res.kernels = kernels.ran()
        res.state_size = sum(int(m.state_size(task.seq_len)) for m in mixers
                             if hasattr(m, "state_size"))
    except UsageError:
        raise
    except Exception as e:
        if res.state == "COMPLETE":     # after a failure, a second error here says nothing new
            fail(e, f"reading {mixer}'s backend and state size")
    if res.state == "COMPLETE":
        try:
            model.to(dev)    # Lightning's teardown moves the module back to the CPU
            if state["best"] is not None:
                model.load_state_dict(state["best"])
            test = evaluate(model, task, data["test"], cfg.eval_batch_size, precision)
        except UsageError:
            raise
        except Exception as e:
            fail(e, f"scoring {mixer} on the test split")
        else:
            res.test = test
            if not math.isfinite(res.test[primary.name]):
                res.state, res.reason = "FAIL", "non-finite test metric"
    if res.state == "COMPLETE":
        res.peak_mem_bytes = peak_mem()
    else:
        with contextlib.suppress(Exception):   # a device left unusable by the failure may refuse even this
            res.peak_mem_bytes = peak_mem()
    res.wall_time_s = time.perf_counter() - t_start
    return res
