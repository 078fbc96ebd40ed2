#!/usr/bin/env bash
# The source of torch-harmonics 0.9.2, for a build with its CUDA kernels
# (issue 33: the zoo's FCN3 at its published size; .ci/build-th-cuda-wheel.sh
# builds it, on this machine, and says why).
#
# The PyPI wheel of torch-harmonics 0.9.2 (the version for the GPU machine's torch
# 2.11) carries its DISCO kernels for the CPU only, and its convolution takes that
# kernel for CUDA tensors too: FCN3's eager reference fails on CUDA
# (docs/bench/2026-11-28-h200-twentythird/README.md). PyPI has no source release
# of 0.9.x, so the tagged source is archived from a git repository of
# NVIDIA/torch-harmonics (a local mirror given as REPO, else cloned from GitHub):
# the package, setup.py, pyproject.toml, README and licence, without the notebooks;
# beside it the wheels of setuptools-scm, which its build needs (the build runs
# without isolation).
#
#   bash .ci/fetch-th-cuda-source.sh [REPO] [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
repo="${1:-}"
dest="${2:-.whl-thsrc}"
tag=v0.9.2
. .ci/carry.sh
if [ -z "$repo" ]; then
  repo=$(mktemp -d)
  git clone -q --bare --depth 1 --branch "$tag" \
    https://github.com/NVIDIA/torch-harmonics "$repo"
fi
rm -rf "$dest"
ignored_folder "$dest"
git -C "$repo" archive --format=tar.gz --prefix=torch-harmonics-0.9.2/ \
  -o "$PWD/$dest/torch-harmonics-0.9.2.tar.gz" "$tag" \
  torch_harmonics setup.py pyproject.toml README.md LICENSE.txt
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  -d "$dest" setuptools-scm==10.3.4 vcs-versioning==2.6.0
check_carry "$dest"
echo "carry [\".whl\", \".shim\", \"$dest\"]"
