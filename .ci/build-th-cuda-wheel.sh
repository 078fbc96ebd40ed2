#!/usr/bin/env bash
# torch-harmonics 0.9.2 with its CUDA DISCO kernels, built on this (CPU) machine for
# the GPU machine's torch (issue 33: the zoo's FCN3 at its published size).
#
# The PyPI wheel of torch-harmonics 0.9.2 has its DISCO kernels for the CPU only and
# takes them for CUDA tensors too, so FCN3 fails on a GPU with it. A build on the GPU
# machine did not finish in one 10-minute call (docs/bench/2026-11-29-h200-
# twentyfourth). This machine has nvcc (CUDA 13.0) and PyPI's torch 2.11.0 is the
# GPU machine's build (2.11.0+cu130), so the wheel is built here, against that torch
# in a Python 3.12 virtual environment of its own, for sm_90 (H100, H200), with
# DISCO's CUDA kernels and without those of torch-harmonics' attention (FCN3 does not
# use it; they would double the build). The source comes from
# .ci/fetch-th-cuda-source.sh's folder (made first if missing: from the git
# repository TH_REPO names where GitHub cannot be reached, e.g. a local mirror of
# NVIDIA/torch-harmonics).
#
#   bash .ci/build-th-cuda-wheel.sh [DEST]        # default .whl-thcuda
#
# Then carry [".whl", ".shim", ".whl-fcn3", DEST] and, on the GPU machine, install it
# over the base set's torch-harmonics:
#   pip install --no-index --no-deps --target /tmp/thcuda DEST/*.whl
#   export PYTHONPATH=/tmp/thcuda:$PYTHONPATH
# Takes ~13 minutes on 2 cores (nvcc; 2026-11-29) and ~4 GB of downloads (torch and its
# CUDA libraries, which `import torch` needs here), in a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl-thcuda}"
case "$dest" in
  /* | ../*)
    echo "error: DEST '$dest' must be a folder in this checkout (it travels as a" \
      "carry folder), e.g. .whl-thcuda" >&2
    exit 2
    ;;
esac
src=.whl-thsrc
. .ci/carry.sh
cuda_toolkit
[ -f "$src/torch-harmonics-0.9.2.tar.gz" ] || bash .ci/fetch-th-cuda-source.sh "${TH_REPO:-}" "$src"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv="${VENV:-$work/venv}"
torch_venv "$venv" numpy setuptools wheel ninja
"$venv/bin/pip" install -q --no-index --no-deps "$src"/*.whl # setuptools-scm
tar xzf "$src/torch-harmonics-0.9.2.tar.gz" -C "$work"
tree="$work/torch-harmonics-0.9.2"
"$venv/bin/python" - "$tree/setup.py" <<'EOF'
import sys

path = sys.argv[1]
text = open(path).read()
old = '    if BUILD_CUDA:\n        print("Compiling attention CUDA kernels'
if old not in text:
    sys.exit("setup.py: the attention extension's CUDA block moved; look again")
new = '    if False:  # FCN3 does not use them\n        print("Compiling attention CUDA kernels'
open(path, "w").write(text.replace(old, new, 1))
EOF
rm -rf "$dest"
ignored_folder "$dest"
start=$(date +%s)
(cd "$tree" && SETUPTOOLS_SCM_PRETEND_VERSION=0.9.2 TORCH_HARMONICS_BUILD_CUDA_EXTENSION=1 \
  TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$OLDPWD/$dest" .)
echo "built in $(($(date +%s) - start)) s"
# A quarter of the size: the wheel travels beside the base set within 64 MiB.
strip_wheel "$venv/bin/python" "$dest"/torch_harmonics-*.whl
"$venv/bin/python" - "$dest" <<'EOF'
import sys, zipfile
from pathlib import Path

wheel = next(Path(sys.argv[1]).glob("torch_harmonics-*.whl"))
names = zipfile.ZipFile(wheel).namelist()
disco = [n for n in names if n.startswith("torch_harmonics/disco/_C")]
print(wheel.name, f"{wheel.stat().st_size / 2**20:.1f} MiB", disco)
if not disco:
    sys.exit("no DISCO extension in the wheel")
EOF
check_carry "$dest"
echo "carry [\".whl\", \".shim\", \".whl-fcn3\", \"$dest\"]"
