#!/usr/bin/env bash
# The next session's device calls (written after this session's device time, not
# run yet). Prefix as the thirtieth's (wheels into /tmp/site, PYTHONPATH, the
# bench commit); carry [".whl", ".shim", ".whl-models"] unless a phase says.
#
#   bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$OUT" fcn3-build       # ~550 s
#   bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$OUT" fcn3-calls       # ~300 s
#   bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$OUT" aurora-autotune  # ~500 s
#   bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$OUT" swin-attention   # ~120 s
#   bash docs/bench/2026-11-30-h200-fortyfirst/calls.sh "$OUT" aurora-decompose # ~330 s
#
# fcn3-build, fcn3-calls (issue 33, "never slower" for FCN3): carry [".whl",
#   ".shim", ".whl-fcn3", ".whl-thcuda"] (not .whl-models: 64 MiB; the prefix's
#   pip line without it). .whl-fcn3 from .ci/fetch-fcn3-wheels.sh; .whl-thcuda
#   from .ci/build-th-cuda-wheel.sh (7 min here with VENV=/tmp/fa-venv; its source
#   from .ci/fetch-th-cuda-source.sh with a local mirror of NVIDIA/torch-harmonics
#   where GitHub cannot be reached). This session's cold row (compile=True 23.73 s
#   against eager 32.33 s) left its 17 regions' builds to the background, which
#   outlasted the bench's wait. So build first, in a call of its own (a build cut
#   off keeps the artifacts it finished: call fcn3-build again on the same, warm
#   machine and it goes on), then the warm and second rows from that cache.
# aurora-autotune (issue 33, Aurora's TF32 backbone at 1.35x, two thirds of the
#   compiled step in GEMMs): the compiled row with Inductor's GEMM autotuning
#   (Triton templates against cuBLAS for every mm/bmm shape) on top of the table's
#   choice; CUDA graphs kept. Read: GEMM ms against 350.34, the fp32 FFMA and
#   sm80 s1688 kernels (small batched matmuls) gone or not, the cold compile's
#   length (the process's wall), and the step against 532.41 ms (1b652ea).
# aurora-decompose (issue 33): the compiled row with Inductor's decompose_mm_pass
#   (post_grad_fusion_options), which turns batched matmuls with a first dimension
#   of 10240 or more and two of m, n, k under 32 into fused multiply-sums: the
#   Perceiver's latent-level attention (4 latent levels against 13 pressure
#   levels, one small matmul per patch and head) is that shape. Read: the fp32
#   FFMA GEMMs (17.50 + 9.15 ms at 1b652ea) gone or not, and the step.
# swin-attention (issue 33, the same 1.35x): one attention call of each of
#   Aurora's Swin stages, eager SDPA, compiled on the math path (the table's
#   choice) and compiled through FlexAttention (swin_attention.py here; tried on
#   the CPU at 1% of the windows: all three within 5e-7 of fp32). If flex beats
#   the math path by tens of ms a step (the compiled step's attention-shaped
#   cutlass GEMMs 46 ms and fused softmax 26 ms), a "flex" attention choice
#   (a TorchFunctionMode routing SDPA in traced code) is worth building: the
#   Dynamo path traced it without a break on torch 2.11 (CPU, 6e-7 from eager).
#   Artifacts would need more: non-strict export of a score_mod that reads the
#   mask from its closure fails ("fake tensor in the exported program
#   constant's list", pytorch #169975's kind); calling the flex_attention HOP
#   with the mask as its score_mod buffer and a block mask made before the
#   export exports right, but AOTInductor's compile of it then fails
#   ("Attempting to use FunctionalTensor on its own", pytorch #140400).
set -uo pipefail
out="$1"
phase="$2"
fcn3_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/fcn3 .whl-fcn3/*.whl .whl-thcuda/*.whl
  export PYTHONPATH="/tmp/fcn3:$PYTHONPATH"
}
# Aurora's compiled TF32 row with Inductor OPTIONS (beside the table's SDPA
# choice), background builds off: aurora_compiled NAME LIMIT OPTIONS
aurora_compiled() {
  EARTH2STUDIO_COMPILE_BACKGROUND=off timeout "$2" python3 -m \
    earth2studio_compile.tools.bench.kernels --models aurora --precision tf32 \
    --runs compiled --steps 3 --options "$3" \
    --json "$out/kernels-aurora-tf32-compiled-$1.json" \
    >"$out/kernels-aurora-tf32-compiled-$1.log" 2>&1
  echo "rc=$?"
  grep -v INFO "$out/kernels-aurora-tf32-compiled-$1.log" | tail -16
}
case "$phase" in
  fcn3-build)
    fcn3_wheels
    EARTH2STUDIO_COMPILE_CACHE=/tmp/built-fcn3 timeout 540 python3 -m \
      earth2studio_compile.tools.build fcn3 --size full --precision tf32 \
      >>"$out/build-fcn3.log" 2>&1
    rc=$?
    echo "build rc=$rc"
    test $rc = 0 && touch /tmp/built-fcn3/done
    grep -v INFO "$out/build-fcn3.log" | tail -20
    ;;
  fcn3-calls)
    fcn3_wheels
    test -f /tmp/built-fcn3/done || echo "the build did not finish: rows may compile" >&2
    timeout 560 python3 -m earth2studio_compile.tools.bench workflow \
      --jobs det:fcn3 --steps 20 --io memory-zarr --ways warm,second \
      --repeats 1 --no-floor --timeout 260 --deadline 500 \
      --cache-from /tmp/built-fcn3 --json "$out/fcn3-calls.json" \
      >"$out/fcn3-calls.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/fcn3-calls.log"
    ;;
  aurora-autotune)
    aurora_compiled autotune 560 '{"max_autotune_gemm": true, "triton.cudagraphs": true}'
    ;;
  aurora-decompose)
    aurora_compiled decompose 400 \
      '{"post_grad_fusion_options": {"decompose_mm_pass": {}}, "triton.cudagraphs": true}'
    ;;
  swin-attention)
    timeout 300 python3 docs/bench/2026-11-30-h200-fortyfirst/swin_attention.py \
      "$out/swin-attention.json" 2>&1 | grep -v Warning | tail -24
    ;;
  *) echo "phase: fcn3-build, fcn3-calls, aurora-autotune, aurora-decompose or swin-attention" >&2; exit 2 ;;
esac
