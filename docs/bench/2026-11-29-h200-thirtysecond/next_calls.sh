#!/usr/bin/env bash
# The next device session's calls (written after the thirty-second's device time).
# Prefix as the thirtieth's (wheels and model wheels into /tmp/site, PYTHONPATH, the
# bench commit); carry [".whl", ".shim", ".whl-models"].
#
#   bash docs/bench/2026-11-29-h200-thirtysecond/next_calls.sh "$OUT" gpu      # ~540 s
#   bash docs/bench/2026-11-29-h200-thirtysecond/next_calls.sh "$OUT" fcn-ens  # ~500 s
#   bash docs/bench/2026-11-29-h200-thirtysecond/next_calls.sh "$OUT" repro    # ~80 s
#
# gpu: the GPU-marked suite. Expected: test_published_aurora_on_the_gpu_matches_eager
#   XPASS (strict: reported failed), meaning the Swin patch fixed all eight
#   regions: lift Aurora's CUDA refusal in models.py and drop the xfail. Also runs
#   the side-stream, pinned-buffer and the patched-block GPU tests.
# fcn-ens: issue 34's target 3 row, as the thirty-first planned.
# repro: roll_repro.py, a PyTorch-only reproduction attempt of the wrong block
#   (growing pieces after the first roll), for a report to PyTorch; if even its
#   fourth piece matches eager, the block's adaptive norms and MLP are needed too.
set -uo pipefail
out="$1"
phase="$2"
case "$phase" in
  gpu)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl-models/*.whl
    timeout 580 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider -rfEsxX \
      --junitxml="$out/gpu-suite.xml" >"$out/gpu-suite.log" 2>&1
    tail -6 "$out/gpu-suite.log"
    ;;
  fcn-ens)
    bash docs/bench/2026-11-29-cpu-thirtyfirst/next_calls.sh "$out" fcn-ens
    ;;
  repro)
    timeout 300 python3 docs/bench/2026-11-29-h200-thirtysecond/roll_repro.py \
      "$out/roll-repro.json" >"$out/roll-repro.log" 2>&1
    grep '^{' "$out/roll-repro.log"
    ;;
  *) echo "phase: gpu, fcn-ens or repro" >&2; exit 2 ;;
esac
