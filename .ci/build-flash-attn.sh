#!/usr/bin/env bash
# A reduced flash-attn wheel, built on this (CPU) machine for the GPU machine's torch,
# for the zoo's AIFS2ENS at its published size compared with the eager processor its
# users run (issue 33).
#
# anemoi's default attention is flash-attn's, whose sliding window skips the pairs
# outside it; the GPU machine has no flash-attn and no network, and the full CUDA
# build (72 kernel sources for every head size, both directions, four archs) runs
# longer than a call may. AIFS's processor runs forward only, at head size 64
# (width 1024, 16 heads), in 16 bits: this build compiles those kernels only, for
# sm_90 (H100, H200; FLASH_ATTN_CUDA_ARCHS), with backward, dropout, ALiBi and
# softcapping compiled out (flash-attn's own switches: a call that asks for one
# raises). Every other head size raises too. As .ci/build-th-cuda-wheel.sh does, it
# builds against PyPI's torch 2.11.0 (the GPU machine's build, 2.11.0+cu130) in a
# Python 3.12 virtual environment of its own (VENV: one made before, to reuse),
# with this machine's nvcc (CUDA 13.0); the source comes from
# .ci/fetch-flash-attn-source.sh's folder.
#
#   bash .ci/fetch-flash-attn-source.sh              # into .src-flash-attn/
#   bash .ci/build-flash-attn.sh [DEST]              # into .whl-flash-attn/
#
# Then carry [".whl", ".shim", ".whl-aifs2ens", DEST] and, on the GPU machine, after
# the AIFS set (.ci/fetch-aifs-wheels.sh), the real flash_attn over its stand-in:
#   pip install --no-index --no-deps --upgrade --target /tmp/aifs2ens DEST/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl-flash-attn}"
srcdir=.src-flash-attn
. .ci/carry.sh
cuda_toolkit
ls "$srcdir"/flash_attn-*.tar.gz >/dev/null 2>&1 || bash .ci/fetch-flash-attn-source.sh "$srcdir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv="${VENV:-$work/venv}"
torch_venv "$venv" numpy setuptools wheel ninja packaging psutil einops
tar -xzf "$srcdir"/flash_attn-*.tar.gz -C "$work"
src=$(echo "$work"/flash_attn-*/)
python3 - "$src" <<'EOF'
import re
import sys
from pathlib import Path

src = Path(sys.argv[1])
setup = src / "setup.py"
text = setup.read_text()
# Only the head size 64 instantiations (backward's too: flash_api.cpp names them,
# and they compile to nothing without backward).
kept = re.compile(r'"csrc/flash_attn/src/flash_(fwd|fwd_split|bwd)_hdim64_[a-z0-9_]+\.cu",\n')
dropped = re.compile(r'\s*"csrc/flash_attn/src/flash_[a-z0-9_]+\.cu",\n')
before = len(dropped.findall(text))
text = dropped.sub(lambda m: m.group(0) if kept.search(m.group(0)) else "\n", text)
after = len(dropped.findall(text))
if before < 24 or after != 12:
    sys.exit(f"setup.py: expected 12 head-64 sources of >= 24, kept {after} of {before}")
switches = ("BACKWARD", "DROPOUT", "ALIBI", "SOFTCAP")
for name in switches:
    line = f'# "-DFLASHATTENTION_DISABLE_{name}",'
    if line not in text:
        sys.exit(f"setup.py: no line {line!r} to turn on")
    text = text.replace(line, line[2:], 1)
setup.write_text(text)

header = src / "csrc/flash_attn/src/static_switch.h"
h = header.read_text()
start = h.index("#define HEADDIM_SWITCH(HEADDIM, ...)")
end = h.index("}()", start) + len("}()")
h = h[:start] + (
    "#define HEADDIM_SWITCH(HEADDIM, ...)   \\\n"
    "  [&] {                                    \\\n"
    "    TORCH_CHECK(HEADDIM <= 64, \"this flash-attn build has head sizes up to 64 only\"); \\\n"
    "    constexpr static int kHeadDim = 64;    \\\n"
    "    return __VA_ARGS__();                  \\\n"
    "  }()"
) + h[end:]
header.write_text(h)
print(f"setup.py: {after} kernel sources of {before}; compiled out: {', '.join(switches)}")
EOF
rm -rf "$dest"
ignored_folder "$dest"
start=$(date +%s)
(cd "$src" && FLASH_ATTENTION_FORCE_BUILD=TRUE \
  FLASH_ATTN_CUDA_ARCHS="${FLASH_ATTN_CUDA_ARCHS:-90}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  NVCC_THREADS="${NVCC_THREADS:-1}" PATH="$venv/bin:$PATH" \
  "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$OLDPWD/$dest" .)
echo "built in $(($(date +%s) - start)) s"
strip_wheel "$venv/bin/python" "$dest"/flash_attn-*.whl
ls -la "$dest"
check_carry "$dest"
echo "carry [\".whl\", \".shim\", \".whl-aifs2ens\", \"$dest\"]"
