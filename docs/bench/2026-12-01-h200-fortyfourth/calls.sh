#!/usr/bin/env bash
# The next session's device calls written after this session's device time (not
# run yet). Prefix as the thirtieth's (wheels into /tmp/site, PYTHONPATH, the
# bench commit); this phase needs torch alone (carry []).
#
#   bash docs/bench/2026-12-01-h200-fortyfourth/calls.sh "$OUT" precompile-cuda  # ~150 s
#
# precompile-cuda (issue 33: a warm process's Dynamo-path first call is Dynamo's
#   trace, seconds a Swin stage with flex): dynamo_precompile.py on CUDA with
#   Inductor's CUDA graphs, flex (its torch 2.11 load inside a tracing context,
#   WORKAROUND=1) and SDPA, each mode a fresh process, one Inductor cache per
#   attention. Read: whether save and load work with CUDA graphs on torch 2.11,
#   the load's seconds against the warm torch.compile's, the rel. L2 of the
#   loaded function's first and second calls, and with other weights (SEED=1).
set -uo pipefail
out="$1"
phase="$2"
script=docs/bench/2026-12-01-h200-fortyfourth/dynamo_precompile.py
case "$phase" in
  precompile-cuda)
    export DEVICE=cuda
    for attention in flex sdpa; do
      export ATTENTION=$attention TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$attention
      export WORKAROUND=$([ "$attention" = flex ] && echo 1 || echo 0)
      export SAVED=/tmp/precompiled-$attention.bin
      log="$out/dynamo-precompile-cuda-$attention.log"
      for mode in plain plain save load; do
        timeout 120 python3 "$script" "$mode" >>"$log" 2>&1
        echo "$attention $mode rc=$?" >>"$log"
      done
      SEED=1 timeout 60 python3 "$script" load >>"$log" 2>&1
      echo "$attention load SEED=1 rc=$?" >>"$log"
      grep -E "^torch |second call|rc=|Error:" "$log"
    done
    ;;
  *) echo "phase: precompile-cuda" >&2; exit 2 ;;
esac
