#!/usr/bin/env bash
# The next session's StormCast rows (written after the tenth session's device time,
# not run yet): the model table's build (layout optimization off, CUDA graphs) and
# a channels-last one with CUDA graphs, built side by side into the default cache,
# then per step in one process. ~450 s on an H100 (builds ~320 s, imports ~60 s).
#
#   bash docs/bench/2026-11-27-h100-tenth/next_stormcast.sh "$OUT"
set -uo pipefail
out="$1"
build() {
  python3 -m earth2studio_compile.tools.build stormcast --size full --precision tf32 "$@"
}
start=$(date +%s)
(build >"$out/build-table.log" 2>&1; echo "table $(($(date +%s) - start)) s") &
(build --options '{"triton.cudagraphs": true}' >"$out/build-channels-last.log" 2>&1
  echo "channels-last $(($(date +%s) - start)) s") &
wait
grep -h "built in\|failed" "$out"/build-*.log
python3 docs/bench/2026-11-27-h100-tenth/stormcast_layout.py "$out/stormcast-layout.json" \
  '[null, {"triton.cudagraphs": true}]' >"$out/stormcast-layout.log" 2>&1
grep -v "INFO\|DEBUG" "$out/stormcast-layout.log" | tail -4
