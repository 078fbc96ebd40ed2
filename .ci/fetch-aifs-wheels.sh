#!/usr/bin/env bash
# The GPU machine's wheels for the zoo's AIFS2ENS at its published size (issue 33).
#
# Earth2Studio's AIFS modules import anemoi-models, earthkit-regrid, ecmwf-opendata
# and flash-attn when they are imported; anemoi's network builds through hydra. The
# machine's image has torch-geometric, xxhash and scipy, not these. flash-attn would
# have to be built there from source with nvcc, longer than a call may run, and
# the network runs PyTorch's SDPA: a stand-in that only passes the import
# (.ci/stand-in-wheel.py) goes instead, so the AIFS test installs into a folder of
# its own, as CI does on the CPU (.ci/run). All are pure Python. A call carries
# [".whl", ".shim", DEST].
#
#   bash .ci/fetch-aifs-wheels.sh [DEST]
#
# and on the GPU machine, after the base set:
#   pip install --no-index --no-deps --target /tmp/aifs DEST/*.whl
#   export PYTHONPATH=/tmp/aifs:/tmp/site:$PWD/.shim:$PWD
#   python3 -m pytest -m gpu -q test/tools/zoo/test_aifs.py
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl-aifs}"
. .ci/carry.sh
rm -rf "$dest"
ignored_folder "$dest"
# The versions .ci/run installs for the CPU tests (hydra-core: the CPU venv's).
reqs=()
for name in anemoi-models anemoi-utils earthkit-regrid ecmwf-opendata multiurl pytz; do
  reqs+=("$(pin "$name" "")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  -d "$dest" "${reqs[@]}" "$(pin hydra-core 1.3.8)"
python3 .ci/stand-in-wheel.py flash_attn "$dest" >/dev/null

check_carry "$dest"
echo "carry [\".whl\", \".shim\", \"$dest\"]"
