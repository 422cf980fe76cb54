"""The data of a reproduction: one :class:`Figure` per paper figure.

A figure holds what the paper states (:class:`Stated`, each with the line of
``reference/paper_results.md`` or ``task_specs.md`` it comes from), what we chose where the paper
is silent (:class:`Choice`, each with its reason), the values the paper reports (:class:`Ref`),
the claims it makes (:class:`Claim`, checked by :mod:`.verdict`), and three :class:`Scale` s:
``smoke`` (CPU, CI: seconds), ``small`` (about half an hour of one H200: an estimate until
measured) and ``paper`` (the stated protocol). The protocol is fixed here, before any run; it is
never tuned toward the paper's numbers.

A trained figure becomes a sweep spec of :mod:`mixzoo.sweeps` (:func:`sweep_raw`): one study per
(setting, mechanism) whose trials are an explicit learning-rate (x weight-decay) grid, enqueued
one per slot, then the best configuration over the seeds. A training-free figure (test-time
regression) is run by :mod:`.ttr`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError

SCALES = ("smoke", "small", "paper")
KINDS = ("sweep", "ttr")
TESTS = ("above", "below", "within")
QUANTITIES = ("value", "diff", "ratio", "all")
QUANTIFIERS = ("every", "some")
# unstated choices every figure must write down
REQUIRED_CHOICES = {"sweep": ("width", "steps", "lr", "batch"), "ttr": ("sequences", "grids")}
TTR_BASELINES = ("random", "zero")


@dataclass(frozen=True)
class Stated:
    """A setting the paper states, and where (file:line of the reference notes)."""
    what: str
    value: str
    source: str


@dataclass(frozen=True)
class Choice:
    """A setting the paper does not state: our value and why (``key`` names it for checks)."""
    key: str
    value: str
    why: str


@dataclass(frozen=True)
class Ref:
    """A value the paper reports for one mechanism at one point (a setting or an aggregate)."""
    at: dict[str, Any]
    model: str
    value: float
    source: str
    approx: bool = True          # read off a figure ("≈"); False: printed in a table
    column: str = "paper"        # the reference column it goes in (a second source gets its own)


@dataclass(frozen=True)
class Aggregate:
    """A point made of other points, per seed: the mean over the settings matching ``where``,
    or over the aggregates named in ``of`` (a MAD score: per task, then over tasks)."""
    name: str
    where: dict[str, Any] = field(default_factory=dict)
    of: tuple[str, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, as a test on a per-seed quantity (see :mod:`.verdict`).

    ``kind``: ``value`` (the metric of ``a``), ``diff`` (``a`` minus ``b``, oriented so that
    positive means ``a`` is better), ``ratio`` (``a`` / ``b``, raw), or ``all``: the claims named
    in ``of`` (earlier ids) must all hold (a crossover: one side here, the other there). ``a`` and ``b`` may name
    several mechanisms: every (a, b) pair is checked. ``test``: ``above``/``below`` ``threshold``,
    or ``within`` (|q| < threshold). ``where`` selects the points (settings; with an
    ``aggregate`` key, aggregates); ``quantifier``: the claim must hold at ``every`` point and
    pair, or at ``some``. With ``along`` (a knob), the quantity tested is q at the last value of
    that knob minus q at the first (``order`` gives the order of non-numeric values), within each
    group of points equal on the other knobs: a trend.
    """
    id: str
    text: str
    source: str
    kind: str
    a: tuple[str, ...] = ()
    b: tuple[str, ...] = ()
    test: str = "above"
    threshold: float = 0.0
    where: dict[str, Any] = field(default_factory=dict)
    quantifier: str = "every"
    along: str | None = None
    order: tuple = ()
    metric: str | None = None    # a key of the rows' metrics_json; None: the primary metric
    of: tuple[str, ...] = ()     # kind "all": the ids of the claims it joins


@dataclass(frozen=True)
class Scale:
    """One scale of a figure: settings, mechanisms, the grid, the budget, seeds.

    A setting is a dict of task knobs (or ``preset``), trainer/model keys (e.g. ``batch_size``
    by length), and optionally ``task`` (default: the figure's) and ``tags`` (labels for claims,
    not passed to the task)."""
    settings: tuple[dict[str, Any], ...]
    why: str
    models: tuple[str, ...] | None = None       # None: the figure's models and extra_models
    lr: tuple[float, ...] = ()
    weight_decay: tuple[float, ...] = (0.1,)
    train: dict[str, Any] = field(default_factory=dict)
    seeds: int = 3
    sequences: int = 0                            # ttr: test sequences per seed and setting
    tune_sequences: int = 0                       # ttr: sequences the grids are tuned on


