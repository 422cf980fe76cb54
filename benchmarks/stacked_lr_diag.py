"""Stacked against separate training, per learning rate, with every validation's training loss: the
numbers behind tests/gpu/test_throughput_gpu.py::test_stacked_matches_separate_runs at the learning
rates it used before (1e-3, 2e-3, 3e-3, 5e-3), for one mechanism, one JSON line on stdout with the
MIXZOO_* switches in force and the backbone kernels each side ran. Run it under different switches
(MIXZOO_CONV=torch, MIXZOO_SWIGLU=torch, MIXZOO_RMSNORM=torch, ...) to tell a stacking error (the same
difference under every choice) from a run that is sensitive to rounding (a spike that moves).

    python benchmarks/stacked_lr_diag.py MIXER        (needs CUDA; the separate runs on the kernels)
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
os.environ["MIXZOO_EAGER_KERNELS"] = "1"


def main(mixer: str) -> None:
    from test_throughput_gpu import _setup

    from mixzoo import kernels
    from mixzoo.train import train
    from mixzoo.train.stacked import train_stacked
    task, mcfg, data, cfg, TrainConfig = _setup()
    lrs, seeds = (1e-3, 2e-3, 3e-3, 5e-3), [0, 1, 2, 3]
    cfgs = [TrainConfig(**{**cfg, "lr": lr}, step_mode="stacked") for lr in lrs]
    kernels.RAN.clear()
    stacked = train_stacked(task, mixer, {}, mcfg, cfgs, seeds, device="cuda", data=data)
    ran_stacked = sorted(kernels.RAN)
    runs = []
    for c, s, r in zip(cfgs, seeds, stacked):
        kernels.RAN.clear()
        alone = train(task, mixer, {}, mcfg, TrainConfig(**{**cfg, "lr": c.lr}), seed=s, device="cuda", data=data)
        runs.append({"lr": c.lr, "alone": [round(h["train_loss"], 5) for h in alone.history],
                     "stacked": [round(h["train_loss"], 5) for h in r.history], "ran_alone": sorted(kernels.RAN)})
    print(json.dumps({"mixer": mixer, "env": {k: v for k, v in os.environ.items() if k.startswith("MIXZOO_")},
                      "ran_stacked": ran_stacked, "runs": runs}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "hyena")
