#!/usr/bin/env bash
# Builds earth2grid (NVlabs), which Earth2Studio's DLESyM module imports, into a wheel
# in OUTDIR, from the source vendored in third_party/ (issue 33): it is not on the
# package index, and CI reaches only the index. Earth2Studio's install guide pins
# this revision (11dcf1b, v2025.11.1+4) for DLESyM. The build compiles against the
# active venv's torch, so it runs without build isolation and the wheel fits only
# that torch (its version names it, e.g. +torch214).
#
# The C++ extension (HEALPix indexing, which `import earth2grid` loads) is always
# built. Its CUDA padding kernel is built only where CUDA is available: upstream's
# setup.py builds it whenever torch ships CUDA support and a CUDA_HOME is found,
# which PyPI's CUDA torch and a CUDA toolkit on a GPU-less CI machine both satisfy,
# and nvcc then takes minutes on 2 cores for a kernel nothing there can run.
# physicsnemo calls that kernel only on a CUDA machine with `enable_healpixpad`; a
# wheel built here lacks it, so a GPU machine builds its own (TORCH_CUDA_ARCH_LIST,
# MAX_JOBS as for any torch extension), or this machine builds it for the GPU
# machine with EARTH2GRID_CUDA=1, in a venv of the GPU machine's torch (nvcc;
# carry.sh's torch_venv, made here unless VENV names one made before, as
# .ci/build-th-cuda-wheel.sh does), which saves that machine's time.
#
#   bash .ci/build-earth2grid.sh OUTDIR
#   EARTH2GRID_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 [VENV=DIR] bash .ci/build-earth2grid.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:?usage: build-earth2grid.sh OUTDIR}")"
tarball=third_party/earth2grid-11dcf1b.tar.gz
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -xzf "$tarball" -C "$work"
src="$work/earth2grid-11dcf1b"
guard='if CUDAExtension is not None:'
grep -qxF "$guard" "$src/setup.py" || {
  echo "error: $tarball's setup.py has no line '$guard' to patch" >&2
  exit 1
}
python=python
if [ "${EARTH2GRID_CUDA:-0}" = 1 ]; then
  . .ci/carry.sh
  cuda_toolkit
  venv="${VENV:-$work/venv}"
  torch_venv "$venv" numpy setuptools wheel ninja
  python="$venv/bin/python"
  # torch's CUDA headers include cuSPARSE's, which a toolkit without that library
  # lacks; PyPI's torch brings them in its nvidia-* wheels.
  inc=$("$python" - <<'EOF'
import os
import nvidia

dirs = (os.path.join(p, d, "include") for p in nvidia.__path__ for d in os.listdir(p))
print(os.pathsep.join(d for d in dirs if os.path.isdir(d)))
EOF
  )
  export CPATH="$inc${CPATH:+:$CPATH}"
else
  sed -i "s/^$guard\$/if CUDAExtension is not None and torch.cuda.is_available():/" \
    "$src/setup.py"
fi
mkdir -p "$out"
"$python" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$out" "$src"
