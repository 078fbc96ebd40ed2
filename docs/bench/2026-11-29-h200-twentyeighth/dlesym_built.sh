#!/usr/bin/env bash
# DLESyM's 20-step whole call once its background builds have ended (the
# twenty-seventh's dlesym phase ran every process while the first one's builds
# still ran: each compiled call ran eagerly beside them). Carry [".whl", ".shim",
# ".whl-dlesym", ".whl-e2g"]; prefix as the twenty-seventh README's.
#
#   bash docs/bench/2026-11-29-h200-twentyeighth/dlesym_built.sh "$OUT"
set -uo pipefail
calls_py=docs/bench/2026-11-29-h200-twentyseventh/dlesym_calls.py
out="$1"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl-dlesym/*.whl .whl-e2g/*.whl
cache=/tmp/dlesym-cache
rm -rf "$cache"
calls=(python3 "$calls_py" "$out/dlesym-built.json")
quiet() { grep -v -e DEBUG -e Warning -e warn; }
timeout 100 "${calls[@]}" --run eager --label "fresh, eager" 2>&1 | quiet
# The cold process waits for the builds it launched as its session closed.
EARTH2STUDIO_COMPILE_CACHE=$cache timeout 400 "${calls[@]}" --run compiled \
  --label "fresh, empty cache" --wait-builds 330 2>&1 | quiet
EARTH2STUDIO_COMPILE_CACHE=$cache timeout 100 "${calls[@]}" --run compiled \
  --label "fresh, warm cache" 2>&1 | quiet
EARTH2STUDIO_COMPILE_CACHE=$cache timeout 120 "${calls[@]}" --way second \
  --label "calls in one process" 2>&1 | quiet
