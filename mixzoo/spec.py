"""The run spec: one typed, frozen record of everything a run depends on.

A :class:`RunSpec` holds the task and every one of its knobs (resolved: the preset applied,
defaults filled in), the mechanism and every knob of its constructor (the value given, else the
default read from the constructor's signature), the backbone configuration (the recipe applied),
the trainer configuration, the recipe and the seed. It is built and validated once, where input
enters (:func:`build`: the command line, a sweep spec file, the Python API ``mixzoo.api.run``),
passed down unchanged to the trainer and the row, and written whole into the row (``spec_json``)
with a stable content hash (``spec_hash``; ``config_hash`` leaves the seed out, so the seeds of
one configuration share it; sweeps name their studies by it).

Every value is coerced once to its declared type: a trainer or backbone key to its
``TrainConfig`` / ``ModelConfig`` field's annotation, a mechanism knob to its constructor
annotation, else the type of its default. A bad value is a :class:`UsageError` naming the value and
what is allowed (``--hp lr='abc': not a float``).

Keys are addressed in one syntax, ``KEY=VALUE``: qualified by the spec's section
(``task.kv=4``, ``train.lr=3e-3``, ``backbone.d_model=64`` (or ``model.``), ``mixer.ridge=2``) or
bare, in which case the first section that has the name takes it (task knobs, then trainer, then
backbone, then mechanism knobs; ``--hp`` skips the task). The same keys are the sections of a run
spec file (TOML or JSON, the shape of ``spec_json``; ``mixzoo run --spec FILE``).

This module imports nothing heavy at import time.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .errors import UsageError
from .registry import constructor_params, get_mixer, get_task

SPEC_VERSION = 1
# the spec's sections, as they prefix a qualified key (``model.`` is another name for the backbone)
SECTIONS = ("task", "train", "backbone", "mixer")
SECTION_ALIASES = {"task": "task", "train": "train", "backbone": "backbone", "model": "backbone",
                   "mixer": "mixer"}
# constructor parameters that are not knobs: the harness passes them (l_max: zoology's length)
_NOT_KNOBS = ("d_model", "num_heads", "layer_idx", "l_max")
# what the content hash leaves out: labels and gates that do not change what is trained
_NOT_HASHED = ("task_preset", "allow_noncausal")


# -- types -------------------------------------------------------------------------------------

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


def _describe(types: tuple[type, ...]) -> str:
    names = {int: "an int", float: "a float", bool: "a bool (true, false, 1, 0, yes, no)", str: "a string",
             _NONE: "none"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


def literal(v: str):
    """'3' -> 3, '1e-3' -> 0.001, 'true' -> True, 'none' -> None, else the string."""
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v


def coerce_value(v, types: tuple[type, ...] | None, what: str):
    """``v`` as one of ``types`` (a string from the command line is parsed; ints are refused a
    fractional value, floats take ints, booleans take true/false/1/0/yes/no); with ``types``
    None, a string is read as a literal and anything else kept."""
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


@functools.cache
def config_types(which: str) -> dict[str, tuple[type, ...] | None]:
    """Field -> types of ``TrainConfig`` (``which="train"``) or ``ModelConfig`` (``"backbone"``)."""
    if which == "train":
        from .train.config import TrainConfig as cls
    else:
        from .models.backbones import ModelConfig as cls
    return {f.name: (None if (t := simple_types(f.type)) is None else t + _EXTRA_TYPES.get(f.name, ()))
            for f in dataclasses.fields(cls)}


@functools.cache
def execution_keys() -> frozenset[str]:
    """Trainer fields that say how a run executes, not what it computes: those ``TrainConfig.as_dict``
    leaves out (e.g. ``step_mode``). The spec keeps them (the trainer needs them, ``spec_json``
    records them), but they are not hashed and not hyperparameters (``hparams_json``)."""
    from .train.config import TrainConfig
    cfg = TrainConfig()
    return frozenset(dataclasses.asdict(cfg)) - frozenset(cfg.as_dict())


def train_keys() -> list[str]:
    return list(config_types("train"))


def backbone_keys() -> list[str]:
    return list(config_types("backbone"))


# -- the mechanism's knobs ----------------------------------------------------------------------

def mixer_params(model: str) -> tuple[dict[str, inspect.Parameter], bool]:
    """The named knobs of a mechanism's constructor (not the width, heads, layer index, ``l_max``
    or the first positional parameter) and whether it also takes ``**kwargs``."""
    params = constructor_params(get_mixer(model).impl)
    anykw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    out = {n: p for i, (n, p) in enumerate(params.items())
           if p.kind in named and n not in _NOT_KNOBS and not (i == 0 and p.kind == p.POSITIONAL_OR_KEYWORD)}
    return out, anykw


def _param_types(p: inspect.Parameter) -> tuple[type, ...] | None:
    t = simple_types(p.annotation)
    if t is None and p.default is not p.empty and p.default is not None:
        t = simple_types(type(p.default))
    if t is not None and p.default is None and _NONE not in t:
        t = (*t, _NONE)
    return t


def mixer_knob_types(model: str) -> dict[str, tuple[type, ...] | None]:
    """Each named constructor parameter's types: its annotation, else the type of its default."""
    return {n: _param_types(p) for n, p in constructor_params(get_mixer(model).impl).items()}


