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


__all__ = ["UsageError", "get_mixer", "get_task", "mixers", "register_mixer", "register_task",
           "run", "tasks"]
