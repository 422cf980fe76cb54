"""The public Python API: run a mechanism on a task and land leaderboard rows.

Input becomes one typed, frozen :class:`~mixzoo.spec.RunSpec` where it enters
(:func:`mixzoo.spec.build`; hyperparameters as one flat dict: trainer keys (``lr``, ``steps``,
...), backbone keys (``d_model``, ``n_layers``, ...), and everything else the mechanism's
constructor knobs), which reaches the trainer and the row unchanged. The data flow is one way:
task → generator → trainer → metrics → leaderboard row (and its curves).

Input is checked once, where it enters, before anything is generated, trained or written:
every value is coerced to its declared type, the mechanism is built once on the CPU at the run's
width (a constructor refusing its knobs is bad input) and its causality checked on a short input
(:func:`probe_mixer`), and the results directory must be one that can be written
(:func:`check_results_dir`).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import json
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
from .spec import coerce_value, mixer_knob_types, simple_types  # noqa: F401  (their home was here)


def _keys(which: str) -> frozenset[str]:
    from .spec import config_types
    return frozenset(config_types(which))


def __getattr__(name: str):
    # TRAIN_KEYS / MODEL_KEYS, once hand-kept lists, are now read from the dataclasses' fields
    if name == "TRAIN_KEYS":
        return _keys("train")
    if name == "MODEL_KEYS":
        return _keys("backbone")
    raise AttributeError(name)


def split_hparams(hp: dict[str, Any], recipe: str = "zoology"):
    """(TrainConfig, ModelConfig, mechanism knobs given) of a flat dict: a trainer key, else a
    backbone key, else a mechanism knob (typed as given; :func:`mixzoo.spec.build` types them)."""
    from .models import RECIPES, ModelConfig
    from .train import TrainConfig
    if recipe not in RECIPES:
        raise UsageError(f"unknown recipe {recipe!r}; allowed: {', '.join(sorted(RECIPES))}")
    train_k, model_k = _keys("train"), _keys("backbone")
    tr = {k: v for k, v in hp.items() if k in train_k}
    mo = {**RECIPES[recipe], **{k: v for k, v in hp.items() if k in model_k}}
    mix = {k: v for k, v in hp.items() if k not in train_k and k not in model_k}
    return TrainConfig(**tr), ModelConfig(**mo), mix


def mixer_knob_names(model: str) -> list[str] | None:
    """The constructor knobs a mechanism takes by name (None: it takes any, ``**kwargs``)."""
    from .spec import mixer_params
    named, anykw = mixer_params(model)
    if anykw:
        return None
    return list(named) + (["l_max"] if "l_max" in constructor_params(get_mixer(model).impl) else [])


def check_mixer_knobs(model: str, knobs: dict[str, Any]) -> None:
    from .spec import check_name
    for k in knobs:
        check_name(model, "mixer", k)


def coerce_hparams(model: str, hparams: dict[str, Any], *, label: str = "hparams") -> dict[str, Any]:
    """Every value of the flat hyperparameter dict as the type its field declares: TrainConfig and
    ModelConfig fields, and the mechanism's constructor knobs (annotation, else the default's
    type). Unknown keys are left for :func:`check_mixer_knobs`. A bad value is a UsageError like
    ``--hp lr='abc': not a float`` (``label`` is the prefix)."""
    from .spec import _section_of, typed
    return {k: typed(model, _section_of(k), k, v, f"{label} {k}") for k, v in hparams.items()}


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
    # MIXZOO_GIT_SHA: the commit of a tree exported without its .git (git archive); otherwise only
    # a repository whose top level is this checkout counts (not one that merely contains it)
    if os.environ.get("MIXZOO_GIT_SHA"):
        sha, dirty = os.environ["MIXZOO_GIT_SHA"], False
    try:
        top = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        if sha is None and top and Path(top).resolve() == here:
            sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                                 text=True, timeout=5).stdout.strip() or None
        if sha and dirty is None:
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


def make_row(spec, task, result, *, run_id: str, study: str | None = None, trial: int | None = None,
             command: str | None = None, search_space: dict[str, Any] | None = None) -> dict[str, Any]:
    """The leaderboard row of one seed's run: ``spec`` (a :class:`~mixzoo.spec.RunSpec`, written
    whole as ``spec_json``), ``task`` (its task object) and ``result`` (the trainer's RunResult).
    ``search_space``: what was searched (a sweep's study), else the mechanism's registered space.
    The run's curves travel with the row under ``history`` (not a column: the store writes them to
    its curves table)."""
    from .leaderboard.schema import SCHEMA_VERSION
    metric = task.primary
    hp = spec.hparams()
    if search_space is None:
        search_space = get_mixer(spec.model).search_space
    row = {
        "schema_version": SCHEMA_VERSION, "run_id": run_id,
        "created_at": _dt.datetime.now(_dt.UTC),
        "suite": task.suite, "task": task.name, "task_version": task.version, "preset": spec.task_preset,
        "setting": spec.setting,
        "model": spec.model, "backend": result.backend, "recipe": spec.recipe, "seed": spec.seed,
        "metric_name": metric.name, "metric_value": result.test.get(metric.name),
        "higher_is_better": metric.higher_is_better,
        "val_metric_value": result.val.get(metric.name),
        "state": result.state, "state_reason": result.reason or None,
        "study": study, "trial": trial,
        "knobs_json": json.dumps(dict(spec.task_knobs), sort_keys=True),
        "hparams_json": json.dumps(hp, sort_keys=True, default=str),
        "spec_json": spec.to_json(), "spec_hash": spec.hash, "config_hash": spec.config_hash,
        "search_space_json": json.dumps(search_space, default=str),      # in its own order: the label's
        "metrics_json": json.dumps(result.test, sort_keys=True),
        "val_metrics_json": json.dumps(result.val, sort_keys=True),
        "lr": spec.train["lr"], "weight_decay": spec.train["weight_decay"], "batch_size": spec.train["batch_size"],
        "optimizer": spec.train["optimizer"], "schedule": spec.train["schedule"],
        "diagnostics_json": json.dumps(result.diagnostics, sort_keys=True) if result.diagnostics else None,
        "steps": result.steps, "best_step": result.best_step,
        "d_model": spec.backbone["d_model"], "n_layers": spec.backbone["n_layers"],
        "num_heads": spec.backbone["num_heads"],
        "params": result.params, "state_size": result.state_size,
        "wall_time_s": result.wall_time_s, "train_time_s": result.train_time_s,
        "steps_per_s": result.steps_per_s, "tokens_per_s": result.tokens_per_s,
        "peak_mem_bytes": result.peak_mem_bytes, "device_name": result.device_name,
        "gpu": result.gpu, "kernels": getattr(result, "kernels", None),
        "command": command, "allow_noncausal": spec.allow_noncausal,
        **provenance(),
    }
    for k, v in spec.task_knobs.items():
        row[f"knob_{k}"] = v
    for k, v in hp.items():
        if isinstance(v, (bool, int, float, str)):
            row[f"hp_{k}"] = v
    row["history"] = list(result.history)
    return row


def write_results(results: str | Path, rows: list[dict[str, Any]]):
    """Write one run's rows (and their curves) into the store, every file with the columns the
    registry declares (:func:`mixzoo.spec.known_columns`)."""
    from .leaderboard import write_rows
    from .spec import known_columns
    return write_rows(results, rows, columns=known_columns())


def make_task(task: str, knobs: dict[str, Any] | None = None, preset: str | None = None):
    return get_task(task).from_knobs(knobs, preset)


def run(task: str, model: str, *, knobs: dict[str, Any] | None = None, preset: str | None = None,
        hparams: dict[str, Any] | None = None, recipe: str = "zoology", seeds=(0,),
        results: str | Path | None = "mixzoo-results", device: str | None = "auto",
        study: str | None = None, trial: int | None = None, command: str | None = None,
        log: Callable[[str], None] | None = None, on_eval=None,
        allow_noncausal: bool = False, search_space: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Train ``model`` on ``task`` once per seed; write one leaderboard file; return rows.

    The input is resolved into a typed :class:`~mixzoo.spec.RunSpec` first (:func:`mixzoo.spec.build`:
    ``knobs`` over ``preset`` for the task; ``hparams`` flat: a trainer key, else a backbone key,
    else a mechanism knob), then run by :func:`run_spec`.
    """
    from .spec import build
    spec = build(task, model, knobs=knobs, preset=preset, hparams=hparams, recipe=recipe,
                 allow_noncausal=allow_noncausal)
    return run_spec(spec, seeds=seeds, results=results, device=device, study=study, trial=trial,
                    command=command, log=log, on_eval=on_eval, search_space=search_space)


def run_spec(spec, *, seeds=None, results: str | Path | None = "mixzoo-results", device: str | None = "auto",
             study: str | None = None, trial: int | None = None, command: str | None = None,
             log: Callable[[str], None] | None = None, on_eval=None,
             search_space: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run a :class:`~mixzoo.spec.RunSpec` once per seed (``seeds``; default the spec's own) and
    write one leaderboard file (and its curves) unless ``results`` is None; return the rows.

    Everything is checked before any data is generated or training starts, and nothing is written
    on bad input (a UsageError): the results directory must be writable, and the mechanism is built
    once on the CPU (its constructor refusing the knobs is bad input) and checked causal on a short
    input; a leaky mechanism is refused unless the spec allows it (recorded in the rows). A seed
    whose run fails (divergence, or the mechanism raising in training) is a row with state FAIL and
    its ``state_reason``; the other seeds still run. The spec reaches the trainer and the row as is.
    """
    from .registry import wants_l_max
    from .train import train
    t = spec.make_task()
    mspec = get_mixer(spec.model)
    if t.kind == "training-free":
        raise UsageError(f"task {spec.task!r} is training-free; run it with 'mixzoo {spec.task}'")
    if results is not None:
        check_results_dir(results)
    probe = probe_mixer(spec.model, dict(spec.mixer_knobs), spec.backbone["d_model"], spec.backbone["num_heads"],
                        seq_len=t.seq_len, allow_noncausal=spec.allow_noncausal, log=log)
    build_knobs = dict(spec.mixer_knobs)
    if wants_l_max(mspec) and "l_max" not in build_knobs:      # zoology's constructors take the length
        build_knobs["l_max"] = t.seq_len
    tcfg, mcfg = spec.train_config(), spec.model_config()
    run_id = uuid.uuid4().hex[:16]
    rows = []
    for s in (spec.seed,) if seeds is None else seeds:
        s_spec = spec.with_seed(int(s))
        if log:
            log(f"{t.name} [{spec.task_preset or 'custom'}] × {spec.model} seed {s}")
        res = train(t, spec.model, build_knobs, mcfg, tcfg, seed=int(s), device=device, log=log,
                    on_eval=on_eval)
        if probe["has_backend"] is False and res.backend == "torch":
            res.backend = mspec.impl.__name__          # no 'backend' attribute: the class names the path
        rows.append(make_row(s_spec, t, res, run_id=f"{run_id}-s{s}", study=study, trial=trial,
                             command=command, search_space=search_space))
    if results is not None:
        write_results(results, rows)
    return rows


def run_stacked(specs, *, seeds, device: str | None = "auto", study: str | None = None, trials=None,
                command: str | None = None, log: Callable[[str], None] | None = None, on_eval=None,
                mode: str = "stacked", search_space: dict[str, Any] | None = None):
    """Run K :class:`~mixzoo.spec.RunSpec` (``specs[k]`` on ``seeds[k]``) as one stacked model
    (:func:`mixzoo.train.stacked.train_stacked`; the specs may differ only in ``lr`` and
    ``weight_decay``) and return ``(rows, hook_errors)``: one row per run, built by :func:`make_row`
    as :func:`run_spec` builds it (not written), its ``spec_json`` naming the step mode that ran
    (``stacked``, or ``eager`` where the stacked step could not run); and what each run's
    ``on_eval[k]`` raised (it stopped that run only), else None. ``trials[k]``: the row's trial."""
    from .registry import wants_l_max
    from .train.stacked import train_stacked
    specs, seeds = list(specs), [int(s) for s in seeds]
    if not specs or len(specs) != len(seeds):
        raise UsageError(f"run_stacked: {len(specs)} specs but {len(seeds)} seeds")
    spec = specs[0]

    def shape(s):
        return (s.task, dict(s.task_knobs), s.model, dict(s.mixer_knobs), dict(s.backbone), s.recipe,
                {k: v for k, v in s.train.items() if k not in ("lr", "weight_decay", "step_mode")})
    for s in specs[1:]:
        if shape(s) != shape(spec):
            raise UsageError("run_stacked: the specs differ in more than lr and weight_decay")
    t = spec.make_task()
    mspec = get_mixer(spec.model)
    if t.kind == "training-free":
        raise UsageError(f"task {spec.task!r} is training-free; run it with 'mixzoo {spec.task}'")
    probe = probe_mixer(spec.model, dict(spec.mixer_knobs), spec.backbone["d_model"], spec.backbone["num_heads"],
                        seq_len=t.seq_len, allow_noncausal=spec.allow_noncausal, log=log)
    build_knobs = dict(spec.mixer_knobs)
    if wants_l_max(mspec) and "l_max" not in build_knobs:
        build_knobs["l_max"] = t.seq_len
    cfgs = [dataclasses.replace(s.train_config(), step_mode=mode) for s in specs]
    if log:
        log(f"{t.name} [{spec.task_preset or 'custom'}] × {spec.model} seeds {seeds} ({mode}, K={len(specs)})")
    results = train_stacked(t, spec.model, build_knobs, spec.model_config(), cfgs, seeds, device=device,
                            on_eval=on_eval, log=log)
    run_id = uuid.uuid4().hex[:16]
    trials = list(trials) if trials is not None else [None] * len(specs)
    rows = []
    for k, (s, seed, res) in enumerate(zip(specs, seeds, results)):
        if probe["has_backend"] is False and res.backend == "torch":
            res.backend = mspec.impl.__name__
        ran = dataclasses.replace(s.with_seed(seed), train={**s.train, "step_mode": getattr(res, "step_mode", mode)})
        rows.append(make_row(ran, t, res, run_id=f"{run_id}-s{seed}-k{k}", study=study, trial=trials[k],
                             command=command, search_space=search_space))
    return rows, [getattr(r, "hook_error", None) for r in results]


def command_line() -> str:
    return " ".join(["mixzoo", *sys.argv[1:]])


__all__ = ["check_mixer_knobs", "check_results_dir", "coerce_hparams", "make_row", "make_task",
           "probe_mixer", "provenance", "run", "run_spec", "run_stacked", "split_hparams", "write_results"]