def _simple_value(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def mixer_defaults(model: str) -> dict[str, Any]:
    """Every named knob's default (those of a plain type: None, bool, int, float, str)."""
    named, _ = mixer_params(model)
    return {n: p.default for n, p in named.items() if p.default is not p.empty and _simple_value(p.default)}


def _allowed_mixer_keys(model: str) -> set[str] | None:
    """The knob names the mechanism accepts (None: any, it takes ``**kwargs``)."""
    named, anykw = mixer_params(model)
    if anykw:
        return None
    keys = set(named)
    if "l_max" in constructor_params(get_mixer(model).impl):
        keys.add("l_max")       # the harness passes the sequence length; a user may set it
    return keys


def every_hyperparameter(model: str) -> list[str]:
    return sorted(set(_allowed_mixer_keys(model) or ()) | set(train_keys()) | set(backbone_keys()))


# -- the spec -------------------------------------------------------------------------------------

def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class RunSpec:
    """Everything one run (one seed) depends on, typed and resolved. Build it with :func:`build`."""
    task: str
    task_knobs: Mapping[str, Any]
    model: str                              # the mechanism
    mixer_knobs: Mapping[str, Any]          # every named constructor knob: given, else the default
    backbone: Mapping[str, Any]             # ModelConfig fields (recipe applied)
    train: Mapping[str, Any]                # TrainConfig fields
    recipe: str = "zoology"
    seed: int = 0
    task_version: int = 1
    task_preset: str | None = None          # how the knobs were named (a label: not hashed)
    allow_noncausal: bool = False           # the causality gate was waived (not hashed)

    def __post_init__(self):
        for name in ("task_knobs", "mixer_knobs", "backbone", "train"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    def __hash__(self) -> int:
        return hash(self.hash)

    # -- serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: the shape of ``spec_json`` and of a run spec file."""
        return {"spec_version": SPEC_VERSION, "task": self.task, "task_version": self.task_version,
                "task_preset": self.task_preset, "task_knobs": dict(self.task_knobs), "model": self.model,
                "mixer_knobs": dict(self.mixer_knobs), "backbone": dict(self.backbone), "train": dict(self.train),
                "recipe": self.recipe, "seed": self.seed, "allow_noncausal": self.allow_noncausal}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    def _content(self, *leave_out: str) -> str:
        d = {k: v for k, v in self.to_dict().items() if k not in (*_NOT_HASHED, *leave_out)}
        d["train"] = {k: v for k, v in d["train"].items() if k not in execution_keys()}
        bb = d["backbone"]
        if bb.get("mlp", "none") != "none":
            # the MLP's inner width is derived (models.backbones.mlp_hidden), not a field: hash it, so that a
            # change of the rule (SwiGLU's went from 341 to MAD's 352 at width 128) is a different run
            from .models.backbones import mlp_hidden
            d["backbone"] = {**bb, "mlp_hidden": mlp_hidden(int(bb["d_model"]), bb["mlp"], float(bb["mlp_mult"]))}
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def hash(self) -> str:
        """A stable content hash: the same for the same task, knobs, mechanism, backbone, trainer,
        recipe and seed, whatever the preset the knobs came from (and however the run executes:
        :func:`execution_keys` are left out)."""
        return self._content()

    @property
    def config_hash(self) -> str:
        """:attr:`hash` without the seed: the seeds of one configuration share it."""
        return self._content("seed")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "run spec") -> RunSpec:
        """Rebuild (and so validate) a spec from :meth:`to_dict`'s shape, e.g. a row's ``spec_json``
        or a spec file; any section may be partial (the rest takes its defaults)."""
        args = from_mapping(d, where=where)
        for k in ("task", "model"):
            if args[k] is None:
                raise UsageError(f"{where}: no {k!r}; allowed: a registered {'task' if k == 'task' else 'mechanism'}")
        return build(**args, label=where)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        """The spec of a row's ``spec_json``, rebuilt and validated (a rerun of that row)."""
        return cls.from_dict(json.loads(text), where="spec_json")

    # -- views of it
    def hparams(self) -> dict[str, Any]:
        """The flat hyperparameter dict (as ``--hp`` addresses it: a trainer key before a backbone
        key before a mechanism knob of the same name)."""
        return {**self.mixer_knobs, **self.backbone,
                **{k: v for k, v in self.train.items() if k not in execution_keys()}}

    def train_config(self):
        from .train.config import TrainConfig
        return TrainConfig(**self.train)

    def model_config(self):
        from .models.backbones import ModelConfig
        return ModelConfig(**self.backbone)

    def make_task(self):
        return get_task(self.task).from_knobs(dict(self.task_knobs))

    def with_seed(self, seed: int) -> RunSpec:
        return dataclasses.replace(self, seed=int(seed))

    def with_hparams(self, hparams: Mapping[str, Any], *, label: str = "hparams") -> RunSpec:
        """This spec with flat hyperparameters (e.g. a sweep trial's sampled values) set, validated."""
        return build(self.task, self.model, knobs=dict(self.task_knobs), preset=self.task_preset,
                     train=dict(self.train), backbone=dict(self.backbone), mixer=dict(self.mixer_knobs),
                     hparams=dict(hparams), recipe=self.recipe, seed=self.seed,
                     allow_noncausal=self.allow_noncausal, label=label)

    @property
    def setting(self) -> str:
        """The task setting's label (:func:`setting_label`)."""
        return setting_label(self.task, self.task_knobs)


def _section_of(key: str) -> str:
    """Where a bare hyperparameter goes: a trainer key, else a backbone key, else a mechanism knob."""
    return "train" if key in config_types("train") else "backbone" if key in config_types("backbone") else "mixer"


def check_name(model: str, section: str, key: str) -> None:
    """A UsageError unless ``key`` is a name of ``section`` (train, backbone, mixer) for ``model``."""
    if section in ("train", "backbone"):
        known = config_types(section)
        if key not in known:
            raise UsageError(f"unknown {section} key {key!r}; allowed: {', '.join(sorted(known))}")
        return
    allowed = _allowed_mixer_keys(model)
    if allowed is not None and key not in allowed:
        raise UsageError(f"unknown hyperparameter {key!r} for {model}; allowed: {', '.join(every_hyperparameter(model))}")


def typed(model: str, section: str, key: str, value, what: str):
    """``value`` as the declared type of ``key`` in ``section`` (``what`` names it in the error)."""
    types = config_types(section).get(key) if section in ("train", "backbone") else mixer_knob_types(model).get(key)
    return coerce_value(value, types, what)


def build(task: str, model: str, *, knobs: Mapping[str, Any] | None = None, preset: str | None = None,
          hparams: Mapping[str, Any] | None = None, train: Mapping[str, Any] | None = None,
          backbone: Mapping[str, Any] | None = None, mixer: Mapping[str, Any] | None = None,
          recipe: str = "zoology", seed: int = 0, allow_noncausal: bool = False,
          label: str = "hparams") -> RunSpec:
    """Validate input and resolve it into a :class:`RunSpec`.

    ``knobs``: task knobs (over ``preset``); ``hparams``: flat hyperparameters (trainer key, else
    backbone key, else mechanism knob); ``train``, ``backbone``, ``mixer``: per section (flat keys
    win over them). ``label`` prefixes error messages (``--hp``). Raises UsageError, one line.
    """
    from .models.backbones import RECIPES, ModelConfig
    from .train.config import TrainConfig
    t = get_task(task).from_knobs(dict(knobs or {}), preset)
    get_mixer(model)
    given: list[tuple[str, str, Any, str]] = []       # (section, key, value, how it is named in errors)
    for sec, d in (("train", train), ("backbone", backbone), ("mixer", mixer)):
        given += [(sec, k, v, f"{label} {sec}.{k}") for k, v in (d or {}).items()]
    given += [(_section_of(k), k, v, f"{label} {k}") for k, v in (hparams or {}).items()]
    for sec, k, _, _ in given:      # names first, then values: an unknown name is the clearer error
        check_name(model, sec, k)
    sections: dict[str, dict[str, Any]] = {"train": {}, "backbone": {}, "mixer": {}}
    for sec, k, v, what in given:
        sections[sec][k] = typed(model, sec, k, v, what)
    if recipe not in RECIPES:
        raise UsageError(f"unknown recipe {recipe!r}; allowed: {', '.join(sorted(RECIPES))}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise UsageError(f"seed={seed!r}: not an integer >= 0")
    tcfg = TrainConfig(**sections["train"])
    mcfg = ModelConfig(**{**RECIPES[recipe], **sections["backbone"]})
    return RunSpec(task=t.name, task_knobs=t.knobs(), model=model,
                   mixer_knobs={**mixer_defaults(model), **sections["mixer"]},
                   backbone=mcfg.as_dict(), train=dataclasses.asdict(tcfg), recipe=recipe, seed=int(seed),
                   task_version=int(t.version), task_preset=preset, allow_noncausal=bool(allow_noncausal))


SPEC_KEYS = ("spec_version", "task", "task_version", "task_preset", "task_knobs", "model", "mixer_knobs",
             "backbone", "train", "recipe", "seed", "allow_noncausal")


def from_mapping(d: Mapping[str, Any], *, where: str = "run spec") -> dict[str, Any]:
    """The arguments of :func:`build` from a dict of :meth:`RunSpec.to_dict`'s shape (a row's
    ``spec_json``, a run spec file); every key but ``task`` and ``model`` may be left out."""
    if not isinstance(d, Mapping):
        raise UsageError(f"{where} must be a table with keys among {', '.join(SPEC_KEYS)}")
    for k in d:
        if k not in SPEC_KEYS:
            raise UsageError(f"{where}: unknown key {k!r}; allowed: {', '.join(SPEC_KEYS)}")
    for k in ("task_knobs", "mixer_knobs", "backbone", "train"):
        if not isinstance(d.get(k, {}), Mapping):
            raise UsageError(f"{where}: {k} must be a table")
    if d.get("spec_version", SPEC_VERSION) != SPEC_VERSION:
        raise UsageError(f"{where}: spec_version {d['spec_version']!r}; allowed: {SPEC_VERSION}")
    out = dict(task=d.get("task"), model=d.get("model"), knobs=dict(d.get("task_knobs", {})),
               preset=d.get("task_preset"), train=dict(d.get("train", {})), backbone=dict(d.get("backbone", {})),
               mixer=dict(d.get("mixer_knobs", {})), recipe=d.get("recipe", "zoology"), seed=d.get("seed", 0),
               allow_noncausal=bool(d.get("allow_noncausal", False)))
    if out["task"] is not None and d.get("task_version") is not None \
            and d["task_version"] != get_task(out["task"]).version:
        raise UsageError(f"{where}: task {out['task']!r} version {d['task_version']!r}; allowed: "
                         f"{get_task(out['task']).version} (what this mixzoo generates)")
    return out


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """A run spec file (``.toml`` or ``.json``, the shape of ``spec_json``) as a dict."""
    import tomllib
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"run spec file {str(path)!r} not found; allowed: a .toml or .json file")
    try:
        text = p.read_text()
        return json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"run spec file {str(path)!r} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: "
                         f"{str(e).splitlines()[0]}") from None


