"""Sweep workers spread over GPUs round-robin, shown with fake device counts on the CPU: the
CUDA_VISIBLE_DEVICES each worker is started with, the host's own restriction respected, and the
GPU each row trained on recorded as the host names it (the ``gpu`` column)."""
from __future__ import annotations

import subprocess

import pytest
import torch
from test_sweeps_helpers import rows, write_spec

from mixzoo.cli import main
from mixzoo.sweeps import run as sweep_run
from mixzoo.train.config import physical_gpu


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return set_count


@pytest.mark.parametrize("n,want", [(4, ["0", "1", "2", "3", "0", "1", "2"]), (2, ["0", "1", "0"]),
                                    (1, [None, None]), (0, [None])])
def test_round_robin_over_the_gpus(gpus, n, want):
    gpus(n)
    got = [sweep_run._gpu_env("auto", i).get("CUDA_VISIBLE_DEVICES") for i in range(len(want))]
    assert got == want


def test_the_hosts_own_restriction_is_kept(gpus, monkeypatch):
    gpus(8)                                         # the host has 8; this job may use 2 and 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [sweep_run._gpu_env(None, i)["CUDA_VISIBLE_DEVICES"] for i in range(4)] == ["2", "3", "2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa, GPU-bb")
    assert [sweep_run._gpu_env("cuda", i)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["GPU-aa", "GPU-bb", "GPU-aa"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert sweep_run._gpu_env("auto", 1) == {}      # one GPU: nothing to spread
    assert sweep_run._gpu_env("cpu", 1) == {} and sweep_run._gpu_env("cuda:1", 0) == {}


def test_physical_gpu_names_the_hosts_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert physical_gpu("cuda:1") == "3" and physical_gpu("cuda:0") == "2"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_gpu("cuda:1") == "1"
    assert physical_gpu("cpu") is None


def test_sweep_starts_each_worker_on_its_gpu(tmp_path, gpus, monkeypatch):
    """A sweep of 3 workers on a host with 2 (fake) GPUs: workers 0, 1, 2 get GPUs 0, 1, 0; each row
    records the GPU (none here: the workers train on the CPU, as this machine has no GPU)."""
    gpus(2)
    seen = []
    real = subprocess.Popen

    def spy(argv, *a, env=None, **k):
        if "--worker-index" in argv:
            seen.append((int(argv[argv.index("--worker-index") + 1]), (env or {}).get("CUDA_VISIBLE_DEVICES")))
        return real(argv, *a, env=env, **k)
    monkeypatch.setattr(sweep_run.subprocess, "Popen", spy)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = write_spec(tmp_path / "g.toml", name="t-gpus", models=["softmax"], trials=3, seeds=1,
                      extra='[pruner]\nkind = "none"\n')
    res = tmp_path / "res"
    assert main(["--results", str(res), "sweep", str(spec), "--workers", "3"]) == 0
    assert sorted(seen) == [(0, "0"), (1, "1"), (2, "0")]
    lb = rows(res)
    assert lb and all("gpu" in r and r["gpu"] is None for r in lb)
