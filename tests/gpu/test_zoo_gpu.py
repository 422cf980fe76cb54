"""The zoo matrix on the GPU: every mechanism and variant x task family x recipe, two learning
rates, a few hundred steps each; every cell must end COMPLETE (``mixzoo check-zoo`` exits 0).
MIXZOO_ZOO_OUT names a JSON file for the cells; MIXZOO_ZOO_WORKERS the worker processes (default 24: each of the
12 mechanisms split over two workers; on 2026-12-01 22 workers ran 216 cells within 540 s on a shared H200, GLA
the slowest)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_zoo_matrix_trains_every_cell(tmp_path):
    out = os.environ.get("MIXZOO_ZOO_OUT", str(tmp_path / "zoo.json"))
    cmd = [sys.executable, "-m", "mixzoo", "--results", str(tmp_path / "res"), "check-zoo",
           "--workers", os.environ.get("MIXZOO_ZOO_WORKERS", "24"), "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout[-20000:])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
