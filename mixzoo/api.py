"""The public Python API: run a mechanism on a task and land leaderboard rows.

Hyperparameters are one flat dict: trainer keys (``lr``, ``steps``, ...), model keys
(``d_model``, ``n_layers``, ...) and everything else goes to the mechanism's constructor.
The data flow is one way: task → generator → trainer → metrics → leaderboard row.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import platform
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import UsageError
from .registry import get_mixer, get_task

TRAIN_KEYS = {"steps", "batch_size", "lr", "weight_decay", "warmup_frac", "min_lr_frac",
              "grad_clip", "eval_every", "eval_batch_size", "early_stop", "precision", "compile",
              "n_train", "n_val", "n_test", "sparse_head", "optimizer", "schedule", "decay_frac",
              "wd_anneal_gamma", "muon_lr", "muon_momentum"}
MODEL_KEYS = {"d_model", "n_layers", "num_heads", "mlp", "mlp_mult", "norm", "tie_embeddings", "short_conv"}


def split_hparams(hp: dict[str, Any], recipe: str = "zoology"):
    """Split a flat dict into (TrainConfig, ModelConfig, mixer knobs)."""
    from .models import RECIPES, ModelConfig
    from .train import TrainConfig
    if recipe not in RECIPES:
        raise UsageError(f"unknown recipe {recipe!r}; allowed: {', '.join(sorted(RECIPES))}")
    tr = {k: v for k, v in hp.items() if k in TRAIN_KEYS}
    mo = {**RECIPES[recipe], **{k: v for k, v in hp.items() if k in MODEL_KEYS}}
    mix = {k: v for k, v in hp.items() if k not in TRAIN_KEYS and k not in MODEL_KEYS}
    return TrainConfig(**tr), ModelConfig(**mo), mix


def check_mixer_knobs(model: str, knobs: dict[str, Any]) -> None:
    import inspect
    cls = get_mixer(model).cls
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    allowed = [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY
               and n not in ("num_heads", "layer_idx")]
    for k in knobs:
        if k not in allowed:
            every = sorted(set(allowed) | TRAIN_KEYS | MODEL_KEYS)
            raise UsageError(f"unknown hyperparameter {k!r} for {model}; allowed: {', '.join(every)}")


@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, Any]:
    def ver(mod: str) -> str | None:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(mod)
        except PackageNotFoundError:
            return None
    here = Path(__file__).resolve().parent.parent
    sha, dirty = None, None
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip() or None
        if sha:
            dirty = bool(subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                         "--untracked-files=no"], capture_output=True, text=True,
                                        timeout=5).stdout.strip())
    except Exception:
        pass
    import torch
    return {"git_sha": sha, "git_dirty": dirty, "mixzoo_version": ver("mixzoo"),
            "python": platform.python_version(), "torch": torch.__version__,
            "triton": ver("triton"), "fla": ver("flash-linear-attention") or ver("fla-core"),
            "hostname": socket.gethostname()}


def make_row(task, model: str, hparams: dict[str, Any], recipe: str, seed: int, result,
             *, run_id: str, preset: str | None = None, study: str | None = None,
             trial: int | None = None, command: str | None = None) -> dict[str, Any]:
    from .leaderboard.schema import SCHEMA_VERSION
    tcfg, mcfg, mix = split_hparams(hparams, recipe)
    metric = task.primary
    row = {
        "schema_version": SCHEMA_VERSION, "run_id": run_id,
        "created_at": _dt.datetime.now(_dt.UTC),
        "suite": task.suite, "task": task.name, "task_version": task.version, "preset": preset,
        "model": model, "backend": result.backend, "recipe": recipe, "seed": seed,
        "metric_name": metric.name, "metric_value": result.test.get(metric.name),
        "higher_is_better": metric.higher_is_better,
        "val_metric_value": result.val.get(metric.name),
        "state": result.state, "state_reason": result.reason or None,
        "study": study, "trial": trial,
        "knobs_json": json.dumps(task.knobs(), sort_keys=True),
        "hparams_json": json.dumps({**tcfg.as_dict(), **mcfg.as_dict(), **mix}, sort_keys=True,
                                   default=str),
        "metrics_json": json.dumps(result.test, sort_keys=True),
        "val_metrics_json": json.dumps(result.val, sort_keys=True),
        "lr": tcfg.lr, "weight_decay": tcfg.weight_decay, "batch_size": tcfg.batch_size,
        "optimizer": tcfg.optimizer, "schedule": tcfg.schedule,
        "diagnostics_json": json.dumps(result.diagnostics, sort_keys=True) if result.diagnostics else None,
        "steps": result.steps, "best_step": result.best_step,
        "d_model": mcfg.d_model, "n_layers": mcfg.n_layers, "num_heads": mcfg.num_heads,
        "params": result.params, "state_size": result.state_size,
        "wall_time_s": result.wall_time_s, "train_time_s": result.train_time_s,
        "steps_per_s": result.steps_per_s, "tokens_per_s": result.tokens_per_s,
        "peak_mem_bytes": result.peak_mem_bytes, "device_name": result.device_name,
        "command": command,
        **provenance(),
    }
    for k, v in task.knobs().items():
        row[f"knob_{k}"] = v
    for k, v in mix.items():
        if isinstance(v, (bool, int, float, str)):
            row[f"hp_{k}"] = v
    return row


def make_task(task: str, knobs: dict[str, Any] | None = None, preset: str | None = None):
    return get_task(task).from_knobs(knobs, preset)


def run(task: str, model: str, *, knobs: dict[str, Any] | None = None, preset: str | None = None,
        hparams: dict[str, Any] | None = None, recipe: str = "zoology", seeds=(0,),
        results: str | Path | None = "mixzoo-results", device: str | None = "auto",
        study: str | None = None, trial: int | None = None, command: str | None = None,
        log: Callable[[str], None] | None = None, on_eval=None) -> list[dict[str, Any]]:
    """Train ``model`` on ``task`` once per seed; write one leaderboard file; return rows.

    Everything is validated before any training starts; nothing is written on bad input. A
    seed whose run fails (divergence, or the mechanism raising) is a row with state FAIL and
    its ``state_reason``; the other seeds still run.
    """
    from .train import train
    t = make_task(task, knobs, preset)
    hp = dict(hparams or {})
    tcfg, mcfg, mix = split_hparams(hp, recipe)
    get_mixer(model)
    check_mixer_knobs(model, mix)
    if t.kind == "training-free":
        raise UsageError(f"task {task!r} is training-free; run it with 'mixzoo {task}'")
    run_id = uuid.uuid4().hex[:16]
    rows = []
    for s in seeds:
        if log:
            log(f"{t.name} [{preset or 'custom'}] × {model} seed {s}")
        res = train(t, model, mix, mcfg, tcfg, seed=int(s), device=device, log=log,
                    on_eval=on_eval)
        rows.append(make_row(t, model, hp, recipe, int(s), res, run_id=f"{run_id}-s{s}",
                             preset=preset, study=study, trial=trial, command=command))
    if results is not None:
        from .leaderboard import write_rows
        write_rows(results, rows)
    return rows


def command_line() -> str:
    return " ".join(["mixzoo", *sys.argv[1:]])


__all__ = ["make_row", "make_task", "provenance", "run", "split_hparams"]
