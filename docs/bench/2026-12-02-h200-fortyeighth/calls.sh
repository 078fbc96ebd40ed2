#!/usr/bin/env bash
# This session's FCN3 call after the artifact payoff rule (README.md). Prefix:
# wheels $(ls .whl/*.whl | grep -v torch_harmonics) .whl-fcn3/*.whl
# .whl-thcuda/*.whl into /tmp/site, PYTHONPATH=/tmp/site:$PWD/.shim:$PWD, the
# bench commit; carry [".whl", ".shim", ".whl-fcn3", ".whl-thcuda"].
#
#   bash docs/bench/2026-12-02-h200-fortyeighth/calls.sh "$OUT" fcn3-payoff  # ~330 s
#
# fcn3-payoff: the forty-first's fcn3-build (its time_speed now keeps each
#   artifact's payoff figures), then FCN3's 20-step compile=True call through
#   OverlappedIO in a fresh process from that cache, alone (--no-eager: the
#   session's device time could not hold the two eager rows as well; eager with
#   OverlappedIO took 21.79 s in this session's call 3, same commit for its path).
#   Read: which regions the rule ran eagerly (the JSON's summary: their reason
#   names the artifact's cost), the whole call against 21.79 s.
#
#   bash docs/bench/2026-12-02-h200-fortyeighth/calls.sh "$OUT" fcn3-rows  # ~540 s
#
# fcn3-rows (next session; after fcn3-payoff on the same machine, whose build it
#   reads from /tmp/built-fcn3): upstream eager, eager through OverlappedIO and
#   compile=True through it, two fresh processes each in alternating rounds: whether
#   a compile=True call whose regions the payoff rule runs eagerly costs what
#   eager does, on one machine (call 4 here: 23.13 s against another machine's
#   21.79). Each region's first call says what deciding took (phase "payoff").
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  fcn3-payoff)
    bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$out" fcn3-build | tail -3
    # Whether the built cache could travel as a carry folder (64 MiB a call) and
    # spare later sessions the build's ~250 s of device time.
    du -sh /tmp/built-fcn3 /tmp/built-fcn3/* 2>/dev/null | sort -h | tail -6
    export PYTHONPATH="/tmp/fcn3:$PYTHONPATH"
    timeout 240 python3 -m earth2studio_compile.tools.bench workflow \
      --jobs det:fcn3 --steps 20 --io overlapped-memory --ways warm \
      --repeats 1 --no-floor --no-eager --timeout 200 --deadline 230 \
      --cache-from /tmp/built-fcn3 --json "$out/fcn3-payoff.json" \
      >"$out/fcn3-payoff.log" 2>&1
    echo "rc=$?"
    sed -n '/Whole call/,/^$/p' "$out/fcn3-payoff.log" | cut -c1-400
    grep -E "WARNING" "$out/fcn3-payoff.log" | cut -c1-300 | tail -4
    ;;
  fcn3-rows)
    test -f /tmp/built-fcn3/done || echo "no build on this machine: rows may compile" >&2
    export PYTHONPATH="/tmp/fcn3:$PYTHONPATH"
    timeout 580 python3 -m earth2studio_compile.tools.bench workflow \
      --jobs det:fcn3 --steps 20 --io overlapped-memory --ways warm \
      --repeats 1 --fresh-repeats 2 --no-floor --timeout 150 --deadline 560 \
      --cache-from /tmp/built-fcn3 --json "$out/fcn3-rows.json" \
      >"$out/fcn3-rows.log" 2>&1
    echo "rc=$?"
    sed -n '/Whole call/,/^$/p' "$out/fcn3-rows.log" | cut -c1-400
    ;;
  *) echo "phase: fcn3-payoff or fcn3-rows" >&2; exit 2 ;;
esac
