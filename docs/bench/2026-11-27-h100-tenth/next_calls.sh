#!/usr/bin/env bash
# The next session's 20-step calls from artifacts built ahead (written after the
# tenth session's device time, not run yet): tools.build MODEL into a cache of its
# own, then the workflow bench's warm and second-call rows from a copy of it
# (--cache-from), eager beside them. Issue 33's "never slower on a 20-step call".
#
#   bash docs/bench/2026-11-27-h100-tenth/next_calls.sh "$OUT" aurora build
#   bash docs/bench/2026-11-27-h100-tenth/next_calls.sh "$OUT" aurora calls
#
# Two device calls on one warm machine (/tmp stays between them): Aurora's build
# takes ~210 s and its rows ~400 s, more than one call's 600 s together.
# REPEATS (default 3) calls in the second-call process, DEADLINE (default 420 s)
# for the rows: StormCast's eager step takes ~4 s, so its rows fit one call with
# REPEATS=1 (eleventh session's estimate: ~45 s of imports per process, three
# processes, 20 steps eager and compiled each).
set -uo pipefail
out="$1"
model="$2"
phase="${3:-both}"
if [ "$phase" != calls ]; then
  start=$(date +%s)
  EARTH2STUDIO_COMPILE_CACHE=/tmp/built-$model python3 -m \
    earth2studio_compile.tools.build "$model" --size full --precision tf32 \
    >"$out/build-$model.log" 2>&1
  echo "built $model in $(($(date +%s) - start)) s"
  grep -h "built in\|failed" "$out/build-$model.log"
fi
[ "$phase" = build ] && exit 0
python3 -m earth2studio_compile.tools.bench workflow --jobs "det:$model" --steps 20 \
  --io memory-zarr --ways warm,second --repeats "${REPEATS:-3}" --no-floor --timeout 300 \
  --deadline "${DEADLINE:-420}" --cache-from "/tmp/built-$model" --json "$out/$model-calls.json" \
  >"$out/$model-calls.log" 2>&1
sed -n '/Whole call/,/^$/p' "$out/$model-calls.log"
