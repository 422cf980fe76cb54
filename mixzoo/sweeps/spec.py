"""Sweep specs: a TOML file (or a built-in name) listing tasks and their settings, mechanisms,
trial budget, seeds and training budget, with presets that scale them.

Layout (every key optional unless marked)::

    name = "mqar"                 # defaults to the file's stem
    default_budget = "small"      # used when no --budget is given (old spelling: default_preset)
    models = ["softmax", "lla"]   # required (here or per task)
    trials = 16                   # Optuna trials per (mechanism, setting)
    seeds = 3                     # final seeds: N (0..N-1) or a list
    search_seed = 1000            # data/init seed of the search trials (kept apart from the final seeds)
    recipe = "zoology"
    [train]                       # training budget and fixed hyperparameters of every run
    [sampler]                     # TPE: seed, n_startup_trials, n_ei_candidates, multivariate, constant_liar
    [pruner]                      # kind = median|hyperband|threshold|none, and its settings
    [search.<model>]              # replaces/extends a mechanism's registered search space
    enqueue = [{lr = 1e-3}]       # configurations tried first (Optuna enqueue_trial), per slot
    stack = "auto"                # a worker takes up to this many trials of a study at a time and
                                  # trains them as one stacked model (train_stacked), where the space
                                  # varies only lr / weight_decay; 1: one trial at a time; "auto"
                                  # (default): on a GPU as many as train/packing.py's stack_per_step
                                  # gives (16 at MAD's baseline shape), elsewhere 1. Without a
                                  # step_mode in [train], runs on a GPU are graphed (see engine.py)
    [tasks.<task>]                # required: one table per task
    preset = "zoology-64"         #   the task's own preset
    knobs = {V = 8192}            #   fixed knobs
    grid = {kv = [4, 8]}          #   settings: the product of these lists
    settings = [{kv = 4}, ...]    #   ... or an explicit list (both: the product of each with grid);
                                  #   a setting may name a task preset: {preset = "V32"}
    train = {steps = 500}         #   budget overrides for this task
    models = [...]                #   overrides the top-level list
    [budgets.<name>]              # budget presets (--budget NAME): overlays merged (recursively)
                                  # onto everything above (old spelling: [presets.<name>])
    [ttr]                         # a training-free spec: 'mixzoo ttr' options instead of [tasks]

A setting's keys are task knobs or trainer/model keys (``d_model`` for a width sweep).

Every unit's run spec (:class:`mixzoo.spec.RunSpec`: the task setting, the fixed hyperparameters,
the mechanism's knobs with their defaults) is built and validated when the spec is loaded, so a bad
value is exit code 2 before anything runs; the study's name carries a hash of that spec's
``config_hash`` and of the search (space, trials, sampler, pruner, enqueued points, search seed).
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import UsageError

TOP_KEYS = {"name", "description", "default_budget", "default_preset", "models", "trials", "seeds", "search_seed",
            "recipe", "train", "sampler", "pruner", "search", "enqueue", "tasks", "budgets", "presets", "ttr",
            "stack"}
TASK_KEYS = {"preset", "knobs", "grid", "settings", "train", "models", "trials", "enqueue"}
SAMPLER_DEFAULTS = {"seed": 0, "n_startup_trials": 10, "n_ei_candidates": 24, "multivariate": True,
                    "constant_liar": True}
PRUNER_KINDS = {"median": {"n_startup_trials": 5, "n_warmup_steps": 0, "interval_steps": 1},
                "hyperband": {"min_resource": 1, "max_resource": None, "reduction_factor": 3},
                "threshold": {"lower": None, "upper": None, "n_warmup_steps": 0},
                "none": {}}
SPACE_KINDS = ("log", "float", "int", "cat")


@dataclass
class Unit:
    """One (task setting, mechanism): one search study, then its final seed runs."""
    spec: str
    preset: str | None
    task: str
    task_preset: str | None
    knobs: dict[str, Any]          # the setting's task knobs (beside the task preset)
    model: str
    recipe: str
    fixed: dict[str, Any]          # trainer/model/mechanism hyperparameters held fixed
    space: dict[str, tuple]        # the search space
    trials: int
    seeds: list[int]
    search_seed: int
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    enqueue: list[dict[str, Any]]
    label: str                     # the setting as the spec names it, e.g. "kv=4,L=64" (in study names)
    setting: dict[str, Any] = field(default_factory=dict)
    direction: str = "maximize"
    metric: str = "accuracy"
    base: Any = field(default=None, repr=False, compare=False)   # the RunSpec of the fixed part
    stack: int | None = None       # trials a worker trains at a time as one stacked model; None: "auto"
                                   # (not hashed: how trials run, not what they compute)

    def run_spec(self):
        """The unit's :class:`~mixzoo.spec.RunSpec` before search (the fixed hyperparameters; the
        searched ones at their defaults); built and validated once."""
        if self.base is None:
            from ..spec import build
            self.base = build(self.task, self.model, knobs=self.knobs, preset=self.task_preset,
                              hparams=self.fixed, recipe=self.recipe, label=f"spec {self.spec!r} {self.model}:")
        return self.base

    @property
    def setting_label(self) -> str:
        """The task setting's label (the leaderboard's ``setting``), plus the setting's own
        non-knob keys (a width sweep's ``d_model``)."""
        extra = ", ".join(f"{k}={v}" for k, v in self.setting.items() if k not in self.run_spec().task_knobs
                          and k != "preset")
        return self.run_spec().setting + (f"; {extra}" if extra else "")

    @property
    def study(self) -> str:
        """The search study's name: readable, plus a hash of everything a trial depends on (the run
        spec's content hash, and the search)."""
        blob = json.dumps({"config": self.run_spec().config_hash, "space": self.space, "trials": self.trials,
                           "search_seed": self.search_seed, "sampler": self.sampler, "pruner": self.pruner,
                           "enqueue": self.enqueue}, sort_keys=True, default=str)
        h = hashlib.sha256(blob.encode()).hexdigest()[:8]
        return f"{self.spec}[{self.preset or '-'}]/{self.task}/{self.model}/{self.label}#{h}"

    @property
    def final_study(self) -> str:
        return f"{self.study}:final"


@dataclass
class Spec:
    name: str
    preset: str | None
    units: list[Unit]
    description: str = ""
    ttr: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def builtin_dir():
    return resources.files("mixzoo.sweeps") / "specs"


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in builtin_dir().iterdir() if p.name.endswith(".toml"))


