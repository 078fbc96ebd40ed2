#!/usr/bin/env bash
# The next device session's calls (written in the thirty-first session, which had
# no device time; nothing here has run on a GPU yet). Prefix and carry as the
# thirtieth's next_calls.sh (wheels into /tmp/site, PYTHONPATH, the bench commit;
# carry [".whl", ".shim", ".whl-models"]). Aurora first (issue 33), then, with
# what time is left, issue 34's FCN ensemble row.
#
#   bash docs/bench/2026-11-29-cpu-thirtyfirst/next_calls.sh "$OUT" bisect-small   # ~120 s
#   bash docs/bench/2026-11-29-cpu-thirtyfirst/next_calls.sh "$OUT" bisect-medium  # ~150 s
#   bash docs/bench/2026-11-29-cpu-thirtyfirst/next_calls.sh "$OUT" bisect-shadow  # ~260 s
#   ... bisect-subsets (~330 s), bisect-modes (~450 s), gpu (~480 s): the
#   thirtieth's phases of those names, run through its next_calls.sh
#   bash docs/bench/2026-11-29-cpu-thirtyfirst/next_calls.sh "$OUT" fcn-ens        # ~500 s
#
# bisect-small / bisect-medium: the thirtieth's shadow phase (each compiled region
#   call beside its own eager call, inside the workflow) with the zoo's small
#   Aurora, then its medium one (new: the published Swin windows over three stages
#   on a 144x288 grid, the last stage padding its windows as the published one's
#   does; on the CPU both match eager within 6e-7 with torch 2.14, README.md). If
#   either parts from eager on CUDA, the cause can be chased at that size.
# gpu: also runs this session's new GPU tests (the side-stream copy, the pinned
#   buffers' unregistering off the caller's thread).
# fcn-ens: issue 34's target 3 row (FCN 8x10, batch 4, 26 variables on disk) with
#   the side-stream copies and the unpinning off the caller's thread: build the
#   artifacts, then the twenty-sixth's row (compare its 2.09 s, 78 ms a step).
set -uo pipefail
out="$1"
phase="$2"
thirtieth=docs/bench/2026-11-29-h200-thirtieth
case "$phase" in
  bisect-small|bisect-medium)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl-models/*.whl
    size="${phase#bisect-}"
    AURORA_BISECT_SIZE="$size" timeout 560 python3 "$thirtieth/aurora_bisect.py" \
      shadow "$out/aurora-bisect-$size.json" >"$out/aurora-bisect-$size.log" 2>&1
    grep '^{' "$out/aurora-bisect-$size.log" | cut -c1-600
    ;;
  bisect-shadow|bisect-subsets|bisect-modes|gpu)
    bash "$thirtieth/next_calls.sh" "$out" "$phase"
    ;;
  fcn-ens)
    bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$out" build fcn
    bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$out" fcn
    ;;
  *) echo "phase: bisect-small, bisect-medium, bisect-shadow, bisect-subsets, bisect-modes, gpu or fcn-ens" >&2; exit 2 ;;
esac
