"""Registries of mechanisms (mixers) and tasks, and plugin loading.

Built-ins register themselves when their module is imported; every module of
``mixzoo.models`` and ``mixzoo.tasks`` whose name does not start with ``_`` is
imported on first use, so adding a mechanism or a task is one file and one decorator.
Outside code registers through the entry-point group ``mixzoo.plugins`` or a file
passed with ``--plugin path.py``. A name is registered once: a second registration under a
name already taken (a plugin reusing a built-in name, a copy of a plugin loaded beside it) is
refused with a UsageError naming where the first came from.

Constructors in zoology's style, ``__init__(self, d_model, l_max, layer_idx=None)`` with no
``num_heads``, are registered behind a thin subclass that drops the keywords the class does
not take; callers pass ``l_max`` (the sequence length) where the constructor asks for it
(:func:`build_mixer`, :func:`wants_l_max`).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError, one_of

# Modules of the two packages that hold shared machinery, not registrations.
_NOT_REGISTRATIONS = {"base", "backbones", "common", "space"}


@dataclass
class MixerSpec:
    name: str
    cls: type
    search_space: dict[str, Any] = field(default_factory=dict)
    core: Callable | None = None          # functional (q, k, v) -> o, for training-free tasks
    core_grid: dict[str, list] = field(default_factory=dict)  # the core's knobs to tune (ttr)
    description: str = ""
    source: str = "builtin"
    origin: str = ""                      # where it was registered: a module, or a plugin's file

    @property
    def impl(self) -> type:
        """The class as written (``cls`` may be the thin subclass adapting its constructor)."""
        return getattr(self.cls, "_mixzoo_impl", self.cls)


_MIXERS: dict[str, MixerSpec] = {}
_TASKS: dict[str, type] = {}
_loaded_builtins = False
_loaded_entry_points = False
_PLUGIN_FILES: dict[Path, str] = {}       # resolved plugin path -> its module name
_BUILTIN_PACKAGES = ("mixzoo.models.", "mixzoo.tasks.")


def origin_of(obj) -> str:
    """Where ``obj`` (a class) was defined: a plugin file's path, else its module's name."""
    mod_name = getattr(obj, "__module__", None) or "?"
    mod = sys.modules.get(mod_name)
    path = getattr(mod, "__file__", None)
    if mod_name.startswith("mixzoo_plugin_") and path:
        return f"plugin file {path}"
    return f"module {mod_name}"


def _same_class(a: type, b: type) -> bool:
    """The same class, or the same definition re-executed (a module reloaded)."""
    return a is b or (getattr(a, "__module__", None) == getattr(b, "__module__", 0)
                      and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", 0))


def _before_registering(cls) -> None:
    # outside code registering first would otherwise meet a built-in of the same name only when
    # the built-ins load later; load them now so that the second registration is the refused one
    if not str(getattr(cls, "__module__", "")).startswith(_BUILTIN_PACKAGES):
        load_builtins()


def _refuse_duplicate(what: str, name: str, first: str, second: str) -> None:
    raise UsageError(f"{what} {name!r} is already registered by {first}; refusing a second registration "
                     f"from {second} (pick another name)")


def constructor_params(cls) -> dict[str, inspect.Parameter]:
    """The parameters of ``cls.__init__`` after ``self`` (empty when they cannot be read)."""
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())
    except (TypeError, ValueError):
        return {}
    return {p.name: p for p in params[1:]}


def _takes_any_keyword(params: dict[str, inspect.Parameter]) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in params.values())


def _adapt(cls: type) -> type:
    """``cls``, or a thin subclass of it that drops ``num_heads`` / ``layer_idx`` when the
    constructor takes neither them nor ``**kwargs`` (zoology's mixers take no ``num_heads``)."""
    params = constructor_params(cls)
    if not params or _takes_any_keyword(params):
        return cls
    drop = tuple(n for n in ("num_heads", "layer_idx") if n not in params)
    if not drop:
        return cls

    def __init__(self, *args, **kwargs):
        for n in drop:
            kwargs.pop(n, None)
        cls.__init__(self, *args, **kwargs)
    ns = {"__init__": __init__, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
          "__doc__": cls.__doc__, "_mixzoo_impl": cls}
    return type(cls)(cls.__name__, (cls,), ns)


def wants_l_max(spec: MixerSpec) -> bool:
    """Whether the constructor names an ``l_max`` parameter (zoology's sequence length)."""
    return "l_max" in constructor_params(spec.impl)


def build_mixer(spec: MixerSpec | str, d_model: int, *, num_heads: int, layer_idx: int = 0,
                l_max: int | None = None, **knobs):
    """One layer of a mechanism, passing ``l_max`` where its constructor asks for it."""
    spec = get_mixer(spec) if isinstance(spec, str) else spec
    if l_max is not None and "l_max" not in knobs and wants_l_max(spec):
        knobs["l_max"] = int(l_max)
    return spec.cls(d_model, num_heads=num_heads, layer_idx=layer_idx, **knobs)


def register_mixer(name: str, *, search_space: dict[str, Any] | None = None,
                   core: Callable | None = None, core_grid: dict[str, list] | None = None,
                   description: str = ""):
    """Class decorator: register a sequence mixer under ``name`` with its Optuna search space.

    ``search_space`` maps a hyperparameter to ``("log", lo, hi)``, ``("float", lo, hi)``,
    ``("int", lo, hi)`` or ``("cat", [choices])``; trainer keys (lr, weight_decay, ...) and
    model keys (d_model, ...) may appear beside the mechanism's own constructor knobs.
    ``core`` is the functional map (q, k, v) -> o on (..., T, D) tensors, causal (position i
    sees keys j <= i), and ``core_grid`` the small grid of its knobs the training-free
    test-time regression tunes per setting.
    """
    def deco(cls):
        _before_registering(cls)
        prev = _MIXERS.get(name)
        if prev is not None and not _same_class(prev.impl, cls):
            _refuse_duplicate("mechanism", name, prev.origin or origin_of(prev.impl), origin_of(cls))
        doc = description or (cls.__doc__ or "").strip().splitlines()[0:1]
        desc = doc if isinstance(doc, str) else (doc[0] if doc else "")
        _MIXERS[name] = MixerSpec(name, _adapt(cls), dict(search_space or {}), core,
                                  dict(core_grid or {}), desc,
                                  source=getattr(cls, "__module__", "?"), origin=origin_of(cls))
        cls.mixer_name = name
        if core is not None and not hasattr(cls, "core"):
            cls.core = staticmethod(core)
        return cls
    return deco


def register_task(name: str):
    """Class decorator: register a task class under ``name``."""
    def deco(cls):
        _before_registering(cls)
        prev = _TASKS.get(name)
        if prev is not None and not _same_class(prev, cls):
            _refuse_duplicate("task", name, origin_of(prev), origin_of(cls))
        cls.name = name
        _TASKS[name] = cls
        return cls
    return deco


def _import_package_modules(pkg_name: str) -> None:
    pkg = importlib.import_module(pkg_name)
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.name in _NOT_REGISTRATIONS:
            continue
        importlib.import_module(f"{pkg_name}.{info.name}")


def load_builtins() -> None:
    global _loaded_builtins
    if _loaded_builtins:
        return
    _loaded_builtins = True
    _import_package_modules("mixzoo.tasks")
    _import_package_modules("mixzoo.models")
    load_entry_points()


def load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    from importlib.metadata import entry_points
    for ep in entry_points(group="mixzoo.plugins"):
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not take the harness down
            print(f"mixzoo: warning: plugin {ep.name!r} failed to load: {e}", file=sys.stderr)
            continue
        if callable(obj) and not isinstance(obj, type):
            obj()


def load_plugin_file(path: str | Path) -> None:
    """Import a Python file so that its decorators register mechanisms or tasks.

    A file already loaded in this process (the same resolved path) is not run again: its
    registrations stand. Another file registering a name already taken is refused, and what it
    registered before that is taken back.
    """
    p = Path(path)
    if not p.is_file() or p.suffix != ".py":
        raise UsageError(f"plugin file {str(path)!r} not found or not a .py file")
    key = p.resolve()
    if _PLUGIN_FILES.get(key) in sys.modules:
        return
    load_builtins()         # so that a plugin reusing a built-in name is the one refused
    mod_name = f"mixzoo_plugin_{p.stem}"
    if mod_name in sys.modules:     # another file of the same name: a module name of its own
        mod_name += "_" + hashlib.sha1(str(key).encode()).hexdigest()[:8]
    spec = importlib.util.spec_from_file_location(mod_name, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    before = (dict(_MIXERS), dict(_TASKS))
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[mod_name]
        _MIXERS.clear()
        _MIXERS.update(before[0])
        _TASKS.clear()
        _TASKS.update(before[1])
        if isinstance(e, UsageError):      # a duplicate name, or the plugin's own bad input
            raise
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
        raise UsageError(f"plugin file {str(path)!r} failed to import: {type(e).__name__}: {first}") from None
    _PLUGIN_FILES[key] = mod_name


def mixers() -> dict[str, MixerSpec]:
    load_builtins()
    return dict(sorted(_MIXERS.items()))


def tasks() -> dict[str, type]:
    load_builtins()
    return dict(sorted(_TASKS.items()))


def get_mixer(name: str) -> MixerSpec:
    load_builtins()
    if name not in _MIXERS:
        raise one_of("mechanism", name, _MIXERS)
    return _MIXERS[name]


def get_task(name: str) -> type:
    load_builtins()
    if name not in _TASKS:
        raise one_of("task", name, _TASKS)
    return _TASKS[name]
