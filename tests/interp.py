"""Running a script in Triton's interpreter with the H200's numerics (benchmarks/lla_small_ridge.py),
for the CPU tests of mixzoo's Triton kernels. The interpreter has to be on before triton is imported,
so each script runs in a fresh process; it prints ``RESULT <json>`` as its last such line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r}); sys.path.insert(0, {str(ROOT)!r})
import lla_small_ridge as L            # sets TRITON_INTERPRET=1 before triton is imported
import torch
L.emulate_gpu_numerics()               # the H200's round-to-nearest bf16 casts and bf16 products
"""


def run_interpreted(body: str, env: dict | None = None, drop: tuple[str, ...] = (), timeout: int = 600) -> dict:
    """``body`` after the prelude, in a fresh process with ``TRITON_INTERPRET=1`` (and ``env``, without
    the variables in ``drop``); its result."""
    pytest.importorskip("triton")
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update({"TRITON_INTERPRET": "1", **(env or {})})
    p = subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, text=True, env=e, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
