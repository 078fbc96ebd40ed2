#!/usr/bin/env bash
# The fourteenth session's device calls, and the next session's (one phase per
# device call, chained on one warm machine: /tmp stays between calls while it is
# held; idle release 30 s; give the machine back after the last call).
#
# Run by the fourteenth session (after 6a3bef3, chunks.store_local):
#   bash docs/bench/2026-11-27-h100-fourteenth/next_calls.sh "$OUT" writes      # ~230 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" rows overlapped
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" rows async-zarr
#
# For the next session, in this order (carry [".whl", ".shim"], plus ".whl-dlesym"
# for dlesym, ".whl-spy" for spy):
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" dlesym    # ~300 s
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" build fcn    # ~230 s
#   bash docs/bench/2026-11-27-h100-fourteenth/next_calls.sh "$OUT" spy       # ~150 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" rows async-zarr  # ~450 s
#
# writes: writes5.py (OverlappedIO's local writes against Zarr's files by hand, 8
#   and 16 threads, and with store_local turned off), then the FCN ensemble's
#   compiled cache built into /tmp/built-fcn for the rows (twelfth next_calls.sh).
# dlesym: DLESyM's published GPU test with the exclude back (58ced69) and the
#   module-state fix (7aa2c29): every output held, no WARNING, no CUDA graphs where
#   a ConvGRUBlock keeps state; it has not passed on a GPU yet.
# spy: the compiled FCN row through OverlappedIO under py-spy --idle --threads:
#   its model steps blocked on the writers 0.43-0.45 s while writes5.py stored the
#   same bytes at about 5 GB/s alone; where do the lanes and the put pool wait
#   (the device-to-host copy, upstream's write on the stand-in, the files)?
# rows async-zarr: three pairs of upstream eager / compile=True on
#   AsyncZarrBackend (the fourteenth session's deadline left one): settles the
#   factor of two over upstream's median.
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-27-h100-fourteenth
case "$phase" in
  writes)
    timeout 200 python3 "$here/writes5.py" "$out" 2>&1 | grep -v DEBUG
    bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$out" build fcn
    ;;
  spy)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/spy .whl-spy/*.whl
    /tmp/spy/bin/py-spy record -r 100 --idle --threads --subprocesses --nonblocking \
      -f raw -o "$out/spy-ov.raw" -- python3 -m earth2studio_compile.tools.bench \
      workflow --jobs fcn-ens --io overlapped --ways warm --fresh-repeats 1 \
      --no-floor --source prefetched --cache-from /tmp/built-fcn --deadline 300 \
      --json "$out/fcn-ens-ov-spy.json" --workdir /tmp/wf >"$out/fcn-ens-ov-spy.log" 2>&1
    gzip "$out/spy-ov.raw"
    sed -n '/Whole call/,/^$/p' "$out/fcn-ens-ov-spy.log"
    ;;
  *) echo "phase: writes or spy" >&2; exit 2 ;;
esac
