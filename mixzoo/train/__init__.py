"""The trainer: a Lightning module over device-resident data, metrics and throughput."""
from .config import RunResult, TrainConfig

__all__ = ["RunResult", "TrainConfig", "train"]


def train(*args, **kwargs):
    from .loop import train as _train
    return _train(*args, **kwargs)