@dataclass(frozen=True)
class Figure:
    name: str
    paper: str
    figure: str
    title: str
    kind: str
    task: str
    models: tuple[str, ...]            # the mechanisms the paper compares (registry names)
    scales: dict[str, Scale]
    stated: tuple[Stated, ...]
    choices: tuple[Choice, ...]
    claims: tuple[Claim, ...]
    reference: tuple[Ref, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    extra_models: tuple[str, ...] = ()  # run beside them; no paper value, in no claim
    recipe: str = "zoology"
    knobs: dict[str, Any] = field(default_factory=dict)              # fixed task knobs (the figure's task)
    train: dict[str, Any] = field(default_factory=dict)              # fixed trainer/model keys
    mixer_knobs: dict[str, dict[str, Any]] = field(default_factory=dict)   # fixed constructor knobs
    metric: str | None = None          # the metric shown (default: the task's primary)
    notes: str = ""

    def models_at(self, scale: str) -> tuple[str, ...]:
        s = self.scale(scale)
        return s.models if s.models is not None else self.models + self.extra_models

    def scale(self, scale: str) -> Scale:
        if scale not in self.scales:
            raise UsageError(f"{self.name}: unknown scale {scale!r}; allowed: {', '.join(SCALES)}")
        return self.scales[scale]


# ---------------------------------------------------------------------------- settings and points
def split_setting(fig: Figure, s: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(task, the setting as the sweep spec takes it, its tags)."""
    s = dict(s)
    task = s.pop("task", fig.task)
    tags = dict(s.pop("tags", {}) or {})
    return task, s, tags


# trainer/model keys that may appear in a setting (budget by length) but do not name it
TRAIN_LIKE = {"batch_size", "steps", "eval_every", "n_train", "n_val", "n_test", "early_stop"}


def sweep_raw(fig: Figure, scale: str, seeds: int | None = None) -> dict[str, Any]:
    """The sweep spec (the dict :func:`mixzoo.sweeps.spec.load` takes) of a trained figure."""
    from ..registry import get_mixer
    sc = fig.scale(scale)
    models = list(fig.models_at(scale))
    lrs, wds = list(sc.lr), list(sc.weight_decay)
    grid = [{"lr": lr, "weight_decay": wd} for lr in lrs for wd in wds]
    search: dict[str, Any] = {}
    for m in models:
        space = get_mixer(m).search_space
        over: dict[str, Any] = {k: "fixed" for k in space if k not in ("lr", "weight_decay")}
        over["lr"] = ["cat", lrs]
        over["weight_decay"] = ["cat", wds]
        for k, v in fig.mixer_knobs.get(m, {}).items():
            over[k] = ["cat", [v]]          # a constructor knob fixed: a one-value search entry
        search[m] = over
    tasks: dict[str, Any] = {}
    for s in sc.settings:
        task, setting, _tags = split_setting(fig, s)
        t = tasks.setdefault(task, {"knobs": dict(fig.knobs) if task == fig.task else {}, "settings": []})
        t["settings"].append(setting)
    return {
        "name": fig.name, "description": f"{fig.paper} {fig.figure}: {fig.title}",
        "default_budget": scale, "budgets": {scale: {}},
        "models": models, "recipe": fig.recipe, "trials": len(grid),
        "seeds": int(seeds if seeds is not None else sc.seeds), "search_seed": 1000,
        # every trial is an enqueued grid point: the sampler never chooses, nothing is pruned
        "sampler": {"seed": 0, "n_startup_trials": len(grid), "n_ei_candidates": 24,
                    "multivariate": True, "constant_liar": True},
        "pruner": {"kind": "none"},
        "train": {**fig.train, **sc.train},
        "search": search, "enqueue": grid, "tasks": tasks,
    }


def ttr_study(fig: Figure, scale: str, setting: dict[str, Any], knobs: dict[str, Any],
              models: tuple[str, ...], sc: Scale) -> str:
    """The study name of one training-free setting: readable (the setting), plus a hash of what
    its rows depend on (all the task's knobs, the estimators, the numbers of sequences). The rows
    of a seed are written once; a rerun skips the seeds that have them."""
    blob = json.dumps({"knobs": knobs, "models": list(models), "sequences": sc.sequences,
                       "tune_sequences": sc.tune_sequences}, sort_keys=True, default=str)
    h = hashlib.sha256(blob.encode()).hexdigest()[:8]
    label = ",".join(f"{k}={v}" for k, v in setting.items()) or "default"
    return f"{fig.name}[{scale}]/ttr/{label}#{h}"
