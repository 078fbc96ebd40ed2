#!/usr/bin/env bash
# The GPU machine's wheels for the zoo's ACE2 at its published size (issue 33).
#
# fme (Ai2's ACE) pins torch-harmonics 0.8.0: its SHTs call 0.8's Legendre API,
# while the machine's torch 2.11 comes with 0.9.2. So the GPU test installs these
# into a folder of its own, put first on PYTHONPATH, as CI does on the CPU
# (.ci/run). 0.8.0 exists only as source: built here into a Python-only wheel
# (without torch in its build environment it compiles no extension; ACE2 needs
# none). fme's imports need dacite, tensorly and tensorly-torch, and wandb, which
# they only subclass for logging: a stand-in (.ci/stand-in-wheel.py) keeps the call
# under 64 MiB. A call carries [".whl", ".shim", DEST], without .whl-models.
#
#   bash .ci/fetch-ace2-wheels.sh [DEST]
#
# and on the GPU machine, after the base set:
#   pip install --no-index --no-deps --target /tmp/ace2 DEST/*.whl
#   export PYTHONPATH=/tmp/ace2:/tmp/site:$PWD/.shim:$PWD
#   python3 -m pytest -m gpu -q test/tools/zoo/test_ace2.py
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl-ace2}"
. .ci/carry.sh
rm -rf "$dest"
ignored_folder "$dest"
# The versions .ci/run installs for the CPU tests.
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest" fme==2026.10.0 \
  "$(pin dacite 1.9.2)" "$(pin tensorly 0.10.0)" "$(pin tensorly-torch 0.5.0)"
python3 -m pip wheel -q --no-deps -w "$dest" torch-harmonics==0.8.0
if unzip -l "$dest"/torch_harmonics-0.8.0-*.whl | grep -q '\.so$'; then
  echo "error: torch-harmonics 0.8.0 was built with extensions (torch in its build" \
    "environment): they would not load with the GPU machine's torch" >&2
  exit 1
fi
python3 .ci/stand-in-wheel.py wandb "$dest" >/dev/null

check_carry "$dest"
echo "carry [\".whl\", \".shim\", \"$dest\"]"