def read_raw(spec: str) -> tuple[dict[str, Any], str, str]:
    """(parsed TOML, default name, where it came from) for a file path or a built-in name."""
    p = Path(spec)
    if p.suffix == ".json" and p.is_file():  # a spec written by 'mixzoo compare' for its workers
        return json.loads(p.read_text()), p.stem, str(p)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise UsageError(f"spec file {spec!r} not found; allowed: a TOML file or a built-in spec "
                             f"({', '.join(builtin_names())})")
        text, name, source = p.read_text(), p.stem, str(p)
    else:
        f = builtin_dir() / f"{spec}.toml"
        if not f.is_file():
            raise UsageError(f"unknown spec {spec!r}; allowed: a TOML file or a built-in spec "
                             f"({', '.join(builtin_names())})")
        text, name, source = f.read_text(), spec, f"built-in:{spec}"
    try:
        return tomllib.loads(text), name, source
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"spec {source!r} is not valid TOML: {e}")


def budgets_of(raw: dict, source: str = "") -> tuple[dict[str, dict], str | None]:
    """The spec's budget presets and its default one: ``[budgets.*]`` / ``default_budget`` (the old
    spelling ``[presets.*]`` / ``default_preset`` still read)."""
    if "budgets" in raw and "presets" in raw:
        raise UsageError(f"spec {source}: both [budgets] and [presets]; allowed: one ([budgets]; "
                         f"[presets] is its old name)")
    budgets = raw.get("budgets", raw.get("presets", {})) or {}
    if not isinstance(budgets, dict) or not all(isinstance(v, dict) for v in budgets.values()):
        raise UsageError(f"spec {source}: [budgets] must hold one table per budget")
    return budgets, raw.get("default_budget", raw.get("default_preset"))


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _unknown(where: str, keys, allowed) -> None:
    for k in keys:
        if k not in allowed:
            raise UsageError(f"{where}: unknown key {k!r}; allowed: {', '.join(sorted(allowed))}")


