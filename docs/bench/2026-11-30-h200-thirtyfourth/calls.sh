#!/usr/bin/env bash
# This session's device calls. Prefix as the thirtieth's (wheels and model wheels
# into /tmp/site, PYTHONPATH, the bench commit); carry [".whl", ".shim", ".whl-models"].
#
#   bash docs/bench/2026-11-30-h200-thirtyfourth/calls.sh "$OUT" io-tf32  # ran 515 s
#   bash docs/bench/2026-11-30-h200-thirtyfourth/calls.sh "$OUT" aurora-tf32  # ~330 s
#
# io-tf32: the two GPU io tests that failed in call 1 (the side-stream copy's
#   test raced its quarter-second hold-up with three other test processes; the
#   pinned count test saw the first one's buffer freed mid-test), three times
#   each, then the published Aurora's per-step rollout in TF32 (each region's
#   speed probe: issue 33's backbone target in the same precision). It ran out of
#   its 400 s before the compiled row.
# aurora-tf32: that rollout alone (next session's; the compiled row needs ~210 s
#   after the two eager rows' ~160 s).
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  io-tf32)
    for i in 1 2 3; do
      timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
        test/io/test_host.py test/io/test_pinned.py >>"$out/io-tests.log" 2>&1
      echo "io tests, run $i: rc=$?" | tee -a "$out/io-tests.log"
    done
    tail -4 "$out/io-tests.log"
    timeout 400 python3 -m earth2studio_compile.tools.bench --models aurora \
      --precision tf32 --no-warm --steps 11 --e2e-steps 0 --timeout 330 \
      --json "$out/aurora-tf32-rollout.json" >"$out/aurora-tf32.log" 2>&1
    grep -v INFO "$out/aurora-tf32.log" | tail -14
    ;;
  aurora-tf32)
    timeout 540 python3 -m earth2studio_compile.tools.bench --models aurora \
      --precision tf32 --no-warm --steps 11 --e2e-steps 0 --timeout 400 \
      --json "$out/aurora-tf32-rollout.json" >"$out/aurora-tf32.log" 2>&1
    grep -v INFO "$out/aurora-tf32.log" | tail -14
    ;;
  *) echo "phase: io-tf32 or aurora-tf32" >&2; exit 2 ;;
esac
