"""Training configuration and the result of one run."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainConfig:
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_frac: float = 0.05
    min_lr_frac: float = 0.0          # cosine floor, as a fraction of lr
    grad_clip: float = 1.0
    eval_every: int = 200             # steps between validation passes (and log lines)
    eval_batch_size: int = 256
    early_stop: float | None = None   # stop once the validation metric passes this
    precision: str = "auto"           # "auto": bf16-mixed on CUDA, 32 on CPU
    compile: str = "off"              # "off" | "default" | "reduce-overhead" (CUDA graphs) | "max-autotune"
    sparse_head: bool = True          # token tasks: vocabulary head only at supervised positions in training
    optimizer: str = "adamw"          # "adamw" | "muon" (Muon for hidden matrices, AdamW for the rest; train/optim.py)
    schedule: str = "cosine"          # "cosine" | "wsd" (warmup-stable-decay)
    decay_frac: float = 0.2           # wsd: fraction of the steps in the final linear decay
    wd_anneal_gamma: float | None = None   # weight decay x (1 - t)^gamma in the decay phase (Parallax: 2)
    muon_lr: float | None = None      # Muon's learning rate (default: lr; Muon's update is RMS-matched to AdamW)
    muon_momentum: float = 0.95
    n_train: int | None = None        # examples per split; None = the task's default
    n_val: int | None = None
    n_test: int | None = None
    # how a step runs, not what it computes (the results are the same up to floating-point
    # reordering): "eager" (Lightning) | "graphed" (one CUDA graph a step, train/graphed.py) |
    # "stacked" / "stacked+graphed" (several runs as one batched model, train/stacked.py)
    step_mode: str = "eager"

    def __post_init__(self):
        from ..errors import UsageError
        if self.compile is True or self.compile is False:       # accept booleans from specs
            self.compile = "default" if self.compile else "off"
        modes = ("off", "default", "reduce-overhead", "max-autotune")
        if self.compile not in modes:
            raise UsageError(f"compile={self.compile!r}; allowed: {', '.join(modes)}")
        for name in ("steps", "batch_size", "eval_every", "eval_batch_size"):
            if int(getattr(self, name)) < 1:
                raise UsageError(f"{name}={getattr(self, name)!r} must be >= 1")
        if not self.lr > 0:
            raise UsageError(f"lr={self.lr!r} must be > 0")
        for name, value, allowed in (("optimizer", self.optimizer, ("adamw", "muon")),
                                     ("schedule", self.schedule, ("cosine", "wsd"))):
            if value not in allowed:
                raise UsageError(f"{name}={value!r}; allowed: {', '.join(allowed)}")
        if not 0.0 <= float(self.decay_frac) <= 1.0:
            raise UsageError(f"decay_frac={self.decay_frac!r} must be in [0, 1]")
        if self.wd_anneal_gamma is not None and not float(self.wd_anneal_gamma) >= 0:
            raise UsageError(f"wd_anneal_gamma={self.wd_anneal_gamma!r} must be >= 0")
        if self.muon_lr is not None and not float(self.muon_lr) > 0:
            raise UsageError(f"muon_lr={self.muon_lr!r} must be > 0")
        if not 0.0 <= float(self.muon_momentum) < 1.0:
            raise UsageError(f"muon_momentum={self.muon_momentum!r} must be in [0, 1)")
        step_modes = ("eager", "graphed", "stacked", "stacked+graphed")
        if self.step_mode not in step_modes:
            raise UsageError(f"step_mode={self.step_mode!r}; allowed: {', '.join(step_modes)}")

    def as_dict(self) -> dict[str, Any]:
        # step_mode is left out: it does not change what a run computes, and a row's hparams_json
        # (which this feeds) identifies its configuration, so runs in any step mode group together
        d = asdict(self)
        d.pop("step_mode")
        return d


@dataclass
class RunResult:
    state: str                                  # COMPLETE | FAIL
    reason: str = ""
    val: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    best_step: int = 0
    wall_time_s: float = 0.0
    train_time_s: float = 0.0
    steps_per_s: float = 0.0
    tokens_per_s: float = 0.0
    peak_mem_bytes: int = 0
    params: int = 0
    state_size: int = 0
    backend: str = ""
    device_name: str = ""
    gpu: str | None = None                      # the GPU trained on, as the host names it (physical_gpu)
    kernels: str | None = None                  # mixzoo's backbone kernels that ran (mixzoo.kernels.ran)
    history: list[dict[str, float]] = field(default_factory=list)
    diagnostics: dict[str, float] = field(default_factory=dict)   # mechanism diagnostics at the last validation


def physical_gpu(dev) -> str | None:
    """The GPU a run on ``dev`` trains on, as the host names it: the entry of CUDA_VISIBLE_DEVICES
    (an index or a UUID) for the device's index, else the index itself; None off the GPU. A sweep
    worker sees one GPU through CUDA_VISIBLE_DEVICES, so its index is always 0: the host's name
    for it tells the rows of several GPUs apart."""
    import os

    import torch
    dev = torch.device(dev)
    if dev.type != "cuda":
        return None
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    ids = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return ids[idx] if idx < len(ids) else str(idx)
