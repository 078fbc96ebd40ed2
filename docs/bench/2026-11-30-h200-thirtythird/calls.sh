#!/usr/bin/env bash
# This session's device calls. Prefix as the thirtieth's (wheels and model wheels
# into /tmp/site, PYTHONPATH, the bench commit); carry [".whl", ".shim", ".whl-models"].
#
#   bash docs/bench/2026-11-30-h200-thirtythird/calls.sh "$OUT" aurora-calls  # ~590 s
#   bash docs/bench/2026-11-30-h200-thirtythird/calls.sh "$OUT" aurora-bf16   # ~420 s
#
# The next session's (written after this one's device time, not run yet):
#   bash docs/bench/2026-11-30-h200-thirtythird/calls.sh "$OUT" gpu           # ~400 s
#   bash docs/bench/2026-11-30-h200-thirtythird/calls.sh "$OUT" aurora-ovio   # ~590 s
#   bash docs/bench/2026-11-29-h200-thirtysecond/next_calls.sh "$OUT" fcn-ens  # ~500 s
#
# gpu: the GPU-marked suite at the commit sent (run it first in any session whose
#   commits touch a region's call path).
# aurora-ovio: aurora-calls with eager + OverlappedIO beside (--io
#   overlapped-memory): how much of compile=True's gain is writing.
# aurora-calls: issue 33's 20-step deterministic calls of the published Aurora,
#   TF32, with CUDA no longer refused: tools.build into a cache, then a fresh
#   process with that cache (warm) and calls in one process (second), eager
#   beside each. In one call because the cache lives only on this machine.
# aurora-bf16: the per-step rollout in bf16 (accuracy against fp32 eager after
#   step 1, each region's speed probe) with the Swin patch, the stages' code now
#   without torch.roll.
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  aurora-calls)
    rm -rf /tmp/built-aurora
    EARTH2STUDIO_COMPILE_CACHE=/tmp/built-aurora timeout 270 python3 -m \
      earth2studio_compile.tools.build aurora --size full --precision tf32 \
      >"$out/build-aurora.log" 2>&1
    echo "build rc=$?"
    grep -v INFO "$out/build-aurora.log" | tail -12
    timeout 310 python3 -m earth2studio_compile.tools.bench workflow --jobs det:aurora \
      --steps 20 --io memory-zarr --ways warm,second --repeats 2 --no-floor \
      --timeout 280 --deadline 290 --cache-from /tmp/built-aurora \
      --json "$out/aurora-calls.json" >"$out/aurora-calls.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/aurora-calls.log"
    ;;
  gpu)
    timeout 580 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider -rfEsxX \
      --junitxml="$out/gpu-suite.xml" >"$out/gpu-suite.log" 2>&1
    tail -6 "$out/gpu-suite.log"
    ;;
  aurora-ovio)
    rm -rf /tmp/built-aurora
    EARTH2STUDIO_COMPILE_CACHE=/tmp/built-aurora timeout 250 python3 -m \
      earth2studio_compile.tools.build aurora --size full --precision tf32 \
      >"$out/build-aurora.log" 2>&1
    echo "build rc=$?"
    timeout 330 python3 -m earth2studio_compile.tools.bench workflow --jobs det:aurora \
      --steps 20 --io overlapped-memory --ways warm,second --repeats 1 --no-floor \
      --timeout 300 --deadline 310 --cache-from /tmp/built-aurora \
      --json "$out/aurora-ovio.json" >"$out/aurora-ovio.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/aurora-ovio.log"
    ;;
  aurora-bf16)
    timeout 560 python3 -m earth2studio_compile.tools.bench --models aurora \
      --precision bf16 --no-warm --steps 11 --e2e-steps 0 --timeout 330 \
      --json "$out/aurora-bf16-rollout.json" >"$out/aurora-bf16.log" 2>&1
    grep -v INFO "$out/aurora-bf16.log" | tail -14
    ;;
  *) echo "phase: aurora-calls, aurora-bf16, gpu or aurora-ovio" >&2; exit 2 ;;
esac
