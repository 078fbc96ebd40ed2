#!/usr/bin/env bash
# The next session's device call for the writers (see README.md here), after the
# usual wheel install (docs/bench/2026-11-28-h100-nineteenth/next_calls.sh):
#   bash docs/bench/2026-11-28-cpu-writers/next_calls.sh "$OUT" writers   # ~200 s
# writers: writers.py at FCN's size on the GPU host's disk (CPU tensors: the write
#   side alone, with its 16 cores), then contention.py's ov-disk and threads-disk
#   (DLWP-shaped steps from the device): is OverlappedIO's disk path now nearer
#   plain threads' rate than at 9a6d36a (1.19 s against 0.62, H200)?
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  writers)
    H=721 W=1440 REPEAT=2 ROWS=ov,ov-settled,threads,threads-atomic timeout 300 \
      python3 docs/bench/2026-11-28-cpu-writers/writers.py "$out" 2>&1 | grep -v DEBUG
    ROWS=ov-disk,threads-disk timeout 200 python3 \
      docs/bench/2026-11-28-h100-eighteenth/contention.py "$out" 2>&1 | grep -v DEBUG
    ;;
  *) echo "phase: writers" >&2; exit 2 ;;
esac