def _int(where: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise UsageError(f"{where} = {v!r} is not allowed; allowed: an integer >= {lo}")
    return v


def _space_entry(where: str, v) -> tuple:
    if isinstance(v, (list, tuple)) and v and v[0] in SPACE_KINDS:
        kind = v[0]
        if kind == "cat":
            if len(v) == 2 and isinstance(v[1], (list, tuple)) and v[1]:
                return ("cat", list(v[1]))
        elif len(v) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v[1:]):
            lo, hi = v[1], v[2]
            if lo < hi and (kind != "log" or lo > 0) and (kind != "int" or (int(lo) == lo and int(hi) == hi)):
                return (kind, int(lo), int(hi)) if kind == "int" else (kind, float(lo), float(hi))
    raise UsageError(f"{where} = {v!r} is not a search-space entry; allowed: [\"log\", lo>0, hi], "
                     f"[\"float\", lo, hi], [\"int\", lo, hi] (lo < hi) or [\"cat\", [choices]]")


def _seeds(where: str, v) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return list(range(_int(where, v)))
    if isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v) \
            and len(set(v)) == len(v):
        return list(v)
    raise UsageError(f"{where} = {v!r} is not allowed; allowed: a count >= 1 or a list of distinct seeds >= 0")


def _pruner(where: str, cfg: dict) -> dict:
    cfg = dict(cfg)
    kind = cfg.pop("kind", "median")
    if kind not in PRUNER_KINDS:
        raise UsageError(f"{where}.kind = {kind!r} is not allowed; allowed: {', '.join(PRUNER_KINDS)}")
    _unknown(f"{where} ({kind})", cfg, PRUNER_KINDS[kind])
    return {"kind": kind, **PRUNER_KINDS[kind], **cfg}


def _check_hparams(where: str, hp: dict, model: str | None = None) -> None:
    from ..api import MODEL_KEYS, TRAIN_KEYS, check_mixer_knobs
    rest = {k: v for k, v in hp.items() if k not in TRAIN_KEYS and k not in MODEL_KEYS}
    if model is None:
        if rest:
            k = sorted(rest)[0]
            raise UsageError(f"{where}: unknown key {k!r}; allowed: {', '.join(sorted(TRAIN_KEYS | MODEL_KEYS))}")
        return
    try:
        check_mixer_knobs(model, rest)
    except UsageError as e:
        raise UsageError(f"{where}: {e}")


