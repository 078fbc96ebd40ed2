#!/usr/bin/env bash
# The next session's device calls (the nineteenth ran contention, build, gil,
# DLWP's seven variables on disk and the FCN ensemble on disk at da38751; see
# README.md here). One phase per device call, chained on one warm machine (/tmp
# stays while it is held; it goes back after 30 minutes held, so the rows run in
# the same hold as `build`). Every call first installs the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"]. In this order, as device time allows (1800 s, counted
# in full):
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build        # ~430 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" hint        # ~10 s, same call
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" dlwp-disk  # ~300 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" fcn         # ~500 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" steady      # ~120 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" procs       # ~70 s
#
# hint: the hints build() now leaves (40bd880) beside its artifacts: with them
#   the compiled rows' first call runs ahead of the workflow's (their region
#   phases gain ahead_wait or ahead_eager; the first step loses the artifact's
#   first run, 0.39 s of DLWP's and 0.29 s of FCN's at da38751).
# fcn: the FCN ensemble on disk (issue 34's third target) with both of its
#   baselines in one run: upstream eager on ZarrBackend and on AsyncZarrBackend
#   ("≥ 2x upstream eager with AsyncZarrBackend"), eager + OverlappedIO, and
#   compile=True on each, with the floors.
# steady: steady.py here: FCN's compiled call again under torch.profiler, after a
#   first call in the same process (cache: a copy of /tmp/built-fcn): which CUDA
#   calls block the workflow's thread each step, and from where.
# procs: contention.py's rows that the da38751 run did not reach or lost
#   (procs-disk, its ring now in /dev/shm) beside ov-disk and threads-disk: do
#   writer processes move the bytes at plain threads' rate, leaving the loop's
#   thread alone?
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  hint)
    for model in fcn dlwp; do
      echo "$model: $(find "/tmp/built-$model" -path '*hints*' -name '*.json' | wc -l) hint(s)"
      find "/tmp/built-$model" -path '*hints*' -name '*.json' -exec cat {} \; -exec echo \;
    done
    ;;
  fcn)
    python3 -m earth2studio_compile.tools.bench workflow --jobs fcn-ens \
      --io overlapped,async-zarr --ways warm --fresh-repeats 1 \
      --source prefetched --cache-from /tmp/built-fcn --deadline 560 \
      --json "$out/fcn-ens.json" --workdir /tmp/wf >"$out/fcn-ens.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/fcn-ens.log" | tail -8
    ;;
  steady)
    rm -rf /tmp/steady-cache && cp -r /tmp/built-fcn /tmp/steady-cache
    EARTH2STUDIO_COMPILE_CACHE=/tmp/steady-cache timeout 400 python3 \
      docs/bench/2026-11-28-h100-nineteenth/steady.py "$out" 2>&1 | grep -v DEBUG | tail -60
    ;;
  procs)
    ROWS=procs-disk,ov-disk,threads-disk timeout 300 python3 \
      docs/bench/2026-11-28-h100-eighteenth/contention.py "$out" 2>&1 | grep -v DEBUG
    ;;
  *) echo "phase: hint, fcn, steady or procs (the others: the paths above)" >&2; exit 2 ;;
esac
