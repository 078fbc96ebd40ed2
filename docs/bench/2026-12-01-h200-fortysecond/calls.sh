#!/usr/bin/env bash
# This session's later device calls (the first four ran the forty-first's calls.sh:
# README.md). Prefix as the thirtieth's (wheels into /tmp/site, PYTHONPATH, the
# bench commit); carry [".whl", ".shim", ".whl-models"].
#
#   bash docs/bench/2026-12-01-h200-fortysecond/calls.sh "$OUT" aurora-flex  # ~300 s
#   bash docs/bench/2026-12-01-h200-fortysecond/calls.sh "$OUT" gpu          # ~360 s
#   bash docs/bench/2026-12-01-h200-fortysecond/calls.sh "$OUT" flex-rollout # ~400 s, next
#
# aurora-flex (issue 33, Aurora's TF32 backbone at 1.35x): the compiled row of
#   the forty-first's aurora-table call (532.41 ms a step at 1b652ea, attention on
#   SDPA's math path) with the attention choice "flex,math": the Swin stages'
#   window attention through FlexAttention (swin-attention, this session: 1.7-1.9x
#   a call over the compiled math path), the Perceiver's 4-by-13-level attention
#   on the math path as before. Background builds off, so it compiles here on the
#   Dynamo path (no artifact can hold FlexAttention). Read: the step against
#   532.41 ms, the statuses (a region whose compiled first call differs from
#   eager falls back, and says so), the attention-shaped cutlass GEMMs (46 ms) and
#   the fused softmax (26 ms) gone.
# gpu: the GPU-marked suite at this commit (FlexAttention's routing and the
#   build's per-region opaque test are CPU tests; this is the zero-wrong-answers
#   check of the tree as a whole).
# flex-rollout (next session; issue 33's measure of the backbone): the forty-first's
#   Aurora TF32 rollout (call 4 there: the six Swin stages 1.35x a call on the
#   math path) with --attention flex,math for its compiled row: each region's
#   probe (compiled calls alternating with eager ones) and the relative L2 after
#   step 1 against fp32 eager.
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  aurora-flex)
    EARTH2STUDIO_COMPILE_BACKGROUND=off timeout 560 python3 -m \
      earth2studio_compile.tools.bench.kernels --models aurora --precision tf32 \
      --runs compiled --steps 3 --attention flex,math \
      --json "$out/kernels-aurora-tf32-compiled-flex.json" \
      >"$out/kernels-aurora-tf32-compiled-flex.log" 2>&1
    echo "rc=$?"
    grep -v INFO "$out/kernels-aurora-tf32-compiled-flex.log" | tail -18
    ;;
  gpu)
    timeout 580 python3 -m pytest -m gpu -n 4 --dist loadgroup -q \
      -p no:cacheprovider -rfEsxX --junitxml="$out/gpu-suite.xml" \
      >"$out/gpu-suite.log" 2>&1
    tail -6 "$out/gpu-suite.log"
    ;;
  flex-rollout)
    timeout 560 python3 -m earth2studio_compile.tools.bench --models aurora \
      --precision tf32 --no-warm --steps 11 --e2e-steps 0 --timeout 400 \
      --attention flex,math --json "$out/aurora-tf32-flex-rollout.json" \
      >"$out/aurora-tf32-flex-rollout.log" 2>&1
    echo "rc=$?"
    grep -v INFO "$out/aurora-tf32-flex-rollout.log" | tail -24
    ;;
  *) echo "phase: aurora-flex, gpu or flex-rollout" >&2; exit 2 ;;
esac
