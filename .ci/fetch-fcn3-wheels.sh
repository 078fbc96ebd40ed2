#!/usr/bin/env bash
# The GPU machine's wheels for the zoo's FCN3 at its published size (issue 33).
#
# Earth2Studio's FCN3 module imports makani, which is not on the package index: its
# wheel is built here from the source in third_party/ (pure Python, so it fits any
# Python 3), as CI builds it for the CPU tests (.ci/run). makani's imports need
# more-itertools and ruamel.yaml, which the machine's image lacks, and name packages
# only its training and plotting use: wandb (20 MB, the carry's limit is 64 MiB),
# moviepy and numba (the image has numba; its zenith angle calls jit in object mode,
# which the stand-in's pass-through computes alike), all stand-ins
# (.ci/stand-in-wheel.py) that must not reach the other tests, so the FCN3 test
# installs into a folder of its own. A call carries [".whl", ".shim", DEST].
#
#   bash .ci/fetch-fcn3-wheels.sh [DEST]
#
# and on the GPU machine, after the base set:
#   pip install --no-index --no-deps --target /tmp/fcn3 DEST/*.whl
#   export PYTHONPATH=/tmp/fcn3:/tmp/site:$PWD/.shim:$PWD
#   python3 -m pytest -m gpu -q test/tools/zoo/test_fcn3.py
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl-fcn3}"
. .ci/carry.sh
rm -rf "$dest"
ignored_folder "$dest"
python3 -m pip wheel -q --no-deps -w "$dest" third_party/makani-b38fcb2.tar.gz
# The versions .ci/run installs for the CPU tests.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  -d "$dest" "$(pin more-itertools "")" "$(pin ruamel.yaml "")"
python3 .ci/stand-in-wheel.py wandb "$dest" >/dev/null
python3 .ci/stand-in-wheel.py moviepy.video.io.ImageSequenceClip "$dest" >/dev/null
python3 .ci/stand-in-wheel.py numba "$dest" --pass-through jit,njit >/dev/null

check_carry "$dest"
echo "carry [\".whl\", \".shim\", \"$dest\"]"
