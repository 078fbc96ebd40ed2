#!/usr/bin/env bash
# flash-attn's source (Earth2Studio's AIFS extras ask for flash-attn, unpinned: the
# version constraints.txt pins, else 2.8.3.post2) and a ninja wheel, for
# .ci/build-flash-attn.sh, which builds a reduced wheel from them on this machine.
#
#   bash .ci/fetch-flash-attn-source.sh [DEST]       # default .src-flash-attn
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.src-flash-attn}"
. .ci/carry.sh
rm -rf "$dest"
ignored_folder "$dest"
# pip would prepare the sdist's metadata, and its setup.py imports torch: the file
# itself, from the index's simple API (JSON), checked against its sha256 there.
python3 - "$dest" "$(pin flash-attn 2.8.3.post2)" <<'PY'
import hashlib
import json
import sys
import urllib.request
from pathlib import Path

dest, spec = Path(sys.argv[1]), sys.argv[2]
name, version = spec.split("==")
wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
req = urllib.request.Request(f"https://pypi.org/simple/{name}/", headers=accept)
with urllib.request.urlopen(req) as r:
    [sdist] = [f for f in json.load(r)["files"] if f["filename"] == wanted]
with urllib.request.urlopen(sdist["url"]) as r:
    data = r.read()
if hashlib.sha256(data).hexdigest() != sdist["hashes"]["sha256"]:
    sys.exit(f"{wanted}: sha256 differs from the index's")
(dest / wanted).write_bytes(data)
PY
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_17_x86_64 -d "$dest" "$(pin ninja 1.13.0)"
ls -la "$dest"
