#!/bin/bash
# Build mamba-ssm and causal-conv1d (Mamba-1's CUDA kernels) from their PyPI source packages, for
# sm_90 (H100/H200) alone, on a GPU machine that has nvcc and a CUDA torch but no network.
#   bash scripts/build-mamba-ssm.sh SDIST_DIR OUT_DIR
# SDIST_DIR holds causal_conv1d-*.tar.gz and mamba_ssm-*.tar.gz, fetched beforehand on a machine
# with network:  MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE pip download --no-deps \
#   --no-build-isolation --no-binary :all: mamba-ssm==2.3.2.post1 causal-conv1d==1.7.0 -d SDIST_DIR
# Both packages' setup.py compile for ten architectures; the build keeps only sm_90 (their
# -gencode lines are replaced), which is what makes it fit a machine's lease. Wheels land in
# OUT_DIR/wheels; build times and wheel sizes are printed and written to OUT_DIR/build.txt.
# ONLY="mamba_ssm" builds that one alone (causal-conv1d's wheel already installed).
set -euo pipefail
src=$(cd "${1:?sdist folder}" && pwd)
out=$(mkdir -p "${2:?output folder}" && cd "$2" && pwd)
work=$(mktemp -d)
export MAX_JOBS=${MAX_JOBS:-$(nproc)} NVCC_THREADS=${NVCC_THREADS:-2} TORCH_CUDA_ARCH_LIST=9.0
export CAUSAL_CONV1D_FORCE_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE
report="$out/build.txt"
: > "$report"
for pkg in ${ONLY:-causal_conv1d mamba_ssm}; do     # ONLY=mamba_ssm when causal-conv1d's wheel is at hand
  tarball=$(ls "$src"/${pkg}-*.tar.gz | head -n 1)
  tar xzf "$tarball" -C "$work"
  dir=$(ls -d "$work"/${pkg}-*/ | head -n 1)
  python3 - "$dir/setup.py" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
# every per-architecture flag becomes a no-op, then sm_90 alone is added where the list is made
s = re.sub(r'cc_flag\.append\("-gencode"\)', "pass", s)
s = re.sub(r'cc_flag\.append\("arch=compute_\d+,code=sm_\d+"\)', "pass", s)
s, n = re.subn(r'^(\s*)cc_flag = \[\]\s*$', r'\1cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]', s, count=1,
               flags=re.M)
assert n == 1, "cc_flag list not found"
open(p, "w").write(s)
PY
  t0=$(date +%s)
  python3 -m pip wheel -q --no-build-isolation --no-deps -w "$out/wheels" "$dir" > "$out/build-$pkg.log" 2>&1 \
    || { tail -40 "$out/build-$pkg.log"; exit 1; }
  t1=$(date +%s)
  whl=$(ls "$out"/wheels/${pkg}-*.whl | head -n 1)
  echo "$pkg: built in $((t1 - t0)) s with MAX_JOBS=$MAX_JOBS; $(basename "$whl") $(stat -c %s "$whl") bytes" | tee -a "$report"
  # mamba-ssm's build imports causal_conv1d: install each wheel as soon as it exists
  python3 -m pip install -q --no-index --no-deps --target "${MIXZOO_SITE:-/tmp/site}" "$whl"
done
rm -rf "$work"