# -- KEY=VALUE, one syntax ---------------------------------------------------------------------

@dataclass
class Assignments:
    """``KEY=VALUE`` items from the command line, each sorted into a section of the spec (``task``,
    ``hparams`` for a bare hyperparameter, ``train``, ``backbone``, ``mixer``), with the flag and the
    text that gave it (to name two that disagree)."""
    items: list[tuple[str, str, Any, str, str]] = dataclasses.field(default_factory=list)

    def add(self, section: str, key: str, value: Any, flag: str, origin: str) -> None:
        self.items.append((section, key, value, flag, origin))

    def resolve(self, model: str) -> dict[str, dict[str, Any]]:
        """The typed sections ``task`` (text: the task types it), ``train``, ``backbone``, ``mixer``.
        Unknown names, then bad values, then two items of one key that disagree once typed
        (``--steps 1`` and ``--hp steps=7``) are UsageErrors."""
        placed = [(_section_of(k) if sec == "hparams" else sec, k, v, flag, origin)
                  for sec, k, v, flag, origin in self.items]
        for sec, k, _, _, _ in placed:
            if sec != "task":
                check_name(model, sec, k)
        out: dict[str, dict[str, Any]] = {"task": {}, "train": {}, "backbone": {}, "mixer": {}}
        first: dict[tuple[str, str], str] = {}
        for sec, k, v, flag, origin in placed:
            val = literal(v) if sec == "task" and isinstance(v, str) else v
            if sec != "task":
                val = typed(model, sec, k, v, f"{flag} {k}")
            if k in out[sec] and out[sec][k] != val:
                raise UsageError(f"{first[(sec, k)]} conflicts with {origin}; give one of them")
            out[sec][k] = v if sec == "task" else val
            first.setdefault((sec, k), origin)
        return out


