#!/usr/bin/env bash
# The next session's device calls (the seventeenth ran writes5, `build`, DLWP's
# seven variables on disk, the FCN rows under py-spy and the GPU suite; see
# README.md here). One phase per device call, chained on one warm machine (/tmp
# stays while it is held; it goes back after 30 minutes held, so a phase that needs
# /tmp/built-* runs in the same hold as `build`). Every call first installs the
# wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl [.whl-models/*.whl]
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"], plus ".whl-spy" for gil, ".whl-models" and
# ".whl-dlesym" (and ".whl-e2g" where a session has the earth2grid wheel) for
# dlesym-gpu. In this order, as device time allows (1800 s, counted in full: about
# four calls of 400 s with the machine's start):
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" writes6     # ~90 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build        # ~380 s
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" dlwp-disk   # ~330 s
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" plain       # ~450 s
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" gil         # ~150 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" rows fcn     # ~450 s
#   bash docs/bench/2026-11-27-h100-sixteenth/next_calls.sh "$OUT" dlesym-gpu   # ~250 s (+141 s without .whl-e2g)
#
# writes6: writes6.py here: Zarr's file pattern by hand with its directories made
#   before the clock and without the rename, against OverlappedIO with and without
#   the directories made ahead (353790b), and with the clock started once they are
#   all made (the writes alone).
# dlwp-disk: issue 34's second target again at HEAD (the directories made ahead),
#   the sixteenth's phase (needs `build` first: /tmp/built-dlwp).
# plain: compile=True on a plain ZarrBackend (b50ac5d wraps it in OverlappedIO for
#   the call) against upstream eager on it: the FCN ensemble on disk and the DLWP
#   ensemble in memory, one fresh process a row (needs `build` first).
# gil: the DLWP on-disk compile=True row under `py-spy --idle --native` (100 Hz,
#   native frames: a thread waiting for the GIL shows `take_gil`): in the
#   seventeenth session its workflow thread spent 1.5 s in the model's iterator and
#   1.2 s in io.write after the first step (0.3-0.8 and 0.1 in memory with 3
#   variables, 2 ms a write against 25 here): is it waiting for the GIL while the
#   writers run, or for the device (its copies queued on the caller's stream)?
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-28-h100-seventeenth
case "$phase" in
  writes6)
    timeout 240 python3 "$here/writes6.py" "$out" 2>&1 | grep -v DEBUG
    ;;
  dlwp-disk) bash docs/bench/2026-11-27-h100-sixteenth/next_calls.sh "$out" dlwp-disk ;;
  plain)
    # The sources of the sixteenth session's rows of each job.
    for job in fcn-ens:zarr-disk:fcn:prefetched dlwp-ens:memory-zarr:dlwp:random; do
      IFS=: read -r name io model source <<<"$job"
      python3 -m earth2studio_compile.tools.bench workflow --jobs "$name" --io "$io" \
        --ways warm --fresh-repeats 1 --no-floor --source "$source" \
        --cache-from "/tmp/built-$model" \
        --deadline 240 --json "$out/$name-plain.json" --workdir /tmp/wf \
        >"$out/$name-plain.log" 2>&1
      sed -n '/Whole call/,/^$/p' "$out/$name-plain.log" | tail -4
    done
    ;;
  gil)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/spy .whl-spy/*.whl
    /tmp/spy/bin/py-spy record -r 100 --idle --native --threads --subprocesses \
      -f raw -o "$out/gil-dlwp-disk.raw" -- python3 -m earth2studio_compile.tools.bench \
      workflow --jobs dlwp-ens-all --io overlapped --ways warm --fresh-repeats 1 \
      --no-floor --cache-from /tmp/built-dlwp --deadline 300 \
      --json "$out/dlwp-ens-all-gil.json" --workdir /tmp/wf >"$out/dlwp-ens-all-gil.log" 2>&1
    gzip "$out/gil-dlwp-disk.raw"
    sed -n '/Whole call/,/^$/p' "$out/dlwp-ens-all-gil.log"
    python3 "$here/spy_digest.py" "$out/gil-dlwp-disk.raw.gz" --depth 4 \
      --process '"run": "compiled"' >"$out/gil-dlwp-disk-digest.txt"
    head -60 "$out/gil-dlwp-disk-digest.txt"
    ;;
  *) echo "phase: writes6, dlwp-disk, plain or gil (the others: the paths above)" >&2; exit 2 ;;
esac
