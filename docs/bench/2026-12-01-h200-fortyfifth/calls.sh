#!/usr/bin/env bash
# This session's device calls after the first two (README.md). Prefix as the
# forty-fourth's FCN3 calls (wheels into /tmp/site, PYTHONPATH, the bench commit);
# carry [".whl", ".shim", ".whl-fcn3", ".whl-thcuda"].
#
#   bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$OUT" fcn3-build     # ~270 s
#   bash docs/bench/2026-12-01-h200-fortyfifth/calls.sh "$OUT" fcn3-calls-io  # ~330 s, same machine
#
# fcn3-calls-io (issue 33; the makani entry's layout_optimization=False, dbada64):
#   FCN3's 20-step calls from the cache fcn3-build left, a fresh process with it
#   (warm), in-memory Zarr with and without our OverlappedIO, so that the table
#   says how much of compile=True's gain is the writes (eager + OverlappedIO)
#   and how much compiling. Read: the regions' probes (block MLPs 10.70-10.82 ms
#   compiled against 8.43-8.58 eager before the fix; blocks 89.96-90.21 against
#   88.48-88.75), which regions ran compiled, the whole calls.
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  fcn3-calls-io)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/fcn3 .whl-fcn3/*.whl .whl-thcuda/*.whl
    export PYTHONPATH="/tmp/fcn3:$PYTHONPATH"
    test -f /tmp/built-fcn3/done || echo "the build did not finish: rows may compile" >&2
    timeout 560 python3 -m earth2studio_compile.tools.bench workflow \
      --jobs det:fcn3 --steps 20 --io memory-zarr,overlapped-memory --ways warm \
      --repeats 1 --no-floor --timeout 200 --deadline 520 \
      --cache-from /tmp/built-fcn3 --json "$out/fcn3-calls-io.json" \
      >"$out/fcn3-calls-io.log" 2>&1
    echo "rc=$?"
    sed -n '/Whole call/,/^$/p' "$out/fcn3-calls-io.log" | cut -c1-300
    grep -E "ms a call|eagerly|compiled" "$out/fcn3-calls-io.log" | grep -v INFO |
      cut -c1-300 | tail -40
    ;;
  *) echo "phase: fcn3-calls-io" >&2; exit 2 ;;
esac