def parse_pair(item: str, what: str) -> tuple[str, str]:
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise UsageError(f"{what} {item!r} is not KEY=VALUE")
    k, v = item.split("=", 1)
    return k.strip(), v.strip()


def assign(a: Assignments, task: str, model: str, items: list[str] | None, flag: str, *,
           bare: str = "any") -> Assignments:
    """Sort ``KEY=VALUE`` items into ``a``. A qualified key (``train.lr``) goes to its section; a bare
    one to the task when it names a task knob (``bare="any"``, as ``--set``), else to the flat
    hyperparameters (``bare="hp"``, as ``--hp``: never the task), or to the mechanism's knobs
    (``bare="mixer"``, as ``NAME:K=V``). Values stay text until :meth:`Assignments.resolve`."""
    cls = get_task(task)
    task_knobs = {f.name for f in cls.knob_fields()}
    for it in items or []:
        k, v = parse_pair(it, flag)
        head, _, rest = k.partition(".")
        if rest and head in SECTION_ALIASES:
            a.add(SECTION_ALIASES[head], rest, v, flag, f"{flag} {it}")
        elif bare == "mixer":
            a.add("mixer", k, v, flag, f"{flag} {it}")
        elif bare == "any" and k in task_knobs:
            a.add("task", k, v, flag, f"{flag} {it}")
        elif bare == "any" and _allowed_mixer_keys(model) is not None and k not in every_hyperparameter(model):
            # neither a task knob nor a hyperparameter: name both kinds
            raise UsageError(f"{cls.name}: unknown knob {k!r}; allowed: {', '.join(sorted(task_knobs))} "
                             f"(task knobs), or a hyperparameter: {', '.join(every_hyperparameter(model))}")
        elif bare == "any" and k not in every_hyperparameter(model):
            a.add("task", k, v, flag, f"{flag} {it}")      # the task's own error names its knobs
        else:
            a.add("hparams", k, v, flag, f"{flag} {it}")
    return a


