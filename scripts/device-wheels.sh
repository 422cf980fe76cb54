#!/bin/bash
# What a GPU call carries that the lent machine lacks, made on this machine (network, no GPU):
#   .whl/            the pure-Python wheels of ../shared/device/fetch-wheels.sh (fla, optuna and their deps)
#   .gpu/mamba-whl/  mamba-ssm built from its sdist without its CUDA extensions (MAMBA_SKIP_CUDA_BUILD):
#                    a py3-none-any wheel holding the Triton SSD kernels (mamba_chunk_scan_combined) that
#                    mixzoo's Mamba-2 takes on a GPU (models.mamba.ssd_combined); the compiled selective scan
#                    and causal-conv1d are not in it (scripts/build-mamba-ssm.sh builds those on the GPU)
# scripts/gpu-zoo.sh installs both. Usage: bash scripts/device-wheels.sh   (about 10 s)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
bash ../shared/device/fetch-wheels.sh .whl > /dev/null
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
if ! ls .gpu/mamba-whl/mamba_ssm-*.whl > /dev/null 2>&1; then
  tmp=$(mktemp -d)
  MAMBA_SKIP_CUDA_BUILD=TRUE "$py" -m pip download -q --no-deps --no-binary :all: --no-build-isolation mamba-ssm==2.3.2.post1 -d "$tmp" 2>&1 \
    | grep -v "WARNING: Location" || true
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE "$py" -m pip wheel -q --no-deps --no-build-isolation \
    "$tmp"/mamba_ssm-2.3.2.post1.tar.gz -w .gpu/mamba-whl 2>&1 | grep -v "WARNING: Location" || true
  rm -rf "$tmp"
fi
ls .gpu/mamba-whl/mamba_ssm-*-py3-none-any.whl > /dev/null || { echo "mamba-ssm's wheel was not built"; exit 1; }
ls -la .whl .gpu/mamba-whl
