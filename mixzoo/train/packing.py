"""How many training processes to pack onto one GPU.

Small models are launch-bound: one process leaves the GPU idle between kernel launches, and
several processes on one GPU raise the aggregate rate (measured on an H200: a width-64, batch-64,
length-128 softmax model ran 210 steps/s alone and 480 in all with four processes, while a
width-128, batch-256, length-256 model was already saturated by one). The policy reads the work
per step, batch x length x width, and packs 4 below 2^21, 2 below 2^23, else 1.
"""
from __future__ import annotations

from typing import Any

# models per stacked step where a sweep leaves ``stack = "auto"`` on a GPU: K x B x T x D up to
# 16 x MAD's baseline (width 128, batch 128, length 128), where K = 16 was the fastest step mode
# measured for every mechanism (README, "Step modes at MAD's baseline shape")
STACK_MAX, STACK_WORK = 16, 16 * 128 * 128 * 128


def stack_per_step(batch_size: int, seq_len: int, d_model: int) -> int:
    """K for ``stack = "auto"`` on a GPU: 16 at MAD's baseline shape, fewer for larger runs."""
    work = max(1, int(batch_size) * int(seq_len) * int(d_model))
    return max(1, min(STACK_MAX, STACK_WORK // work))


def procs_per_gpu(batch_size: int, seq_len: int, d_model: int) -> int:
    work = int(batch_size) * int(seq_len) * int(d_model)
    if work < 1 << 21:
        return 4
    if work < 1 << 23:
        return 2
    return 1


def auto_workers(units_hparams: list[tuple[dict[str, Any], int]], n_gpus: int) -> int:
    """Workers for a sweep: GPUs x the packing of its largest run (1 on a machine without GPUs).

    ``units_hparams``: (flat hyperparameters, sequence length) of each unit of the sweep.
    """
    if n_gpus < 1:
        return 1
    from ..models.backbones import ModelConfig
    from .config import TrainConfig
    dflt_b, dflt_d = TrainConfig().batch_size, ModelConfig().d_model
    per = min((procs_per_gpu(hp.get("batch_size", dflt_b), L, hp.get("d_model", dflt_d))
               for hp, L in units_hparams), default=1)
    return n_gpus * per
