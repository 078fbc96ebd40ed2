#!/usr/bin/env bash
# The GPU machine's extra wheels for the zoo's Aurora and StormCast, and a Python-only
# torch-harmonics 0.9.3 for SFNO with its transforms compiled (issue 33).
#
# That machine has no network: packages travel as cp312 manylinux wheels in
# git-ignored folders named in a call's `carry`, 64 MiB per call for the whole tree.
# The base set (earth2studio, physicsnemo, ...) goes to .whl/ with the workplace's
# fetch-wheels.sh (docs/user-guide.md, "GPU tests"); this script fetches what the two
# models need beyond it and beyond the machine's image into DEST (default
# .whl-models/), and fails if the tree, .whl/, .shim/ and DEST together would not
# travel. Run from anywhere; the paths are the repository root's.
#
#   bash .ci/fetch-model-wheels.sh [DEST]
#
# What `import aurora` and `zoo.build("aurora"|"stormcast")` import, checked against
# the image's package list: einops, timm, huggingface-hub and scipy are there;
# microsoft-aurora is not. Its other requirements stay behind: pydantic and
# azure-storage-blob are imported only by `aurora.foundry` (a web client the package
# does not import), netcdf4 not at all. pyproj is real work, not an import: the
# StormCast wrapper builds the HRRR grid with it in its constructor, where the
# shim's stand-in would return nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl-models}"
. .ci/carry.sh
# cloudpickle: a dependency of this package (Aurora's background builds need it),
# which the device's base image may lack.
reqs=("$(pin microsoft-aurora 2.0.1)" "$(pin pyproj 3.7.2)" "$(pin cloudpickle 3.1.2)")

ignored_folder "$dest"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64; do
  plat+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$dest" "${reqs[@]}"

# torch-harmonics 0.9.3 without its compiled parts (built for torch 2.14), in a
# folder of its own that the usual install leaves alone: a call measuring SFNO with
# its transforms compiled installs it ahead of 0.9.2 on the path,
#   pip install --no-deps --target /tmp/th093 $dest/th/*.whl
#   export PYTHONPATH=/tmp/th093:$PYTHONPATH
rm -rf "$dest/th" "$dest/th-src"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$dest/th-src" torch-harmonics==0.9.3
python3 .ci/python-only-wheel.py "$dest"/th-src/*.whl "$dest/th" >/dev/null
rm -rf "$dest/th-src"

check_carry "$dest"
echo "carry [\".whl\", \".shim\", \"$dest\"]; install both: pip install --no-deps --target /tmp/site .whl/*.whl $dest/*.whl"
