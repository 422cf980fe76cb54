"""Task generators: one file a family. See :mod:`mixzoo.tasks.base` for the contract."""
from .base import IGNORE, SPLITS, Batch, Metric, Task, generator, knob, leakage, seed_for

__all__ = ["IGNORE", "SPLITS", "Batch", "Metric", "Task", "generator", "knob", "leakage",
           "seed_for"]
