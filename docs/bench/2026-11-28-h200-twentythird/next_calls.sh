#!/usr/bin/env bash
# The twenty-fourth session's device calls (issues 34 and 33; README.md here has
# this session's). One phase per device call, chained on one warm machine (/tmp
# stays while it is held). Every call first installs the wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"] (fcn3-gpu: also ".whl-fcn3").
# In order, one hold (about 1500 s; drop from the end where time is short):
#   bash docs/bench/2026-11-27-h100-fifteenth/next_calls.sh "$OUT" build        # ~300 s
#   bash docs/bench/2026-11-28-h200-twentysecond/next_calls.sh "$OUT" first-run # ~65 s
#   bash docs/bench/2026-11-28-h100-seventeenth/next_calls.sh "$OUT" dlwp-disk  # ~150 s
#   bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$OUT" memory     # ~190 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" fcn         # ~220 s
#   timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 test \
#     --junitxml="$OUT/gpu-suite.xml"                                           # ~310 s
#   bash docs/bench/2026-11-28-h200-twentythird/next_calls.sh "$OUT" th-cuda    # ~400 s?
#   bash docs/bench/2026-11-27-h100-fourteenth/next_calls.sh "$OUT" spy         # ~150 s
# build, first-run, dlwp-disk, memory: after the convolution warm-up (helper
#   convwarm: the artifact's convolutions recorded at the build and replayed on
#   empty tensors, the GIL free, before its first run). Read first-run's DLWP
#   phases (`warm_convolutions`, then `first_run`: 0.29-0.40 s here) and
#   `fetch_data` in the compiled rows' first step (0.71-0.88 s here, eager's
#   0.34-0.46). If the first run did not shorten, the plans did not match: rerun
#   gil_probe.py with a longer timeout (its param-warm child did not run here).
# fcn: FCN's artifact has one convolution; its rows check nothing got slower.
#   FCN's steady state is 1.44x its compute floor here, the workflow waiting 0.77 s
#   for free host buffers: its writes ran at ~5.3 GB/s in the call against the
#   chunk floor's 12.3 (DLWP's reach their floor). spy (carry also ".whl-spy"):
#   py-spy --idle --threads over the compiled FCN call: are the put threads busy
#   all along, or waiting (for the GIL, for copies)?
# th-cuda (issue 33; carry [".whl", ".shim", ".whl-fcn3", ".whl-thsrc"], the last
#   from `bash .ci/fetch-th-cuda-source.sh`): the PyPI torch-harmonics 0.9.2 wheel
#   runs DISCO only on the CPU, so FCN3's published GPU test failed here; build
#   0.9.2 with its CUDA kernels on the machine (if it has nvcc), then that test.
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  th-cuda)
    command -v nvcc || { echo "no nvcc on this machine: no CUDA build" >&2; exit 3; }
    python3 -m pip install -q --no-index --no-deps --target /tmp/thbuild .whl-thsrc/*.whl
    start=$(date +%s)
    PYTHONPATH=/tmp/thbuild:$PYTHONPATH SETUPTOOLS_SCM_PRETEND_VERSION=0.9.2 \
      TORCH_HARMONICS_BUILD_CUDA_EXTENSION=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 \
      timeout 420 python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/thw \
      .whl-thsrc/torch-harmonics-0.9.2.tar.gz 2>&1 | tail -20
    echo "built in $(($(date +%s) - start)) s"; ls -la /tmp/thw
    python3 -m pip install -q --no-index --no-deps --target /tmp/thcuda /tmp/thw/*.whl
    export PYTHONPATH=/tmp/thcuda:$PYTHONPATH
    bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$out" fcn3-gpu
    ;;
  *) echo "phase: th-cuda (the others: the paths above)" >&2; exit 2 ;;
esac
