#!/usr/bin/env bash
# The next session's calls (written after this session's device time, not run yet).
# Prefix as the twenty-seventh README's (wheels into /tmp/site, PYTHONPATH, the
# bench commit).
#
#   bash docs/bench/2026-11-29-h200-twentyeighth/next_calls.sh "$OUT" gpu    # ~260 s
#   bash docs/bench/2026-11-29-h200-twentyeighth/next_calls.sh "$OUT" ace2   # ~300 s?
#   bash docs/bench/2026-11-29-h200-twentyeighth/next_calls.sh "$OUT" ace2-build  # ~250 s?
#
# gpu: the GPU-marked suite at the commit sent (carry [".whl", ".shim"]).
# ace2 (carry [".whl", ".shim", ".whl-ace2"]): ACE2's published GPU test, then its
#   20-step calls the three ways from an empty cache. Since 661ca75 the cold
#   process runs the region eagerly ("no figures yet ...") and a background process
#   judges its compile as the session closes (artifacts/judge.py); the bench's cold
#   row waits for it (background_wait_s), so the warm process decides from its
#   figures. Expected: every compiled row no slower than eager.
# ace2-build (same carry): `tools.build ace2` judges the region in its own process
#   (c67df27: status "judged", the figures' break-even steps), then the calls
#   from a copy of that cache (--cache-from): the fresh process eager from its
#   first call.
set -uo pipefail
out="$1"
phase="$2"
install_ace2() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/ace2 .whl-ace2/*.whl
  export PYTHONPATH=/tmp/ace2:$PYTHONPATH
}
calls() {  # $1: JSON name; the rest: more bench arguments
  local name="$1"
  shift
  python3 -m earth2studio_compile.tools.bench workflow --jobs det:ace2 --steps 20 \
    --io memory-zarr --repeats 2 --no-floor --timeout 300 --deadline 360 \
    --json "$out/$name.json" "$@" >"$out/$name.log" 2>&1
  sed -n '/Whole call/,/^$/p' "$out/$name.log"
}
case "$phase" in
  gpu)
    timeout 420 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider -rfEs \
      --junitxml="$out/gpu-suite.xml" >"$out/gpu-suite.log" 2>&1
    tail -3 "$out/gpu-suite.log"
    ;;
  ace2)
    install_ace2
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
      --junitxml="$out/ace2-gpu.xml" test/tools/zoo/test_ace2.py >"$out/ace2-gpu.log" 2>&1
    tail -3 "$out/ace2-gpu.log"
    calls ace2-calls --ways cold,warm,second
    ;;
  ace2-build)
    install_ace2
    export EARTH2STUDIO_COMPILE_CACHE=/tmp/built-ace2
    rm -rf /tmp/built-ace2
    timeout 200 python3 -m earth2studio_compile.tools.build ace2 --size full \
      --precision tf32 >"$out/build-ace2.log" 2>&1
    tail -3 "$out/build-ace2.log"
    unset EARTH2STUDIO_COMPILE_CACHE
    calls ace2-built-calls --ways warm,second --cache-from /tmp/built-ace2
    ;;
  *) echo "phase: gpu, ace2 or ace2-build" >&2; exit 2 ;;
esac
