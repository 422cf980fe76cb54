"""The public Python API: run a mechanism on a task and land leaderboard rows.

Hyperparameters are one flat dict: trainer keys (``lr``, ``steps``, ...), model keys
(``d_model``, ``n_layers``, ...) and everything else goes to the mechanism's constructor.
The data flow is one way: task → generator → trainer → metrics → leaderboard row.

Input is checked once, where it enters, before anything is generated, trained or written:
every hyperparameter is coerced to its declared type (:func:`coerce_hparams`), the mechanism is
built once on the CPU at the run's width (a constructor refusing its knobs is bad input) and its
causality checked on a short input (:func:`probe_mixer`), and the results directory must be one
that can be written (:func:`check_results_dir`).
"""
from __future__ import annotations

import datetime as _dt
import functools
import inspect
import json
import numbers
import os
import platform
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import UsageError
from .registry import constructor_params, get_mixer, get_task

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


def mixer_knob_names(model: str) -> list[str] | None:
    """The constructor knobs a mechanism takes by name (None: it takes any, ``**kwargs``)."""
    params = constructor_params(get_mixer(model).impl)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [n for i, (n, p) in enumerate(params.items()) if p.kind in named
            and n not in ("d_model", "num_heads", "layer_idx")
            and not (i == 0 and p.kind == p.POSITIONAL_OR_KEYWORD)]      # the first: the width


def check_mixer_knobs(model: str, knobs: dict[str, Any]) -> None:
    allowed = mixer_knob_names(model)
    if allowed is None:
        return
    for k in knobs:
        if k not in allowed:
            every = sorted(set(allowed) | TRAIN_KEYS | MODEL_KEYS)
            raise UsageError(f"unknown hyperparameter {k!r} for {model}; allowed: {', '.join(every)}")


# -- typed hyperparameters -----------------------------------------------------------------

_NONE = type(None)
_SIMPLE = {"int": int, "float": float, "bool": bool, "str": str, "None": _NONE, "NoneType": _NONE}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
# TrainConfig.compile is a mode name, but specs may give a boolean (true: "default")
_EXTRA_TYPES = {"compile": (bool,)}


def simple_types(ann) -> tuple[type, ...] | None:
    """The members of a type annotation among bool, int, float, str and None (``"float | None"``
    -> (float, NoneType)); None for an absent annotation or one naming anything else."""
    import types
    import typing
    if ann is inspect.Parameter.empty:
        return None
    if isinstance(ann, str):
        txt = ann.replace(" ", "")
        opt = txt.removeprefix("typing.")
        if opt.startswith("Optional[") and opt.endswith("]"):
            parts = [opt[len("Optional["):-1], "None"]
        else:
            parts = txt.split("|")
        if not all(part in _SIMPLE for part in parts):
            return None
        return tuple(_SIMPLE[part] for part in parts)
    if ann is None:
        return (_NONE,)
    if ann in (bool, int, float, str, _NONE):
        return (ann,)
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        out: list[type] = []
        for a in typing.get_args(ann):
            r = simple_types(a)
            if r is None:
                return None
            out += r
        return tuple(out)
    return None


@functools.cache
def _config_types(which: str) -> dict[str, tuple[type, ...] | None]:
    import dataclasses
    if which == "train":
        from .train import TrainConfig as cls
    else:
        from .models import ModelConfig as cls
    return {f.name: (None if (t := simple_types(f.type)) is None else t + _EXTRA_TYPES.get(f.name, ()))
            for f in dataclasses.fields(cls)}


def mixer_knob_types(model: str) -> dict[str, tuple[type, ...] | None]:
    """Each named constructor knob's types: its annotation, else the type of its default."""
    out = {}
    for n, p in constructor_params(get_mixer(model).impl).items():
        t = simple_types(p.annotation)
        if t is None and p.default is not p.empty and p.default is not None:
            t = simple_types(type(p.default))
        if t is not None and p.default is None and _NONE not in t:
            t = (*t, _NONE)
        out[n] = t
    return out


