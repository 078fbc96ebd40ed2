#!/usr/bin/env bash
# This session's device calls after the GPU suite (README.md). Prefix: wheels into
# /tmp/site and PYTHONPATH=/tmp/site:$PWD/.shim:$PWD, as the forty-second's.
#
#   bash docs/bench/2026-12-02-h200-fortyseventh/calls.sh "$OUT" stormcast  # ~200 s
#     carry [".whl", ".shim", ".whl-models"]: the published StormCast test alone,
#     every call timed alike (same_speed), after the GPU suite found its denoiser
#     slower beside three other test processes.
#   bash docs/bench/2026-12-02-h200-fortyseventh/calls.sh "$OUT" fcn3-probe-oom  # ~420 s
#     carry [".whl", ".shim", ".whl-fcn3", ".whl-thcuda"], wheels installed as the
#     forty-fifth's FCN3 calls: the forty-first's fcn3-build, then in the same
#     call FCN3's 20-step calls through OverlappedIO, upstream's eager (a fresh
#     process) and compile=True (a fresh process, warm): whether the decoder's
#     probe now stops at its eager call's out-of-memory error and the forecast
#     stays compiled (abdabe2), and its whole call against eager's.
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  stormcast)
    timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEsxX \
      test/tools/zoo/test_stormcast.py --junitxml="$out/stormcast.xml" \
      >"$out/stormcast.log" 2>&1
    echo "rc=$?"
    tail -4 "$out/stormcast.log"
    ;;
  fcn3-probe-oom)
    bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$out" fcn3-build | tail -3
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/fcn3 .whl-fcn3/*.whl .whl-thcuda/*.whl
    export PYTHONPATH="/tmp/fcn3:$PYTHONPATH"
    timeout 300 python3 -m earth2studio_compile.tools.bench workflow \
      --jobs det:fcn3 --steps 20 --io overlapped-memory --ways warm \
      --repeats 1 --no-floor --timeout 140 --deadline 150 \
      --cache-from /tmp/built-fcn3 --json "$out/fcn3-probe-oom.json" \
      >"$out/fcn3-probe-oom.log" 2>&1
    echo "rc=$?"
    sed -n '/Whole call/,/^$/p' "$out/fcn3-probe-oom.log" | cut -c1-300
    grep -E "probe stops|WARNING" "$out/fcn3-probe-oom.log" | cut -c1-400 | tail -8
    ;;
  *) echo "phase: stormcast or fcn3-probe-oom" >&2; exit 2 ;;
esac
