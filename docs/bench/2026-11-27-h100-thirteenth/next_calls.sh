#!/usr/bin/env bash
# The next session's calls (written after the thirteenth session's device time, not
# run yet). One phase per device call, chained on one warm machine (/tmp stays
# between calls while it is held; idle release 30 s; give the machine back after
# the last call):
#
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" writes    # ~90 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" gpu       # ~420 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" published # ~350 s
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" build fcn    # ~150 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" rows async-zarr   # ~330 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" rows overlapped   # ~380 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" dlesym    # ~300 s?
#
# Every call first installs the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl [.whl-models/*.whl]
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
# carry [".whl", ".shim"], plus ".whl-models" for gpu and published, ".whl-dlesym"
# (bash .ci/fetch-dlesym-wheels.sh) for dlesym.
#
# writes: writes4.py, whether Zarr's storage step reaches Zarr's file pattern once
#   its Python per chunk is cut (zlean) or runs in worker processes (proc-*): the
#   lever for issue 34's disk targets, which OverlappedIO's writes bound.
# gpu: the GPU-marked suite without the published-size zoo tests (the whole suite
#   took 575 s of a 595 s call on the twelfth session's machine); junitxml keeps
#   each test's time where the tail is cut.
# published: the published-size zoo tests (Aurora 253 s, StormCast 162 s on the
#   twelfth session's machine) in two workers.
# rows IO: the FCN ensemble on disk from the cache `build fcn` left, upstream eager
#   and compile=True on AsyncZarrBackend in three fresh processes each (the
#   thirteenth session's pairs spread 5.5-6.7 s: two samples do not settle issue
#   34's ">= 2x upstream eager on AsyncZarrBackend", 1.89x of medians), then
#   upstream on ZarrBackend, eager + OverlappedIO and compile=True + OverlappedIO in
#   two each (a round of both IOs is ~290 s of processes: one call holds two rounds
#   of one of them). Same machine, chained; the deadline keeps compared rows
#   together (038aca4).
# dlesym: earth2grid built there from third_party/ with its CUDA padding kernel
#   (never built on a GPU machine yet: setuptools >= 77 is needed, the image's is
#   printed first), then DLESyM's GPU-marked test at the published size (written
#   by the thirteenth session, never run: the ConvGRU state kept on the module
#   across CUDA-graph replays is its open question; docs/models.md).
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-27-h100-thirteenth
suite() { # MARKERS WORKERS DURATIONS NAME: a part of the GPU suite, its times kept
  timeout 560 python3 -m pytest -m "$1" -n "$2" -q -p no:cacheprovider -rfEs \
    --durations="$3" --junitxml="$out/$4.xml" >"$out/$4.log" 2>&1
  echo "exit $?"
  tail -25 "$out/$4.log"
}
case "$phase" in
  writes)
    timeout 300 python3 "$here/writes4.py" "$out" 2>&1 | grep -v DEBUG
    ;;
  gpu) suite "gpu and not published" 4 15 gpu ;;
  published) suite "gpu and published" 2 10 published ;;
  rows)
    io="${3:-async-zarr}"
    repeats=3 floor=--no-floor
    [ "$io" = overlapped ] && repeats=2 floor=
    python3 -m earth2studio_compile.tools.bench workflow --jobs fcn-ens \
      --io "$io" --ways warm --fresh-repeats "$repeats" $floor \
      --source prefetched --cache-from /tmp/built-fcn --deadline 540 \
      --json "$out/fcn-ens-$io.json" --workdir /tmp/wf >"$out/fcn-ens-$io.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/fcn-ens-$io.log" | tail -8
    ;;
  dlesym)
    python3 -m pip show setuptools | grep -i ^version
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .whl-dlesym/*.whl
    start=$(date +%s)
    TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 bash .ci/build-earth2grid.sh /tmp/e2g-whl \
      >"$out/earth2grid-build.log" 2>&1
    echo "earth2grid built: exit $? in $(($(date +%s) - start)) s"
    cp /tmp/e2g-whl/*.whl "$out/" 2>/dev/null
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      /tmp/e2g-whl/*.whl
    timeout 480 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
      --durations=5 --junitxml="$out/dlesym.xml" test/tools/zoo/test_dlesym.py \
      >"$out/dlesym.log" 2>&1
    echo "exit $?"
    tail -30 "$out/dlesym.log"
    ;;
  *) echo "phase: writes, gpu, published, rows or dlesym" >&2; exit 2 ;;
esac
