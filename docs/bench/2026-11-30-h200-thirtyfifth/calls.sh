#!/usr/bin/env bash
# The next session's device calls (written after this session's device time, not
# run yet). Prefix as the thirtieth's (wheels and model wheels into /tmp/site,
# PYTHONPATH, the bench commit); carry [".whl", ".shim", ".whl-models"].
#
#   bash docs/bench/2026-11-30-h200-thirtyfifth/calls.sh "$OUT" io-first        # ~120 s
#   bash docs/bench/2026-11-30-h200-thirtyfifth/calls.sh "$OUT" aurora-kernels  # ~420 s
#   bash docs/bench/2026-11-30-h200-thirtythird/calls.sh "$OUT" gpu             # ~430 s
#
# io-first: the side-stream copy's GPU test as the first test of a fresh process,
#   where this session's suite ran it (-n 4, worker gw3): at c7a5b5a (the file as
#   it was, which failed there) and at the tree sent (one step without the
#   hold-up first, so CUDA has loaded the step's kernels before the hold-up).
#   Each three times.
# aurora-kernels: where the published Aurora's TF32 step goes, eager and compiled
#   (issue 33: the backbone's TF32 ratio against the share of GEMM and attention
#   that compiling leaves as it is). Background builds off, so the compiled run
#   compiles in its process.
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  io-first)
    test_id=test_cuda_copies_run_on_a_side_stream_behind_a_snapshot
    # The test as c7a5b5a had it: without the warm step, three side copies.
    sed -e '/# One step without the hold-up first/,/    del warm/d' \
      -e 's/side_copies == 4/side_copies == 3/' test/io/test_host.py \
      >test/io/test_host_before.py
    for i in 1 2 3; do
      timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
        "test/io/test_host_before.py::$test_id" >>"$out/io-first-before.log" 2>&1
      echo "c7a5b5a, run $i: rc=$?" | tee -a "$out/io-first-before.log"
      timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
        "test/io/test_host.py::$test_id" >>"$out/io-first.log" 2>&1
      echo "tree sent, run $i: rc=$?" | tee -a "$out/io-first.log"
    done
    rm -f test/io/test_host_before.py
    ;;
  aurora-kernels)
    EARTH2STUDIO_COMPILE_BACKGROUND=off timeout 560 python3 -m \
      earth2studio_compile.tools.bench.kernels --models aurora --precision tf32 \
      --steps 3 --json "$out/kernels-aurora-tf32.json" \
      >"$out/kernels-aurora-tf32.log" 2>&1
    grep -v INFO "$out/kernels-aurora-tf32.log" | tail -16
    ;;
  *) echo "phase: io-first or aurora-kernels" >&2; exit 2 ;;
esac
