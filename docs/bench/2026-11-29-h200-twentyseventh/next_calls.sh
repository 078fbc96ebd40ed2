#!/usr/bin/env bash
# The next session's calls (written after this session's device time, not run yet).
# Prefix as this README's (wheels into /tmp/site, PYTHONPATH, the bench commit).
#
#   bash docs/bench/2026-11-29-h200-twentyseventh/next_calls.sh "$OUT" gpu   # ~200 s
#   bash docs/bench/2026-11-29-h200-twentyseventh/next_calls.sh "$OUT" ace2  # ~300 s?
#   bash docs/bench/2026-11-29-h200-twentyseventh/next_calls.sh "$OUT" dlesym  # ~450 s?
#
# gpu: the GPU-marked suite at the commit sent (carry [".whl", ".shim"]): the
#   payoff figures (artifacts/payoff.py) on every Dynamo-path region's first call.
# ace2 (carry [".whl", ".shim", ".whl-ace2"]): ACE2's published GPU test at cfe0bcd
#   or later (its opaque count mended, not re-run), then its 20-step calls in the
#   three ways the brief names, eager beside each: a fresh process with an empty
#   cache (compiles, and its probe's figures are kept: aot/payoff/), a fresh
#   process with that cache (its first call should run eagerly: "compiling would
#   not pay for itself in this call"), and calls in one process. No `tools.build`:
#   it builds nothing for ACE2 (opaque submodules need the Dynamo path).
# dlesym (carry [".whl", ".shim", ".whl-dlesym", ".whl-e2g"]): DLESyM's 20-step
#   whole call, the loop of Earth2Studio's DLESyM example (upstream's deterministic
#   fails on it, eager too), dlesym_calls.py here: a fresh eager process, then
#   compiled in a fresh process with an empty cache, again with that cache, and
#   eager/compiled calls in one process (the payoff figures the first compiled
#   process kept turn regions that cannot pay eager from their first call).
set -uo pipefail
here=docs/bench/2026-11-29-h200-twentyseventh
out="$1"
phase="$2"
case "$phase" in
  gpu)
    timeout 420 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider -rfEs \
      --junitxml="$out/gpu-suite.xml" >"$out/gpu-suite.log" 2>&1
    tail -3 "$out/gpu-suite.log"
    ;;
  ace2)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/ace2 .whl-ace2/*.whl
    export PYTHONPATH=/tmp/ace2:$PYTHONPATH
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
      --junitxml="$out/ace2-gpu.xml" test/tools/zoo/test_ace2.py >"$out/ace2-gpu.log" 2>&1
    tail -3 "$out/ace2-gpu.log"
    python3 -m earth2studio_compile.tools.bench workflow --jobs det:ace2 --steps 20 \
      --io memory-zarr --ways cold,warm,second --repeats 2 --no-floor --timeout 300 \
      --deadline 360 --json "$out/ace2-calls.json" >"$out/ace2-calls.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/ace2-calls.log"
    ;;
  dlesym)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl-dlesym/*.whl .whl-e2g/*.whl
    cache=/tmp/dlesym-cache
    rm -rf "$cache" "$out/dlesym-calls.json"
    calls=(python3 "$here/dlesym_calls.py" "$out/dlesym-calls.json")
    timeout 120 "${calls[@]}" --run eager --label "fresh, eager"
    EARTH2STUDIO_COMPILE_CACHE=$cache timeout 300 "${calls[@]}" --run compiled \
      --label "fresh, empty cache"
    EARTH2STUDIO_COMPILE_CACHE=$cache timeout 150 "${calls[@]}" --run compiled \
      --label "fresh, warm cache"
    EARTH2STUDIO_COMPILE_CACHE=$cache timeout 200 "${calls[@]}" --way second \
      --label "calls in one process"
    ;;
  *) echo "phase: gpu, ace2 or dlesym" >&2; exit 2 ;;
esac
