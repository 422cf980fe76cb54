#!/usr/bin/env bash
# Create and fill the virtual environment (default .venv) when it is missing or stale.
# A machine without a GPU gets the local CPU torch build (pinned by constraints-cpu.txt);
# a GPU host whose python3 already has a CUDA torch keeps it (the venv sees system packages).
set -euo pipefail
VENV=${VENV:-.venv}
STAMP="$VENV/.mixzoo-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt constraints-cpu.txt ]; then
  exit 0
fi
PY=${PYTHON:-python3}
has_cuda_torch() {
  "$PY" - <<'PYEOF' 2>/dev/null
import sys
try:
    import torch
except Exception:
    sys.exit(1)
sys.exit(0 if (torch.version.cuda and torch.cuda.is_available()) else 1)
PYEOF
}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if has_cuda_torch; then
  echo "bootstrap: GPU host with a CUDA torch: keeping it"
  [ -d "$VENV" ] || "$PY" -m venv --system-site-packages "$VENV"
  "$VENV/bin/pip" install -q -e ".[dev]"
else
  echo "bootstrap: CPU machine: installing the CPU torch build into $VENV"
  [ -d "$VENV" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q -c constraints-cpu.txt torch==2.13.0
  "$VENV/bin/pip" install -q -c constraints-cpu.txt -e ".[dev]"
fi
touch "$STAMP"
