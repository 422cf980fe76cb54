"""Registries of mechanisms (mixers) and tasks, and plugin loading.

Built-ins register themselves when their module is imported; every module of
``mixzoo.models`` and ``mixzoo.tasks`` whose name does not start with ``_`` is
imported on first use, so adding a mechanism or a task is one file and one decorator.
Outside code registers through the entry-point group ``mixzoo.plugins`` or a file
passed with ``--plugin path.py``.
"""
from __future__ import annotations

import importlib
import importlib.util
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


_MIXERS: dict[str, MixerSpec] = {}
_TASKS: dict[str, type] = {}
_loaded_builtins = False
_loaded_entry_points = False


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
        doc = description or (cls.__doc__ or "").strip().splitlines()[0:1]
        desc = doc if isinstance(doc, str) else (doc[0] if doc else "")
        _MIXERS[name] = MixerSpec(name, cls, dict(search_space or {}), core,
                                  dict(core_grid or {}), desc,
                                  source=getattr(cls, "__module__", "?"))
        cls.mixer_name = name
        if core is not None and not hasattr(cls, "core"):
            cls.core = staticmethod(core)
        return cls
    return deco


def register_task(name: str):
    """Class decorator: register a task class under ``name``."""
    def deco(cls):
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
    """Import a Python file so that its decorators register mechanisms or tasks."""
    p = Path(path)
    if not p.is_file() or p.suffix != ".py":
        raise UsageError(f"plugin file {str(path)!r} not found or not a .py file")
    mod_name = f"mixzoo_plugin_{p.stem}"
    if mod_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(mod_name, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[mod_name]
        raise UsageError(f"plugin file {str(path)!r} failed to import: {type(e).__name__}: {e}")


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