def load(spec: str, preset: str | None = None, *, models: list[str] | None = None, tasks: list[str] | None = None,
         trials: int | None = None, seeds: int | None = None, raw: dict | None = None,
         stack: int | None = None) -> Spec:
    """Read, merge the budget preset into, validate and expand a spec into units."""
    from ..registry import get_mixer, get_task
    from ..spec import _section_of, typed
    if raw is None:
        raw, name, source = read_raw(spec)
    else:
        name, source = spec, "(built in memory)"
    if not isinstance(raw, dict):
        raise UsageError(f"spec {source!r} must be a TOML table")
    _unknown(f"spec {source}", raw, TOP_KEYS)
    presets, default = budgets_of(raw, source)
    preset = preset or default
    if preset is not None:
        if preset not in presets:
            raise UsageError(f"spec {name!r}: unknown budget {preset!r}; allowed: {', '.join(sorted(presets)) or '(none)'}")
        over = presets[preset]
        _unknown(f"spec {source} [budgets.{preset}]", over, TOP_KEYS - {"budgets", "presets", "default_budget",
                                                                        "default_preset"})
        raw = merge(raw, over)
    name = str(raw.get("name", name))
    where = f"spec {name!r}"
    for sect in ("train", "sampler", "pruner", "search", "tasks"):
        if not isinstance(raw.get(sect, {}), dict):
            raise UsageError(f"{where}: [{sect}] must be a table")
    sampler = dict(SAMPLER_DEFAULTS)
    _unknown(f"{where} [sampler]", raw.get("sampler", {}), SAMPLER_DEFAULTS)
    sampler.update(raw.get("sampler", {}))
    for k in ("seed", "n_startup_trials", "n_ei_candidates"):
        _int(f"{where} sampler.{k}", sampler[k], 0)
    pruner = _pruner(f"{where} pruner", raw.get("pruner", {}))
    recipe = raw.get("recipe", "zoology")
    top_models = raw.get("models")
    top_trials = trials if trials is not None else raw.get("trials", 16)
    seed_list = _seeds(f"{where} seeds", seeds if seeds is not None else raw.get("seeds", 3))
    search_seed = _int(f"{where} search_seed", raw.get("search_seed", 1000), 0)
    n_stack = stack if stack is not None else raw.get("stack", "auto")
    n_stack = None if n_stack == "auto" else _int(f"{where} stack", n_stack)
    base_train = raw.get("train", {})
    _check_hparams(f"{where} [train]", base_train)
    search = raw.get("search", {})
    task_tables = raw.get("tasks", {})
    ttr = raw.get("ttr", {})
    if not isinstance(ttr, dict):
        raise UsageError(f"{where}: [ttr] must be a table of 'mixzoo ttr' options")
    if not task_tables and ttr:
        return Spec(name=name, preset=preset, units=[], description=str(raw.get("description", "")), ttr=ttr,
                    source=source)
    if not task_tables:
        raise UsageError(f"{where}: no [tasks.<name>] table; allowed: one per task, e.g. [tasks.mqar]")
    if tasks:
        for t in tasks:
            if t not in task_tables:
                raise UsageError(f"{where}: task {t!r} is not in the spec; allowed: {', '.join(task_tables)}")
        task_tables = {k: v for k, v in task_tables.items() if k in tasks}
    units: list[Unit] = []
    for tname, tt in task_tables.items():
        twhere = f"{where} [tasks.{tname}]"
        if not isinstance(tt, dict):
            raise UsageError(f"{twhere} must be a table")
        _unknown(twhere, tt, TASK_KEYS)
        cls = get_task(tname)
        if cls.kind == "training-free":
            raise UsageError(f"{twhere}: task {tname!r} is training-free and has no sweep; allowed: "
                             f"run it with 'mixzoo {tname}'")
        knob_names = {f.name for f in cls.knob_fields()}
        from ..api import MODEL_KEYS, TRAIN_KEYS
        setting_keys = knob_names | TRAIN_KEYS | MODEL_KEYS | {"preset"}
        tpreset = tt.get("preset")
        fixed_knobs = tt.get("knobs", {})
        if not isinstance(fixed_knobs, dict):
            raise UsageError(f"{twhere}: knobs must be a table")
        for k in fixed_knobs:
            if k not in knob_names:
                raise UsageError(f"{twhere}: unknown knob {k!r} for task {tname}; allowed: {', '.join(sorted(knob_names))}")
        grid = tt.get("grid", {})
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
            raise UsageError(f"{twhere}: grid must map each key to a non-empty list of values")
        explicit = tt.get("settings", [{}])
        if not isinstance(explicit, list) or not all(isinstance(s, dict) for s in explicit) or not explicit:
            raise UsageError(f"{twhere}: settings must be a non-empty list of tables")
        combos = [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())] or [{}]
        settings = [{**s, **c} for s in explicit for c in combos]
        train = {**base_train, **tt.get("train", {})}
        _check_hparams(f"{twhere} train", train)
        models_here = models or tt.get("models", top_models)
        if not models_here or not isinstance(models_here, list):
            raise UsageError(f"{where}: no mechanisms for task {tname!r}; allowed: a list, e.g. models = [\"softmax\", \"lla\"]")
        n_trials = _int(f"{twhere} trials", trials if trials is not None else tt.get("trials", top_trials))
        enqueue = tt.get("enqueue", raw.get("enqueue", []))
        if not isinstance(enqueue, list) or not all(isinstance(e, dict) for e in enqueue):
            raise UsageError(f"{twhere}: enqueue must be a list of tables of hyperparameters")
        for s in settings:
            for k in s:
                if k not in setting_keys:
                    raise UsageError(f"{twhere}: unknown knob {k!r} for task {tname}; allowed: "
                                     f"{', '.join(sorted(knob_names))} (or preset, trainer/model keys)")
            s_knobs = {**fixed_knobs, **{k: v for k, v in s.items() if k in knob_names}}
            s_hp = {k: v for k, v in s.items() if k not in knob_names and k != "preset"}
            s_preset = s.get("preset", tpreset)
            try:
                task = cls.from_knobs(s_knobs, s_preset)
            except UsageError as e:
                raise UsageError(f"{twhere}: {e}")
            label = ",".join(f"{k}={v}" for k, v in s.items()) or (tpreset or "default")
            for m in models_here:
                try:
                    mspec = get_mixer(m)
                except UsageError as e:
                    raise UsageError(f"{where}: {e}")
                space = dict(mspec.search_space)
                over = search.get(m, {})
                if not isinstance(over, dict):
                    raise UsageError(f"{where} [search.{m}] must be a table")
                for hp, entry in over.items():
                    if entry in ("fixed", None, False) or entry == []:
                        space.pop(hp, None)
                    else:
                        space[hp] = entry
                space = {hp: _space_entry(f"{where} search space of {m}: {hp}", e) for hp, e in space.items()}
                fixed = {**train, **s_hp}
                fixed = {k: v for k, v in fixed.items() if k not in space}
                _check_hparams(f"{where} {m}", {**fixed, **{k: None for k in space}}, m)
                for e in enqueue:
                    bad = [k for k in e if k not in space]
                    if bad:
                        raise UsageError(f"{twhere}: enqueued hyperparameter {bad[0]!r} is not searched for {m}; "
                                         f"allowed: {', '.join(sorted(space)) or '(empty space)'}")
                unit = Unit(spec=name, preset=preset, task=tname, task_preset=s_preset, knobs=s_knobs,
                            model=m, recipe=recipe, fixed=fixed, space=space, trials=n_trials,
                            seeds=seed_list, search_seed=search_seed, sampler=sampler, pruner=pruner,
                            enqueue=enqueue, label=label, setting=dict(s), stack=n_stack,
                            direction="maximize" if task.primary.higher_is_better else "minimize",
                            metric=task.primary.name)
                base = unit.run_spec()          # every value typed and checked, once, here
                flat = base.hparams()
                unit.fixed = {k: flat.get(k, v) for k, v in fixed.items()}
                for e in enqueue:
                    for k, v in e.items():
                        typed(m, _section_of(k), k, v, f"{twhere} enqueue {k}")
                units.append(unit)
    names = [u.study for u in units]
    if len(set(names)) != len(names):
        raise UsageError(f"{where}: two settings of one task are identical; allowed: distinct settings")
    return Spec(name=name, preset=preset, units=units, description=str(raw.get("description", "")),
                ttr=raw.get("ttr", {}), source=source)
