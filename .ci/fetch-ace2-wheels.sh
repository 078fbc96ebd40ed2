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
limit=$((64 * 1024 * 1024))

pin() { # the version constraints.txt pins (the CPU tests' too), else the default
  local found
  found=$(grep -E "^$1==" constraints.txt || true)
  echo "${found:-$1==$2}"
}
exclude=$(git rev-parse --git-path info/exclude)
rm -rf "$dest"
mkdir -p "$dest" "$(dirname "$exclude")"
grep -qxF "/$dest/" "$exclude" 2>/dev/null || echo "/$dest/" >>"$exclude"
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

bytes() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
# What a call sends: tracked and untracked-not-ignored files, plus the carried folders.
tree=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null |
  awk '$2 == "total" {s += $1} END {print s + 0}')
extra=$(bytes "$dest")
base=$(bytes .whl .shim)
total=$((tree + base + extra))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "$dest: $(ls "$dest" | tr '\n' ' ')"
echo "$dest $(mib "$extra"), .whl + .shim $(mib "$base"), tree $(mib "$tree"):" \
  "$(mib "$total") of 64 MiB"
if [ "$total" -gt "$limit" ]; then
  echo "error: a call carrying .whl, .shim and $dest would send $(mib "$total")," \
    "over the 64 MiB limit" >&2
  exit 1
fi
echo "carry [\".whl\", \".shim\", \"$dest\"]"
