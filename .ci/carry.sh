# What the GPU machine's wheel folders share (sourced by .ci/fetch-*-wheels.sh and
# .ci/build-*.sh, run from the repository root): pinned versions, the folder kept
# out of git, the 64 MiB a call may carry, and the CUDA builds' toolkit and torch.

pin() { # the version constraints.txt pins (the CPU tests' too), else the default
  local found
  found=$(grep -E "^$1==" constraints.txt || true)
  echo "${found:-$1==$2}"
}

ignored_folder() { # create $1, ignored through git's own exclude file
  local exclude # (a worktree's .git is a file, not a folder)
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$1" "$(dirname "$exclude")"
  grep -qxF "/$1/" "$exclude" 2>/dev/null || echo "/$1/" >>"$exclude"
}

check_carry() { # fail if a call carrying .whl, .shim and $1 would pass 64 MiB
  local dest=$1 limit=$((64 * 1024 * 1024)) tree extra base total
  # A missing folder counts 0 (du fails on it, which pipefail would make fatal).
  bytes() { { du -sb "$@" 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'; }
  mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
  # What a call sends: tracked and untracked-not-ignored files, and the folders.
  tree=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null |
    awk '$2 == "total" {s += $1} END {print s + 0}')
  extra=$(bytes "$dest")
  base=$(bytes .whl .shim)
  total=$((tree + base + extra))
  echo "$dest: $(ls "$dest" | tr '\n' ' ')"
  echo "$dest $(mib "$extra"), .whl + .shim $(mib "$base"), tree $(mib "$tree"):" \
    "$(mib "$total") of 64 MiB"
  [ -d .whl ] || echo "note: no .whl/ yet; fetch the base set too (docs/user-guide.md)"
  if [ "$total" -gt "$limit" ]; then
    echo "error: a call carrying .whl, .shim and $dest would send $(mib "$total")," \
      "over the 64 MiB limit" >&2
    return 1
  fi
}

strip_wheel() { # $2's shared objects without debug sections, repacked in place by $1
  # (a python with the wheel package): Python's CFLAGS have -g, which makes a
  # CUDA extension's wheel about four times the size, too large to travel.
  local python=$1 wheel=$2 tmp
  tmp=$(mktemp -d)
  "$python" -m wheel unpack -d "$tmp" "$wheel" >/dev/null
  find "$tmp" -name '*.so' -exec strip --strip-debug {} +
  rm "$wheel"
  "$python" -m wheel pack -d "$(dirname "$wheel")" "$tmp"/*
  rm -rf "$tmp"
}

cuda_toolkit() { # fail without nvcc; point torch at the toolkit's headers
  command -v nvcc >/dev/null || { echo "error: no nvcc on this machine" >&2; return 1; }
  # torch looks for the toolkit beside `which nvcc` (here /usr/local/bin: no headers).
  if [ -d /usr/local/cuda/include ]; then export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"; fi
}

torch_venv() { # $1: a Python 3.12 virtual environment with PyPI's torch
  # ${TORCH_VERSION:-2.11.0} (the GPU machine's build) and the packages $2...,
  # made unless $VENV names one made before, to reuse. Python: $PYTHON312, else
  # python3.12, else pyenv's 3.12.1 (a pyenv shim may exist and fail).
  local venv=$1 python="${PYTHON312:-python3.12}"
  shift
  [ -x "$venv/bin/python" ] && return 0
  "$python" -c "" 2>/dev/null || python="$HOME/.pyenv/versions/3.12.1/bin/python3.12"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q "torch==${TORCH_VERSION:-2.11.0}" "$@"
}
