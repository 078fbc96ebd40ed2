#!/usr/bin/env bash
# The fifteenth session's device calls after its first four (which ran the
# fourteenth session's list: build fcn + spy, rows async-zarr, dlesym, the GPU
# suite). One phase per device call, chained on one warm machine (/tmp stays
# between calls while it is held; idle release 30 s; give the machine back after
# the last call). Every call first installs the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl [.whl-models/*.whl] [.whl-dlesym/*.whl]
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
#   (the device's .git is stale; the bench JSONs record this instead)
# carry [".whl", ".shim"], plus ".whl-dlesym" and ".whl-models" for dlesym.
#
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build        # ~380 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" rows fcn     # ~400 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" rows dlwp    # ~300 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" dlesym       # ~450 s
#
# Run by the fifteenth session: dlesym (variants no_nvtx, opaque_both, table; the
# deadline left two), `build fcn` (twelfth) and `rows fcn`. For the next session,
# in this order on one machine (carry ".whl-spy" for spy; ".whl-e2g", which holds
# the earth2grid wheel call 5 built, with ".whl-dlesym" and ".whl-models" for
# dlesym-gpu: no build):
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build         # ~380 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" spy           # ~150 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" pairs         # ~380 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" rows fcn      # ~450 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" rows dlwp     # ~300 s
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" dlesym-gpu    # ~250 s
#   bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$OUT" gpu          # ~420 s
# (the GPU suite last ran at dd5f796: before the seal in build(), the directory
# change and quiet_nvtx; carry ".whl-models" for it)
#
# build: tools.build for the FCN (batch 4) and DLWP (batch 8) ensembles into
#   /tmp/built-MODEL; since 8c2cb5c the build verifies each artifact against eager
#   and seals it, so the warm rows' first call runs no eager call beside it.
# rows fcn: the FCN ensemble on disk, upstream eager on ZarrBackend, eager +
#   OverlappedIO and compile=True + OverlappedIO in two fresh processes each, the
#   floors (the thirteenth next_calls.sh's `rows overlapped`).
# rows dlwp: the DLWP ensemble in memory (issue 34's first target), upstream eager
#   on ZarrBackend and through OverlappedIO, compile=True, warm, two each.
# spy: the compiled FCN row through OverlappedIO under py-spy --idle --threads
#   again, after the seal and the directory change: are the put threads busy all
#   the way from the first step (the writes bound the call: 4.7 GB/s in it)?
# pairs, then rows fcn on the same machine: upstream eager on AsyncZarrBackend
#   (three fresh processes) beside compile=True + OverlappedIO (two), issue 34's
#   factor of two measured side by side (this session's were on two machines).
# dlesym-gpu: DLESyM's published GPU test with the nvtx ranges quieted in its
#   whole regions (the earth2grid wheel from .whl-e2g, no build).
# dlesym: earth2grid built from third_party/, then dlesym_probe.py: the table's
#   DLESyM entry against opaque paddings and against physicsnemo's pads without
#   their nvtx ranges (the suspected break), with Dynamo's graph-break and
#   recompile reasons (the published GPU test failed at dd5f796: ocean regions fell back at a
#   recompile storm, the atmosphere's ~44 tiny regions ran slower than eager).
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-27-h100-fifteenth
bench="python3 -m earth2studio_compile.tools.bench workflow"
case "$phase" in
  build)
    bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$out" build fcn
    bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$out" build dlwp
    grep -h "verified" "$out"/build-*.log
    ;;
  rows)
    case "${3:-fcn}" in
      fcn) bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$out" rows overlapped ;;
      dlwp)
        $bench --jobs dlwp-ens --io overlapped-memory --ways warm --fresh-repeats 2 \
          --cache-from /tmp/built-dlwp --deadline 540 \
          --json "$out/dlwp-ens.json" --workdir /tmp/wf >"$out/dlwp-ens.log" 2>&1
        sed -n '/Whole call/,/^$/p' "$out/dlwp-ens.log" | tail -8
        ;;
      *) echo "rows: fcn or dlwp" >&2; exit 2 ;;
    esac
    ;;
  dlesym)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .whl-dlesym/*.whl
    start=$(date +%s)
    TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 bash .ci/build-earth2grid.sh /tmp/e2g-whl \
      >"$out/earth2grid-build.log" 2>&1
    echo "earth2grid built: exit $? in $(($(date +%s) - start)) s"
    # The wheel's name has a "+": it does not come back as a file of its own.
    tar -C /tmp/e2g-whl -cf "$out/earth2grid-whl.tar" .
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      /tmp/e2g-whl/*.whl
    timeout 420 python3 "$here/dlesym_probe.py" "$out" --deadline 300 \
      --variants no_nvtx,opaque_both,table,opaque_v2,no_exclude 2>&1 | grep -v DEBUG | tail -30
    ;;
  spy) bash docs/bench/2026-11-27-h100-fourteenth/next_calls.sh "$out" spy ;;
  pairs) bash docs/bench/2026-11-27-h100-thirteenth/next_calls.sh "$out" rows async-zarr ;;
  dlesym-gpu)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .whl-dlesym/*.whl .whl-e2g/*.whl
    timeout 540 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
      --durations=5 --junitxml="$out/dlesym.xml" test/tools/zoo/test_dlesym.py \
      >"$out/dlesym.log" 2>&1
    echo "exit $?"
    tail -30 "$out/dlesym.log"
    ;;
  *) echo "phase: build, rows, spy, pairs, dlesym-gpu or dlesym" >&2; exit 2 ;;
esac