def _describe(types: tuple[type, ...]) -> str:
    names = {int: "an int", float: "a float", bool: "a bool (true, false, 1, 0, yes, no)", str: "a string",
             _NONE: "none"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


def coerce_value(v, types: tuple[type, ...] | None, what: str):
    """``v`` as one of ``types`` (a string from the command line is parsed; ints are refused a
    fractional value, floats take ints, booleans take true/false/1/0/yes/no); with ``types``
    None, a string is read as a literal (``commands.literal``) and anything else kept."""
    from .commands import literal
    if types is None:
        return literal(v) if isinstance(v, str) else v

    def bad():
        return UsageError(f"{what}={v!r}: not {_describe(types)}")
    if v is None:
        if _NONE in types:
            return None
        raise bad()
    if isinstance(v, str):
        low = v.strip().lower()
        if _NONE in types and low in ("none", "null"):
            return None
        if bool in types and low in _TRUE + _FALSE and not (int in types and low in ("0", "1")):
            return low in _TRUE
        if int in types:
            try:
                return int(low)
            except ValueError:
                pass
            try:
                f = float(low)
            except ValueError:
                f = None
            if f is not None and f.is_integer():
                return int(f)
        if float in types:
            try:
                return float(low)
            except ValueError:
                pass
        if str in types:
            return v
        raise bad()
    if isinstance(v, bool):
        if bool in types:
            return v
        raise bad()
    if isinstance(v, numbers.Integral):
        if int in types:
            return int(v)
        if float in types:
            return float(v)
        if bool in types and v in (0, 1):
            return bool(v)
        if str in types:
            return str(v)
        raise bad()
    if isinstance(v, numbers.Real):
        if float in types:
            return float(v)
        if int in types and float(v).is_integer():
            return int(v)
        if str in types:
            return str(v)
        raise bad()
    raise bad()


def coerce_hparams(model: str, hparams: dict[str, Any], *, label: str = "hparams") -> dict[str, Any]:
    """Every value of the flat hyperparameter dict as the type its field declares: TrainConfig and
    ModelConfig fields, and the mechanism's constructor knobs (annotation, else the default's
    type). Unknown keys are left for :func:`check_mixer_knobs`. A bad value is a UsageError like
    ``--hp lr='abc': not a float`` (``label`` is the prefix)."""
    train_t, model_t = _config_types("train"), _config_types("model")
    knob_t = mixer_knob_types(model)
    out = {}
    for k, v in hparams.items():
        types = train_t.get(k) if k in TRAIN_KEYS else model_t.get(k) if k in MODEL_KEYS else knob_t.get(k)
        out[k] = coerce_value(v, types, f"{label} {k}")
    return out


# -- the results directory -----------------------------------------------------------------

def check_results_dir(results: str | Path, what: str = "--results") -> Path:
    """``results`` as a Path, if it is a directory that can be written or could be made in one;
    otherwise a UsageError (a file, or a directory without write permission). Creates nothing."""
    p = Path(results)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{what} {str(results)!r} is a file, not a directory")
    first = p.absolute()
    while not first.exists() and first != first.parent:
        first = first.parent
    if not first.is_dir():
        raise UsageError(f"{what} {str(results)!r}: {str(first)!r} is a file, not a directory")
    if not os.access(first, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {str(results)!r}: directory {str(first)!r} cannot be written")
    return p


# -- the mechanism, built once before a run --------------------------------------------------

PROBE_LEN = 16      # sequence length of the causality check before a run


def probe_mixer(model: str, knobs: dict[str, Any], d_model: int, num_heads: int, *, seq_len: int,
                allow_noncausal: bool = False, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build one layer of ``model`` on the CPU at ``d_model``/``num_heads`` with ``knobs`` and run
    the causality check of ``mixzoo check-mixer`` once, on one sequence of length 16 (its
    perturbed copies in the same forward pass). A ValueError or TypeError from the constructor,
    and a leaky mechanism (unless ``allow_noncausal``), are UsageErrors; anything else the
    mechanism raises here is left for the run, whose FAIL row reports it. Returns
    ``{"checked": bool, "leak": float | None, "has_backend": bool | None}``; the global RNG is
    left as it was."""
    import torch

    from .check import causal_leak
    from .registry import build_mixer
    from .train.loop import failure_reason
    spec = get_mixer(model)
    info: dict[str, Any] = {"checked": False, "leak": None, "has_backend": None}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            m = build_mixer(spec, d_model, num_heads=num_heads, layer_idx=0, l_max=seq_len, **knobs)
        except UsageError:
            raise
        except (ValueError, TypeError) as e:
            raise UsageError(f"mechanism {model!r} refused its settings: {failure_reason(e)}") from None
        except Exception as e:          # an out-of-memory, a path missing on the CPU: the run says
            if log:
                log(f"{model}: not checked before the run (building it on the CPU: {failure_reason(e)})")
            return info
        T = max(2, min(PROBE_LEN, int(seq_len)))
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, T, d_model, generator=g)
        try:
            if isinstance(m, torch.nn.Module):
                m.eval()
            worst, where, tol = causal_leak(m, x, generator=g, points=(0, T // 4, T // 2, T - 2), stacked=True)
        except Exception as e:
            if log:
                log(f"{model}: causality not checked before the run (a forward on the CPU: {failure_reason(e)})")
            return info
    info.update(checked=True, leak=worst, has_backend=hasattr(m, "backend"))
    if worst > tol:
        msg = (f"mechanism {model!r} is not causal: its outputs up to position {where} change by {worst:.2e} "
               f"(tolerance {tol:.1e}) when later inputs change")
        if not allow_noncausal:
            raise UsageError(f"{msg}; pass --allow-noncausal (api: allow_noncausal=True) to run it anyway")
        if log:
            log(f"{msg} (allowed: --allow-noncausal)")
    return info


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
             trial: int | None = None, command: str | None = None,
             allow_noncausal: bool | None = None) -> dict[str, Any]:
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
        "command": command, "allow_noncausal": allow_noncausal,
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
        log: Callable[[str], None] | None = None, on_eval=None,
        allow_noncausal: bool = False) -> list[dict[str, Any]]:
    """Train ``model`` on ``task`` once per seed; write one leaderboard file; return rows.

    Everything is validated before any data is generated or training starts, and nothing is
    written on bad input (a UsageError): hyperparameters are coerced to their declared types, the
    results directory must be writable, and the mechanism is built once on the CPU (its
    constructor refusing the knobs is bad input) and checked causal on a short input; a leaky
    mechanism is refused unless ``allow_noncausal`` (recorded in the rows). A seed whose run fails
    (divergence, or the mechanism raising in training) is a row with state FAIL and its
    ``state_reason``; the other seeds still run.
    """
    from .registry import wants_l_max
    from .train import train
    t = make_task(task, knobs, preset)
    spec = get_mixer(model)
    hp = dict(hparams or {})
    check_mixer_knobs(model, {k: v for k, v in hp.items() if k not in TRAIN_KEYS and k not in MODEL_KEYS})
    hp = coerce_hparams(model, hp)
    tcfg, mcfg, mix = split_hparams(hp, recipe)
    if t.kind == "training-free":
        raise UsageError(f"task {task!r} is training-free; run it with 'mixzoo {task}'")
    if results is not None:
        check_results_dir(results)
    probe = probe_mixer(model, mix, mcfg.d_model, mcfg.num_heads, seq_len=t.seq_len,
                        allow_noncausal=allow_noncausal, log=log)
    build_knobs = dict(mix)
    if wants_l_max(spec) and "l_max" not in build_knobs:      # zoology's constructors take the length
        build_knobs["l_max"] = t.seq_len
    run_id = uuid.uuid4().hex[:16]
    rows = []
    for s in seeds:
        if log:
            log(f"{t.name} [{preset or 'custom'}] × {model} seed {s}")
        res = train(t, model, build_knobs, mcfg, tcfg, seed=int(s), device=device, log=log,
                    on_eval=on_eval)
        if probe["has_backend"] is False and res.backend == "torch":
            res.backend = spec.impl.__name__          # no 'backend' attribute: the class names the path
        rows.append(make_row(t, model, hp, recipe, int(s), res, run_id=f"{run_id}-s{s}",
                             preset=preset, study=study, trial=trial, command=command,
                             allow_noncausal=bool(allow_noncausal)))
    if results is not None:
        from .leaderboard import write_rows
        write_rows(results, rows)
    return rows


def command_line() -> str:
    return " ".join(["mixzoo", *sys.argv[1:]])


__all__ = ["check_mixer_knobs", "check_results_dir", "coerce_hparams", "make_row", "make_task",
           "probe_mixer", "provenance", "run", "split_hparams"]
