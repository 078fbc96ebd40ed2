#!/usr/bin/env bash
# This session's device calls after the first four (README.md). Prefix as the
# thirtieth's (wheels into /tmp/site, PYTHONPATH, the bench commit).
#
#   bash docs/bench/2026-12-01-h200-fortythird/calls.sh "$OUT" fcn3-verify      # ~330 s
#   bash docs/bench/2026-12-01-h200-fortythird/calls.sh "$OUT" aurora-flex-tune # ~500 s, next
#   bash docs/bench/2026-12-01-h200-fortythird/calls.sh "$OUT" aurora-flex-calls # ~500 s, next
#   bash docs/bench/2026-12-01-h200-fortythird/calls.sh "$OUT" fcn3-kernels      # ~400 s, next
#
# fcn3-verify (the crash of this session's fcn3-calls): carry [".whl", ".shim",
#   ".whl-fcn3", ".whl-thcuda"], the pip line without .whl-models. FCN3's encoder
#   artifacts (torch-harmonics' DISCO contraction, a custom operator with an
#   autocast kernel, called through AOTInductor's proxy executor) ran under the
#   wrapper's bf16 autocast in every later process: the warm row ended with an
#   illegal memory access. With the runner's autocast off (this commit), build
#   as before, then one warm row of 10 steps from that cache: read that it ends,
#   and that the encoders ran their artifacts.
# aurora-flex-tune (next session; issue 33, Aurora's TF32 backbone at 1.47x a
#   call with "flex,math", GEMMs 312 of its 506 ms a step): the compiled row of
#   the forty-second's aurora-flex with Inductor's GEMM autotuning (Triton
#   templates against cuBLAS for every mm/bmm shape; never run before) on top,
#   CUDA graphs kept, background builds off. Read: GEMM ms against 311.99, the
#   step against 506.09 ms, the cold compile's length (the process's wall).
# aurora-flex-calls (next session; whether the table should take "flex,math"
#   for Aurora): 20-step calls with the choice, the three ways (cold: the
#   regions eager while background judges compile and time them on the Dynamo
#   path, no artifact being possible; warm: those figures and Inductor's cache;
#   second: one process) against upstream's eager, as the table's math path was
#   measured (thirty-third: models-aurora-calls-h200).
# fcn3-kernels (next session; issue 33's kernel split where a model's gain is
#   small): carry as fcn3-verify. FCN3's TF32 step by kernel family, eager and
#   compiled (background builds off: compiled here on the paths a session takes),
#   to say why its blocks run slower compiled (AOT 0.96x a call, the Dynamo
#   path's judge slower too) and where its step goes (DISCO, SHT, GEMM).
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  fcn3-verify)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/fcn3 .whl-fcn3/*.whl .whl-thcuda/*.whl
    export PYTHONPATH="/tmp/fcn3:$PYTHONPATH"
    EARTH2STUDIO_COMPILE_CACHE=/tmp/built-fcn3 timeout 200 python3 -m \
      earth2studio_compile.tools.build fcn3 --size full --precision tf32 \
      >"$out/build-fcn3-verify.log" 2>&1
    echo "build rc=$?"
    grep -v "INFO\|DEBUG" "$out/build-fcn3-verify.log" | cut -c1-200 | tail -20
    timeout 120 python3 -m earth2studio_compile.tools.bench workflow \
      --jobs det:fcn3 --steps 10 --io memory-zarr --ways warm --no-eager --precision tf32 \
      --repeats 1 --no-floor --timeout 110 --deadline 115 \
      --cache-from /tmp/built-fcn3 --json "$out/fcn3-verify.json" \
      >"$out/fcn3-verify.log" 2>&1
    echo "calls rc=$?"
    sed -n '/Whole call/,/^$/p' "$out/fcn3-verify.log" | cut -c1-250
    ;;
  aurora-flex-tune)
    EARTH2STUDIO_COMPILE_BACKGROUND=off timeout 580 python3 -m \
      earth2studio_compile.tools.bench.kernels --models aurora --precision tf32 \
      --runs compiled --steps 3 --attention flex,math \
      --options '{"max_autotune_gemm": true, "triton.cudagraphs": true}' \
      --json "$out/kernels-aurora-tf32-compiled-flex-tune.json" \
      >"$out/kernels-aurora-tf32-compiled-flex-tune.log" 2>&1
    echo "rc=$?"
    grep -v INFO "$out/kernels-aurora-tf32-compiled-flex-tune.log" | tail -18
    ;;
  aurora-flex-calls)
    timeout 580 python3 -m earth2studio_compile.tools.bench workflow \
      --jobs det:aurora --steps 20 --io memory-zarr --ways cold,warm,second \
      --repeats 1 --no-floor --timeout 240 --deadline 540 \
      --attention flex,math --json "$out/aurora-flex-calls.json" \
      >"$out/aurora-flex-calls.log" 2>&1
    echo "rc=$?"
    sed -n '/Whole call/,/^$/p' "$out/aurora-flex-calls.log" | cut -c1-250
    ;;
  fcn3-kernels)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/fcn3 .whl-fcn3/*.whl .whl-thcuda/*.whl
    export PYTHONPATH="/tmp/fcn3:$PYTHONPATH"
    EARTH2STUDIO_COMPILE_BACKGROUND=off timeout 580 python3 -m \
      earth2studio_compile.tools.bench.kernels --models fcn3 --precision tf32 \
      --runs eager,compiled --steps 3 --json "$out/kernels-fcn3-tf32.json" \
      >"$out/kernels-fcn3-tf32.log" 2>&1
    echo "rc=$?"
    grep -v INFO "$out/kernels-fcn3-tf32.log" | tail -18
    ;;
  *) echo "phase: fcn3-verify, aurora-flex-tune, aurora-flex-calls or fcn3-kernels" >&2; exit 2 ;;
esac