# -- the task setting's label ------------------------------------------------------------------

LABEL_KNOBS = 3      # a setting's label: the task's first knobs, then any other knob off its default


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def setting_label(task: str, knobs: Mapping[str, Any]) -> str:
    """One label per task setting, the same text everywhere (rows, show, export, report, sweeps,
    compare): the task's first three knobs, then every other knob that differs from its default,
    in the task's declaration order (``V=8192, L=64, kv=4``; ``..., filler=zero``)."""
    try:
        fields = get_task(task).knob_fields()
    except UsageError:
        return ", ".join(f"{k}={_fmt(v)}" for k, v in knobs.items()) or "-"
    out = []
    for i, f in enumerate(fields):
        if f.name not in knobs:
            continue
        v = knobs[f.name]
        if i < LABEL_KNOBS or v != f.default:
            out.append(f"{f.name}={_fmt(v)}")
    return ", ".join(out) or "-"


# -- the columns the registry knows --------------------------------------------------------------

def _merge_types(a: tuple[type, ...] | None, b: tuple[type, ...] | None) -> tuple[type, ...] | None:
    if a is None or b is None:
        return None
    sa, sb = set(a) - {_NONE}, set(b) - {_NONE}
    if sa == sb:
        return a
    if sa | sb <= {int, float}:
        return (float, _NONE)
    return None


