"""mixzoo: benchmark sequence-mixing mechanisms on synthetic tasks.

    import mixzoo
    rows = mixzoo.run("mqar", "lla", preset="demo", hparams={"steps": 200})

Register a mechanism with ``@mixzoo.register_mixer(name, search_space=...)`` and a task with
``@mixzoo.register_task(name)``.
"""
from .errors import UsageError
from .registry import get_mixer, get_task, mixers, register_mixer, register_task, tasks

__version__ = "0.1.0"


def run(*args, **kwargs):
    """See :func:`mixzoo.api.run`."""
    from .api import run as _run
    return _run(*args, **kwargs)


def load(results="mixzoo-results", **kwargs):
    """The leaderboard as a pandas DataFrame; see :func:`mixzoo.leaderboard.load`."""
    from .leaderboard import load as _load
    return _load(results, **kwargs)


def load_curves(results="mixzoo-results", **kwargs):
    """The runs' curves as a pandas DataFrame; see :func:`mixzoo.leaderboard.load_curves`."""
    from .leaderboard import load_curves as _load_curves
    return _load_curves(results, **kwargs)


__all__ = ["UsageError", "get_mixer", "get_task", "load", "load_curves", "mixers", "register_mixer",
           "register_task", "run", "tasks"]
