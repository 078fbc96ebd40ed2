#!/usr/bin/env bash
# The next session's device calls (the eighteenth ran writes6, `build`, DLWP's
# seven variables on disk, compile=True on a plain ZarrBackend and the IO GPU
# tests; see README.md here). One phase per device call, chained on one warm
# machine (/tmp stays while it is held; it goes back after 30 minutes held, so a
# phase that needs /tmp/built-* runs in the same hold as `build`). Every call
# first installs the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl [.whl-models/*.whl]
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"], plus ".whl-spy" for gil, ".whl-models" and
# ".whl-dlesym" for dlesym-gpu. In this order, as device time allows (1800 s,
# counted in full: about four calls of 400 s with the machine's start):
#   bash docs/bench/2026-11-28-h100-eighteenth/next_calls.sh "$OUT" contention  # ~100 s
#   bash docs/bench/2026-11-28-h100-eighteenth/next_calls.sh "$OUT" gpu-io      # ~60 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build        # ~380 s
#   bash docs/bench/2026-11-28-h100-eighteenth/next_calls.sh "$OUT" gil         # ~150 s
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" dlwp-disk  # ~330 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" rows fcn     # ~450 s
#   bash docs/bench/2026-11-27-h100-sixteenth/next_calls.sh "$OUT" dlesym-gpu  # ~250 s (+141 s)
#
# contention: contention.py here, no model and no build: is the workflow's thread
#   slowed by the GIL (its CPU time well under its wall time) or by the device,
#   with OverlappedIO writing DLWP-shaped steps to disk, and which lever moves it
#   (the switch interval, fewer writer threads, one device gather per step).
# gpu-io: the GPU-marked IO tests (6ccbb89's gather on the device among them:
#   test_cuda_interleaved_views_are_gathered_by_the_device_in_one_copy); chain it
#   with contention in one call.
# gil: the DLWP on-disk compile=True row alone (--no-eager: the eighteenth's ran
#   only upstream's eager row before its deadline) under `py-spy --idle --native`
#   (100 Hz; a thread waiting for the GIL shows `take_gil`), with the bench's new
#   thread_cpu_s beside its thread_s.
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-28-h100-eighteenth
case "$phase" in
  contention)
    timeout 300 python3 "$here/contention.py" "$out" 2>&1 | grep -v DEBUG
    ;;
  gpu-io)
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider test/io \
      --junitxml="$out/gpu-io.xml" 2>&1 | tail -5
    ;;
  gil)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/spy .whl-spy/*.whl
    /tmp/spy/bin/py-spy record -r 100 --idle --native --threads --subprocesses \
      -f raw -o "$out/gil-dlwp-disk.raw" -- python3 -m earth2studio_compile.tools.bench \
      workflow --jobs dlwp-ens-all --io overlapped --ways warm --fresh-repeats 1 \
      --no-floor --no-eager --cache-from /tmp/built-dlwp --deadline 300 \
      --json "$out/dlwp-ens-all-gil.json" --workdir /tmp/wf >"$out/dlwp-ens-all-gil.log" 2>&1
    gzip "$out/gil-dlwp-disk.raw"
    sed -n '/Whole call/,/^$/p' "$out/dlwp-ens-all-gil.log"
    python3 docs/bench/2026-11-28-h100-seventeenth/spy_digest.py \
      "$out/gil-dlwp-disk.raw.gz" --depth 4 --process '"run": "compiled"' \
      >"$out/gil-dlwp-disk-digest.txt"
    head -60 "$out/gil-dlwp-disk-digest.txt"
    ;;
  *) echo "phase: contention, gpu-io or gil (the others: the paths above)" >&2; exit 2 ;;
esac
