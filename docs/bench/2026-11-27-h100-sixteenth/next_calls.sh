#!/usr/bin/env bash
# The next session's device calls (the sixteenth ran `build` and the FCN and DLWP
# rows; see README.md here). One phase per device call, chained on one warm machine
# (/tmp stays while it is held; it goes back after 30 minutes held, so a phase that
# needs /tmp/built-* runs in the same hold as `build`). Every call first installs
# the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl [.whl-models/*.whl]
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"], plus ".whl-models" and ".whl-dlesym" (and ".whl-e2g"
# where a session has the earth2grid wheel) for dlesym-gpu and gpu, ".whl-spy" for
# spy. In this order, as device time allows (the sixteenth's calls were counted in
# full: 1800 s is about four calls of 400 s with the machine's start):
#   bash docs/bench/2026-11-27-h100-sixteenth/next_calls.sh "$OUT" dlesym-gpu  # ~250 s (+141 s without .whl-e2g)
#   bash docs/bench/2026-11-27-h100-sixteenth/next_calls.sh "$OUT" dlesym-gpu latlon  # after it, same machine
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" gpu        # ~420 s
#   bash docs/bench/2026-11-27-h100-sixteenth/next_calls.sh "$OUT" writes      # ~120 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build       # ~370 s
#   bash docs/bench/2026-11-27-h100-sixteenth/next_calls.sh "$OUT" dlwp-disk   # ~500 s
#   bash docs/bench/2026-11-27-h100-fourteenth/next_calls.sh "$OUT" spy        # ~150 s
#
# dlesym-gpu: DLESyM's published GPU test (issue 33) with its NVTX ranges quieted
#   inside its whole regions (ac9a9a1), never run on a GPU; earth2grid from
#   .whl-e2g if carried, else built from third_party/ (its wheel comes back in a
#   tar: the name has a "+", which $OUT does not return as a file). With `latlon`:
#   the DLESyMLatLon case of the same test (its regions' graphs from the Inductor
#   cache the first call left in /tmp, on the same machine).
# writes: writes5.py (fourteenth) at HEAD, OverlappedIO's writes of FCN's ensemble
#   steps against Zarr's file pattern by hand, 8 threads: the sixteenth session made
#   a chunk's directories without the one lock every put thread waited on (each
#   chunk of these stores has a directory of its own) and with one mkdir each; the
#   fourteenth measured 4.9-5.4 GB/s against 6.8 by hand.
# dlwp-disk: issue 34's second target, DLWP 16 x 20 with all 7 variables to a
#   Zarr store on disk (9.8 GB per call), upstream eager on ZarrBackend, eager +
#   OverlappedIO and compile=True + OverlappedIO, one fresh process each and the
#   floors; needs `build` first (/tmp/built-dlwp).
# spy: where the FCN row's writes wait now (compile=True and eager + OverlappedIO
#   were level in the sixteenth session: the writes bind both).
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  dlesym-gpu)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .whl-dlesym/*.whl
    limit=540
    if ls .whl-e2g/*.whl >/dev/null 2>&1; then
      wheels=(.whl-e2g/*.whl)
    elif ls /tmp/e2g-whl/*.whl >/dev/null 2>&1; then  # built by a call before
      wheels=(/tmp/e2g-whl/*.whl)
    else
      limit=400
      start=$(date +%s)
      TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 bash .ci/build-earth2grid.sh /tmp/e2g-whl \
        >"$out/earth2grid-build.log" 2>&1
      echo "earth2grid built: exit $? in $(($(date +%s) - start)) s"
      tar -C /tmp/e2g-whl -cf "$out/earth2grid-whl.tar" .
      wheels=(/tmp/e2g-whl/*.whl)
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site "${wheels[@]}"
    case="${3:-dlesym}"
    [ "$case" = latlon ] && case=dlesym-latlon
    timeout "$limit" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
      --durations=5 --junitxml="$out/$case.xml" \
      "test/tools/zoo/test_dlesym.py::test_published_dlesym_on_the_gpu_matches_eager[$case]" \
      >"$out/$case.log" 2>&1
    echo "exit $?"
    tail -30 "$out/$case.log"
    ;;
  writes)
    ROWS=zput-8,ov-8,ov-8-again timeout 300 python3 \
      docs/bench/2026-11-27-h100-fourteenth/writes5.py "$out" 2>&1 | grep -v DEBUG
    ;;
  dlwp-disk)
    python3 -m earth2studio_compile.tools.bench workflow --jobs dlwp-ens-all \
      --io overlapped --ways warm --fresh-repeats 1 --cache-from /tmp/built-dlwp \
      --deadline 540 --json "$out/dlwp-ens-all.json" --workdir /tmp/wf \
      >"$out/dlwp-ens-all.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/dlwp-ens-all.log" | tail -8
    ;;
  *) echo "phase: dlesym-gpu, writes or dlwp-disk (the others: the paths above)" >&2; exit 2 ;;
esac
