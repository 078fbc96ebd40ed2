#!/usr/bin/env bash
# The next session's device call for the writers (see README.md here), after the
# usual wheel install (docs/bench/2026-11-28-h100-nineteenth/next_calls.sh):
#   bash docs/bench/2026-11-28-cpu-writers/next_calls.sh "$OUT" writers   # ~200 s
# writers: writers.py at FCN's size on the GPU host's disk (CPU tensors: the write
#   side alone, with its 16 cores), then contention.py's ov-disk and threads-disk
#   (DLWP-shaped steps from the device): is OverlappedIO's disk path now nearer
#   plain threads' rate than at 9a6d36a (1.19 s against 0.62, H200)?
# writers-mw4 (~120 s): the same rows of OverlappedIO with 4 put threads.
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
  writers-mw4)
    # The same with 4 put threads (Zarr's threading.max_workers): on the 2-core
    # CPU, fewer put threads wrote faster now that a step keeps every put thread
    # busy (README: "Fewer put threads on 2 cores").
    export ZARR_THREADING__MAX_WORKERS=4
    H=721 W=1440 REPEAT=2 ROWS=ov,ov-settled timeout 300 \
      python3 docs/bench/2026-11-28-cpu-writers/writers.py "$out/mw4" 2>&1 | grep -v DEBUG
    ROWS=ov-disk timeout 200 python3 \
      docs/bench/2026-11-28-h100-eighteenth/contention.py "$out/mw4" 2>&1 | grep -v DEBUG
    ;;
  *) echo "phase: writers | writers-mw4" >&2; exit 2 ;;
esac
