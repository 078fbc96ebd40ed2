# What the GPU machine's wheel folders share (sourced by .ci/fetch-*-wheels.sh, run
# from the repository root): pinned versions, the folder kept out of git, and the
# 64 MiB a call may carry.

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
