"""``step_mode="graphed"``: the whole training step of one run as one CUDA graph.

The step (forward, backward, gradient clipping, a capturable fused AdamW step, the schedule, the
loss sum) is written so that nothing in it lives on the host: the batch is picked from the
device-resident training set by a device step counter, the learning rate is read from a schedule
table on the device by that counter, and AdamW runs with ``fused=True, capturable=True`` and a
tensor learning rate (with ``optimizer="muon"``: ``optim.GraphMuon`` over the hidden matrices,
torch.optim.Muon's update with a tensor learning rate, and that AdamW over the rest). Shapes are
static. The first ``WARMUP`` steps run eagerly, on a side stream
(they are training steps like the others: fla autotunes its kernels and AdamW allocates its state
there, both of which must happen before capture); the next step is captured once and every step after
it is one ``graph.replay()``. Validation runs eagerly between replays on the same weights.

Selection (``select_mode``) and fallback: graphed runs only where it can; otherwise the run is the
ordinary eager one (``loop.train``), and the result says why (``result.step_mode_reason``):
not a CUDA device, ``compile`` on (its ``reduce-overhead`` mode is CUDA graphs already),
``wd_anneal_gamma`` (the weight decay is a host float of fused AdamW, so it cannot change inside a
graph), extra Lightning callbacks (there is no Lightning in this loop). If anything fails before
the first replay (building, warm-up, capture: e.g. a kernel that reads the device from the host),
the run starts again eagerly from scratch, so that its results are exactly the eager ones.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import UsageError
from ..models import ModelConfig, build_model
from ..tasks.base import Batch, Task
from .config import RunResult, TrainConfig, physical_gpu
from .loop import count_params, failure_reason, loss_fn, resolve_device
from .optim import Combined, GraphMuon, _decay_groups, lr_lambda, split_params
from .steploop import Book, autocast, due, mark, precision_of, seed_all, sparse_width, splits, train_data

WARMUP = 3        # eager steps before the capture


def capture(fn: Callable[[], None], dev: torch.device) -> torch.cuda.CUDAGraph:
    """``fn`` captured as one CUDA graph, or the capture's error raised with the device left usable.

    A capture that fails inside CUDA (a host sync in ``fn``: cudaErrorStreamCaptureInvalidated)
    leaves torch's CUDA generator marked as capturing and the capture stream current, so that every
    later random op on the device raises "Offset increment outside graph capture" (seen on an
    H200: one failed capture broke every mechanism benchmarked after it). On failure the current
    stream is restored and one trivial capture, which succeeds, resets the generator."""
    stream = torch.cuda.current_stream(dev)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
        return g
    except Exception:
        torch.cuda.set_stream(stream)
        try:                      # the capture's own error is the one to raise, whatever this does
            torch.cuda.synchronize(dev)
            heal = torch.cuda.CUDAGraph()
            with torch.cuda.graph(heal):
                torch.zeros(1, device=dev).add_(1)
            del heal
        except Exception:
            pass
        raise


class Stepper:
    """Runs a step function (no arguments, no host state) eagerly or as a captured CUDA graph.

    ``run(i)`` runs step i: eagerly for i < warmup (on a side stream when a capture follows), then
    captures the function at i == warmup and replays it from then on. A failed capture raises, or
    with ``keep_going`` leaves the function to run eagerly, with ``reason`` saying why (nothing of a
    failed capture runs on the device, and the step functions keep no state on the host, so the eager
    steps go on from where the captured one would have)."""

    def __init__(self, fn: Callable[[], None], dev: torch.device, capture: bool, warmup: int = WARMUP,
                 keep_going: bool = False):
        self.fn, self.dev, self.capture, self.warmup = fn, dev, capture and dev.type == "cuda", warmup
        self.keep_going = keep_going
        self.graph = None
        self.replayed = False
        self.reason = ""
        self.stream = torch.cuda.Stream(dev) if self.capture else None

    def _eager_side(self) -> None:
        cur = torch.cuda.current_stream(self.dev)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            self.fn()
        cur.wait_stream(self.stream)

    def run(self, i: int) -> None:
        if not self.capture:
            self.fn()
            return
        if self.graph is None and i < self.warmup:
            self._eager_side()
            return
        if self.graph is None:
            torch.cuda.synchronize(self.dev)
            try:
                g = capture(self.fn, self.dev)
            except Exception as e:
                self.capture, self.reason = False, f"CUDA graph capture failed at step {i}: {failure_reason(e)}"
                if not self.keep_going:
                    raise _Fallback(self.reason) from e
                torch.cuda.synchronize(self.dev)
                self.fn()
                return
            self.graph = g
        self.graph.replay()
        self.replayed = True


def select_mode(cfg: TrainConfig, dev: torch.device, callbacks=None) -> tuple[str, str]:
    """(the step mode a single run gets, why it is not the one asked for or "")."""
    mode = cfg.step_mode
    if mode == "eager":
        return "eager", ""
    if mode in ("stacked", "stacked+graphed"):
        if callbacks:
            return "eager", "stacked: Lightning callbacks need the Lightning loop"
        return mode, ""
    for bad, why in ((dev.type != "cuda", "CUDA graphs need a CUDA device"),
                     (cfg.compile != "off", f"compile={cfg.compile!r} (graphed replaces it; set compile=off)"),
                     (cfg.optimizer not in ("adamw", "muon"),
                      f"optimizer={cfg.optimizer!r}: graphed runs AdamW and Muon only"),
                     (cfg.wd_anneal_gamma is not None, "wd_anneal_gamma: the weight decay of fused AdamW is a "
                                                       "host float, fixed inside a graph"),
                     (bool(callbacks), "Lightning callbacks need the Lightning loop")):
        if bad:
            return "eager", why
    return "graphed", ""


def train_mode(task: Task, mixer: str, knobs: dict[str, Any] | None = None,
               model_cfg: ModelConfig | None = None, cfg: TrainConfig | None = None, seed: int = 0,
               device: str | None = "auto", on_eval=None, log: Callable[[str], None] | None = None,
               data: dict[str, Batch] | None = None, callbacks: list | None = None) -> RunResult:
    """``loop.train`` for ``cfg.step_mode`` other than eager (its dispatch lands here)."""
    from .loop import train
    dev = resolve_device(device)
    mode, reason = select_mode(cfg, dev, callbacks)
    eager = dataclasses.replace(cfg, step_mode="eager")
    if mode in ("stacked", "stacked+graphed"):
        from .stacked import train_stacked
        res = train_stacked(task, mixer, knobs, model_cfg, [cfg], [seed], device=str(dev),
                            on_eval=[on_eval], log=log, data=data)[0]
        if res.hook_error is not None:
            raise res.hook_error
        return res
    if mode == "graphed":
        try:
            return mark(train_graphed(task, mixer, knobs, model_cfg, cfg, seed, dev, on_eval, log, data), "graphed")
        except _BeforeReplay as e:
            reason = failure_reason(e.__cause__ or e)
        except _Fallback as e:
            reason = str(e)
    if log and reason:
        log(f"step_mode={cfg.step_mode}: running eager: {reason}")
    return mark(train(task, mixer, knobs, model_cfg, eager, seed=seed, device=str(dev), on_eval=on_eval,
                      log=log, data=data, callbacks=callbacks), "eager", reason)


class _BeforeReplay(Exception):
    pass


class _Fallback(Exception):
    pass


def train_graphed(task, mixer, knobs, model_cfg, cfg, seed, dev, on_eval=None, log=None, data=None) -> RunResult:
    """The graphed loop itself (``train_mode`` selects it and falls back from it). On a device
    without CUDA graphs its steps run eagerly (non-capturable fused AdamW): tests compare that loop
    with Lightning's there. Raises _BeforeReplay for a failure before the first replay."""
    knobs, model_cfg = dict(knobs or {}), model_cfg or ModelConfig()
    precision = precision_of(cfg, dev)
    t_start = time.perf_counter()
    try:
        data = splits(task, cfg, seed, dev, data)
        seed_all(seed)
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        model = build_model(task.backbone, mixer, knobs, model_cfg,
                            vocab=task.vocab_size if task.kind == "classification" else 0,
                            d_in=task.d_in, d_out=task.d_out).to(dev)
        res = RunResult(state="COMPLETE", gpu=physical_gpu(dev),
                        device_name=torch.cuda.get_device_name(dev) if cuda else dev.type,
                        params=count_params(model))
        book = Book(task, cfg, precision, res, on_eval, log)
        width = sparse_width([data["train"].mask], cfg, task, model)
        td = train_data(data, cfg, seed, width, dev)
        uniq, seen = [], set()
        for _, p in model.named_parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                uniq.append(("", p))
        params = [p for _, p in uniq]
        muon, rest = split_params(model) if cfg.optimizer == "muon" else ([], uniq)
        sched = lr_lambda(cfg)
        opts, lrs = [], []          # lrs: (the optimizer's device learning rate, its schedule table)

        def schedule(base: float, dtype) -> torch.Tensor:
            t = torch.tensor(base, device=dev, dtype=dtype)
            lrs.append((t, torch.tensor([base * sched(s) for s in range(cfg.steps)], device=dev,
                                        dtype=torch.float64)))
            return t
        if muon:      # float64: 1 - lr·λ and the scaled step are then formed as torch.optim.Muon forms them
            opts.append(GraphMuon([p for _, p in muon], lr=schedule(cfg.muon_lr or cfg.lr, torch.float64),
                                  weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum))
        if rest:
            opts.append(torch.optim.AdamW(_decay_groups(rest, cfg.weight_decay), lr=schedule(cfg.lr, torch.float32),
                                          betas=(0.9, 0.98), fused=True, capturable=cuda))
        opt = opts[0] if len(opts) == 1 else Combined(opts)
        idx = torch.zeros(1, dtype=torch.long, device=dev)
        loss_sum = torch.zeros((), device=dev)
        loss_n = torch.zeros((), device=dev)
        amp = autocast(precision, dev)
    except UsageError:
        raise
    except Exception as e:
        raise _BeforeReplay() from e

    def step():
        rows = td.order.index_select(0, idx).squeeze(0)
        b = td.train.index(rows)
        with amp:
            out = model(b.inputs) if td.sel is None else model(b.inputs, select=td.sel[rows])
            loss = loss_fn(task.kind, out, b)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)
        for t, table in lrs:
            t.copy_(table.index_select(0, idx).squeeze(0))
        opt.step()
        loss_sum.add_(loss.detach().float())
        loss_n.add_(1)
        idx.add_(1)

    stepper = Stepper(step, dev, capture=True)
    eval_time, done = 0.0, 0
    t0 = time.perf_counter()
    try:
        for i in range(cfg.steps):
            stepper.run(i)
            done = i + 1
            if not due(done, cfg):
                continue
            train_loss = float(loss_sum / loss_n.clamp_min(1))
            t = time.perf_counter()
            loss_sum.zero_()
            loss_n.zero_()
            book.validate(model, data, done, train_loss, t - t0 - eval_time)
            eval_time += time.perf_counter() - t
            if book.hook_error is not None:
                raise book.hook_error
            if not book.active:
                break
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as e:
        if e is book.hook_error or isinstance(e, _Fallback):
            raise
        if not stepper.replayed:
            raise _BeforeReplay() from e
        book.fail(e)
        res.steps = done
        if log:
            log(f"run failed training {mixer} at step {done} (graphed): {failure_reason(e)}")
    if book.active and res.state == "COMPLETE":
        res.steps = done
    return book.finish(model, data, dev, time.perf_counter() - t0 - eval_time, t_start)
