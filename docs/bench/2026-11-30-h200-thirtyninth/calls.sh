#!/usr/bin/env bash
# The next session's device calls (written after this session's device time, not
# run yet). Prefix as the thirtieth's (wheels and model wheels into /tmp/site,
# PYTHONPATH, the bench commit); carry [".whl", ".shim", ".whl-models"].
#
#   bash docs/bench/2026-11-30-h200-thirtyninth/calls.sh "$OUT" aurora-math    # ~500 s
#   bash docs/bench/2026-11-30-h200-thirtyfifth/calls.sh "$OUT" calls dlesym   # twice
#   bash docs/bench/2026-11-30-h200-thirtyfifth/calls.sh "$OUT" calls fcn3
#
# aurora-math: issue 33's Aurora lead (README here). Eager with PyTorch's default
#   attention (the memory-efficient kernel in fp32, upstream's), eager with SDPA's
#   math path (two TF32 batched matmuls and a softmax: a user could choose it too),
#   and compiled with the math path, each in its own process, background builds
#   off, 3 profiled steps each. Read:
#   the compiled step's attention and GEMM families against the thirty-seventh's
#   605.8 ms (attention 212.2), and the regions' TF32 error against fp32 eager
#   (the WARNINGs of the log; level_agg's 1.9e-2 is known).
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  aurora-math)
    EARTH2STUDIO_COMPILE_BACKGROUND=off timeout 150 python3 -m \
      earth2studio_compile.tools.bench.kernels --models aurora --precision tf32 \
      --runs eager --steps 3 --json "$out/kernels-aurora-tf32-eager.json" \
      >"$out/kernels-aurora-tf32-eager.log" 2>&1
    echo "eager rc=$?"
    grep -v INFO "$out/kernels-aurora-tf32-eager.log" | tail -8
    # A user can take the math path eagerly too: the baseline is the faster one.
    EARTH2STUDIO_COMPILE_BACKGROUND=off timeout 150 python3 \
      docs/bench/2026-11-30-h200-thirtyninth/sdpa_math.py --models aurora \
      --precision tf32 --runs eager --steps 3 \
      --json "$out/kernels-aurora-tf32-eager-math.json" \
      >"$out/kernels-aurora-tf32-eager-math.log" 2>&1
    echo "eager (math attention) rc=$?"
    grep -v INFO "$out/kernels-aurora-tf32-eager-math.log" | tail -8
    EARTH2STUDIO_COMPILE_BACKGROUND=off timeout 280 python3 \
      docs/bench/2026-11-30-h200-thirtyninth/sdpa_math.py --models aurora \
      --precision tf32 --runs compiled --steps 3 \
      --json "$out/kernels-aurora-tf32-compiled-math.json" \
      >"$out/kernels-aurora-tf32-compiled-math.log" 2>&1
    echo "compiled (math attention) rc=$?"
    grep -v INFO "$out/kernels-aurora-tf32-compiled-math.log" | tail -16
    ;;
  *) echo "phase: aurora-math" >&2; exit 2 ;;
esac
