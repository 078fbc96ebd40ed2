#!/usr/bin/env bash
# The GPU machine's wheels for the zoo's DLESyM at its published size (issue 33).
#
# physicsnemo's HEALPix UNets import hydra (`hydra.utils.instantiate`), which the
# GPU machine's image lacks; its other imports (omegaconf, antlr4) are in the base
# set. earth2grid is not a wheel to fetch: the GPU machine builds it from
# third_party/ with .ci/build-earth2grid.sh, which there compiles its CUDA padding
# kernel too (the published test needs it). A call carries [".whl", ".shim", DEST].
#
#   bash .ci/fetch-dlesym-wheels.sh [DEST]
#
# and on the GPU machine, after the base set:
#   pip install --no-index --no-deps --target /tmp/site DEST/*.whl
#   TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 bash .ci/build-earth2grid.sh /tmp/e2g-whl
#   pip install --no-index --no-deps --target /tmp/site /tmp/e2g-whl/*.whl
#   python3 -m pytest -m gpu -q test/tools/zoo/test_dlesym.py
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl-dlesym}"
. .ci/carry.sh
rm -rf "$dest"
ignored_folder "$dest"
# The version the CPU tests' venv has (physicsnemo's dependency there).
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest" \
  "$(pin hydra-core 1.3.8)"
check_carry "$dest"
echo "carry [\".whl\", \".shim\", \"$dest\"]"
