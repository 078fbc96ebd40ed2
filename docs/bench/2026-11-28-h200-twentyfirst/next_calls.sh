#!/usr/bin/env bash
# The twenty-second session's device calls (issue 34; README.md here has this
# session's). One phase per device call, chained on one warm machine (/tmp stays
# while it is held). Every call first installs the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"] (gil-first: also ".whl-spy", py-spy 0.4.3 from
# `pip download py-spy==0.4.3 --no-deps --only-binary=:all: -d .whl-spy`).
# In order, one hold (about 1700 s in all: drop the last where time is short):
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build        # ~230 s
#   bash docs/bench/2026-11-28-cpu-writers/next_calls.sh "$OUT" writers         # ~200 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" fcn         # ~330 s
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" dlwp-disk  # ~220 s
#   bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$OUT" memory     # ~300 s
#   bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$OUT" fcn3-gpu   # ~150 s?
#   bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$OUT" gil-first  # ~200 s
# writers, then fcn and dlwp-disk: after 0982668/81d456b (a chunk file in four
#   system calls, a step's copy events waited once): is FCN's steady state nearer
#   the larger floor than the sum of both (this session: the sum)?
# fcn3-gpu (issue 33): the zoo's FCN3 at its published size (carry ".whl-fcn3"
#   too: bash .ci/fetch-fcn3-wheels.sh); first what torch-harmonics 0.9.2 there
#   says of its DISCO kernels.
#
# memory: issue 34's first target as it is written: DLWP 16 x 20, batch 8, 3
#   variables, the store in memory (this session's row, call 7, was on disk), with
#   upstream eager on ZarrBackend in memory and on AsyncZarrBackend beside it.
# fcn, dlwp-disk: again after any change to OverlappedIO's writers (FCN's steady
#   state was the sum of its two floors, not their maximum).
# gil-first: py-spy with --gil (only samples of the thread holding the GIL) over
#   DLWP's compiled row: whether the artifact's first run ahead, on its own
#   thread, holds the GIL while upstream's fetch_data waits (fetch_data 0.59-0.66
#   s compiled against 0.33-0.39 eager this session; AOTInductor's boxed_run is
#   bound without gil_scoped_release).
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  memory)
    python3 -m earth2studio_compile.tools.bench workflow --jobs dlwp-ens \
      --io overlapped-memory,async-zarr --ways warm --fresh-repeats 1 \
      --cache-from /tmp/built-dlwp --deadline 450 --json "$out/dlwp-ens-memory.json" \
      --workdir /tmp/wf >"$out/dlwp-ens-memory.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/dlwp-ens-memory.log" | tail -6
    ;;
  gil-first)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/spy .whl-spy/*.whl
    /tmp/spy/bin/py-spy record -r 200 --gil --native --threads --subprocesses \
      -f raw -o "$out/gil-first.raw" -- python3 -m earth2studio_compile.tools.bench \
      workflow --jobs dlwp-ens-all --io overlapped --ways warm --fresh-repeats 1 \
      --no-eager --no-floor --cache-from /tmp/built-dlwp --deadline 200 \
      --json "$out/dlwp-gil-first.json" --workdir /tmp/wf >"$out/dlwp-gil-first.log" 2>&1
    gzip "$out/gil-first.raw"
    python3 docs/bench/2026-11-28-h100-seventeenth/spy_digest.py \
      "$out/gil-first.raw.gz" --depth 4 --process '"run": "compiled"' \
      >"$out/gil-first-digest.txt"
    head -60 "$out/gil-first-digest.txt"
    ;;
  fcn3-gpu)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/fcn3 .whl-fcn3/*.whl
    python3 -c "import torch_harmonics as th, torch_harmonics.disco as d; \
print(th.__version__, {k: getattr(d, k)() for k in dir(d) if k.endswith('_is_available')})"
    PYTHONPATH=/tmp/fcn3:$PYTHONPATH timeout 480 python3 -m pytest -m gpu -q \
      -p no:cacheprovider test/tools/zoo/test_fcn3.py -rA \
      --junitxml="$out/fcn3-gpu.xml" 2>&1 | grep -E "PASS|FAIL|Error|passed|failed|compiled" | tail -20
    ;;
  *) echo "phase: memory, fcn3-gpu or gil-first (the others: the paths above)" >&2; exit 2 ;;
esac
