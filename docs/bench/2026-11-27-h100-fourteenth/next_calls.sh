#!/usr/bin/env bash
# The fourteenth session's calls after its change to OverlappedIO's local writes
# (chunks.store_local), one phase per device call, chained on one warm machine
# (/tmp stays between calls while it is held; idle release 30 s):
#
#   bash docs/bench/2026-11-27-h100-fourteenth/next_calls.sh "$OUT" writes      # ~260 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" rows overlapped
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" rows async-zarr
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" dlesym
#
# writes: writes5.py (OverlappedIO's local writes against Zarr's files by hand, 8
#   and 16 threads, and with store_local turned off), then the FCN ensemble's
#   compiled cache built into /tmp/built-fcn for the rows (twelfth next_calls.sh).
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-27-h100-fourteenth
case "$phase" in
  writes)
    timeout 200 python3 "$here/writes5.py" "$out" 2>&1 | grep -v DEBUG
    bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$out" build fcn
    ;;
  *) echo "phase: writes" >&2; exit 2 ;;
esac