def known_columns() -> dict[str, tuple[type, ...]]:
    """Every typed column the registry declares: ``knob_<k>`` for every registered task's knobs and
    ``hp_<k>`` for every trainer and backbone key and every registered mechanism's knobs (the
    leaderboard writes them all, nullable, in every file). A name declared with two types that do
    not widen to one (int and float do) is left out: its column is typed by its values."""
    from .registry import mixers, tasks
    cols: dict[str, tuple[type, ...] | None] = {}

    def put(name: str, t: tuple[type, ...] | None) -> None:
        cols[name] = t if name not in cols else _merge_types(cols[name], t)
    for cls in tasks().values():
        for f in cls.knob_fields():
            put(f"knob_{f.name}", simple_types(type(f.default)))
    for which in ("train", "backbone"):
        for k, t in config_types(which).items():
            if k not in execution_keys():
                put(f"hp_{k}", t)
    for name in mixers():
        try:
            named, _ = mixer_params(name)
        except Exception:       # a plugin whose signature cannot be read
            continue
        for k, p in named.items():
            if k in config_types("train") or k in config_types("backbone"):
                continue        # the flat name is the trainer's/backbone's (hp_short_conv: the backbone's)
            put(f"hp_{k}", _param_types(p))
    return {k: t for k, t in cols.items() if t is not None}


__all__ = ["Assignments", "RunSpec", "SPEC_VERSION", "assign", "build", "check_name", "coerce_value",
           "config_types", "from_mapping", "known_columns", "literal", "mixer_defaults", "mixer_knob_types",
           "mixer_params", "read_spec_file", "setting_label", "simple_types", "typed"]
