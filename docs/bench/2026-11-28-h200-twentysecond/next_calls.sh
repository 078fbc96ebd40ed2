#!/usr/bin/env bash
# The twenty-third session's device calls (issues 34 and 33; README.md here has this
# session's). One phase per device call, chained on one warm machine (/tmp stays
# while it is held). Every call first installs the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"] (fcn3-gpu: also ".whl-fcn3", from
# `bash .ci/fetch-fcn3-wheels.sh`).
# In order, one hold (about 1600 s in all: drop the last where time is short):
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build        # ~260 s
#   bash docs/bench/2026-11-28-h200-twentysecond/next_calls.sh "$OUT" first-run # ~200 s
#   bash docs/bench/2026-11-28-cpu-writers/next_calls.sh "$OUT" writers         # ~130 s
#   bash docs/bench/2026-11-28-cpu-writers/next_calls.sh "$OUT" writers-mw4     # ~130 s
#   bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$OUT" memory     # ~360 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" fcn         # ~350 s
#   bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$OUT" fcn3-gpu   # ~150 s?
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" dlwp-disk  # ~270 s
# first-run: what the region's first call spends its time on (first_run.py here,
#   DLWP then FCN, each in the first process after the build, under torch.profiler
#   over every thread): DLWP's artifact's first run took 0.33-0.37 s of GIL this
#   session (FCN's 0.07-0.08): kernel loading, cuDNN's plans for its convolutions,
#   or something else? That decides the first step's lever.
# writers, memory, fcn, dlwp-disk: after 27e982f (a local directory's step is one
#   job, its chunks taken by the put threads from one batch; on the 2-core CPU a
#   quarter fewer context switches, time within the noise, a fresh store not
#   faster), against this session's rows at 648d77c (the writers at plain threads'
#   rate on 16 cores, three times their context switches; the workflow's thread
#   waiting for the GIL). If 27e982f is slower there, revert it (one merge).
#   writers-mw4: the same rows with 4 put threads.
# fcn3-gpu (issue 33): the zoo's FCN3 at its published size (not run this session).
# py-spy --gil at 200 Hz --native slowed the twenty-second's compiled process past
#   its deadline: sample at 50 Hz without --native if it is tried again.
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-28-h200-twentysecond
case "$phase" in
  first-run)
    for model in dlwp fcn; do
      rm -rf /tmp/first-cache && cp -r "/tmp/built-$model" /tmp/first-cache
      EARTH2STUDIO_COMPILE_CACHE=/tmp/first-cache MODEL=$model timeout 280 \
        python3 "$here/first_run.py" "$out" 2>&1 | grep -v DEBUG | head -80
    done
    ;;
  *) echo "phase: first-run (the others: the paths above)" >&2; exit 2 ;;
esac
