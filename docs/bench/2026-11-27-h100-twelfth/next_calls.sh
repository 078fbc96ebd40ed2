#!/usr/bin/env bash
# The next session's issue 34 calls (written after the twelfth session's device
# time, not run yet). One phase per device call, chained on one warm machine (/tmp
# stays between calls while it is held; idle release 30 s):
#
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" writes      # ~60 s
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" build fcn   # ~200 s
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" rows fcn    # ~560 s
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" build dlwp
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" gil dlwp    # needs .whl-spy
#
# writes: writes3.py (where OverlappedIO's disk writes lose against Zarr's pattern).
# build MODEL: tools.build at the ensemble job's batch size into /tmp/built-MODEL.
# rows fcn: the FCN ensemble on AsyncZarrBackend first (issue 34's ">= 2x upstream
#   eager with AsyncZarrBackend": the twelfth session's deadline skipped that row),
#   then through OverlappedIO, warm rows from the built cache, the floors.
# gil dlwp: DLWP's in-memory ensemble rows under py-spy --gil (every process): does
#   the warm row's data source wait for the GIL while the first call ahead runs the
#   artifact's first call?
set -uo pipefail
out="$1"
phase="$2"
model="${3:-fcn}"
case "$model" in
  fcn) job=fcn-ens batch=4 ;;
  dlwp) job=dlwp-ens batch=8 ;;
  *) echo "model: fcn or dlwp" >&2; exit 2 ;;
esac
bench="python3 -m earth2studio_compile.tools.bench workflow"
case "$phase" in
  writes)
    python3 docs/bench/2026-11-27-h100-twelfth/writes3.py "$out" 2>&1 | grep -v DEBUG
    ;;
  build)
    start=$(date +%s)
    EARTH2STUDIO_COMPILE_CACHE=/tmp/built-$model python3 -m \
      earth2studio_compile.tools.build "$model" --size full --precision tf32 \
      --batch-size "$batch" >"$out/build-$model.log" 2>&1
    echo "built $model in $(($(date +%s) - start)) s"
    grep -h "built in\|failed" "$out/build-$model.log"
    ;;
  rows)
    $bench --jobs "$job" --io async-zarr,overlapped --ways warm --fresh-repeats 2 \
      --source prefetched --cache-from "/tmp/built-$model" --deadline 550 \
      --json "$out/$job-rows.json" --workdir /tmp/wf >"$out/$job-rows.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/$job-rows.log"
    ;;
  gil)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/spy .whl-spy/*.whl
    /tmp/spy/bin/py-spy record -r 200 --gil --threads --subprocesses --nonblocking \
      -f raw -o "$out/gil-$model.raw" -- $bench --jobs "$job" \
      --io overlapped-memory --ways warm --fresh-repeats 1 --no-floor \
      --cache-from "/tmp/built-$model" --deadline 400 \
      --json "$out/$job-gil.json" --workdir /tmp/wf >"$out/$job-gil.log" 2>&1
    gzip "$out/gil-$model.raw"
    sed -n '/Whole call/,/^$/p' "$out/$job-gil.log"
    ;;
  *) echo "phase: writes, build, rows or gil" >&2; exit 2 ;;
esac
