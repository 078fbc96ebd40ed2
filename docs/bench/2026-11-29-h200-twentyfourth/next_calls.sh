#!/usr/bin/env bash
# The twenty-fifth session's device calls (issue 34's FCN target, issue 33's FCN3;
# README.md here has this session's). One or two phases per device call, chained on
# one warm machine (/tmp stays while it is held). Every call first installs the
# wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
#   export EARTH2STUDIO_COMPILE_BENCH_COMMIT=<the commit of the tree sent>
# carry [".whl", ".shim"] (spy: also ".whl-spy"; th-cuda: also ".whl-fcn3" and
# ".whl-thcuda", from `bash .ci/build-th-cuda-wheel.sh`).
# In order, one hold (about 1600 s):
#   bash docs/bench/2026-11-27-h100-twelfth/next_calls.sh "$OUT" build fcn   # ~160 s
#   bash docs/bench/2026-11-29-h200-twentyfourth/next_calls.sh "$OUT" convoy # ~100 s
#   bash docs/bench/2026-11-28-h100-nineteenth/next_calls.sh "$OUT" fcn      # ~220 s
#   bash docs/bench/2026-11-29-h200-twentyfourth/next_calls.sh "$OUT" switch # ~150 s
#   bash docs/bench/2026-11-27-h100-fourteenth/next_calls.sh "$OUT" spy      # ~150 s
#   bash docs/bench/2026-11-29-h200-twentyfourth/next_calls.sh "$OUT" th-cuda  # ~150 s
# convoy, switch (issue 34, target 3): FCN's steady state is 1.44x its compute
#   floor, DLWP's at its storage floor. FCN's workflow thread spends ~27 ms of CPU a
#   step in Python, DLWP's ~7; every chunk's four system calls hand the GIL back to
#   a put thread only when the thread running Python is made to drop it (the 5 ms
#   switch interval). convoy.py: OverlappedIO's writes of FCN-sized steps beside a
#   loop that sleeps, hashes (a core, not the GIL) or runs Python (both) 27 ms a
#   step, at the default interval and at 0.2 ms. switch: the compiled FCN row and
#   eager + OverlappedIO again with --switch-interval 0.0002. If Python-busy
#   slows the writes and the short interval brings FCN's steady state to its
#   floor, the library sets the interval for a compile=True call (restored after):
#   `git am docs/bench/2026-11-29-h200-twentyfourth/switchinterval.patch` (made and
#   CPU-tested this session, not merged: io/switching.py, wired into run.py), then
#   nineteenth `fcn` again on it.
# th-cuda (issue 33): the PyPI torch-harmonics 0.9.2 wheel has DISCO kernels for
#   the CPU only (FCN3's published GPU test failed on it). This session's pip build
#   of the tagged source with CUDA kernels ran past 380 s at its disco step 5 of 7
#   (then the attention extension: 14 more). Here: the wheel
#   `bash .ci/build-th-cuda-wheel.sh` builds on the CPU machine (which has nvcc),
#   carried in `.whl-thcuda`, installed, then FCN3's GPU test.
set -uo pipefail
out="$1"
phase="$2"
here=docs/bench/2026-11-29-h200-twentyfourth
case "$phase" in
  convoy)
    H=721 W=1440 STEPS=20 MS=27 REPEAT=2 WAYS=none,hash,python BASE=/tmp/convoy \
      timeout 300 python3 "$here/convoy.py" "$out" 2>&1 | grep '^{'
    ;;
  switch)
    python3 -m earth2studio_compile.tools.bench workflow --jobs fcn-ens \
      --io overlapped --ways warm --fresh-repeats 1 --no-floor --switch-interval 0.0002 \
      --source prefetched --cache-from /tmp/built-fcn --deadline 400 \
      --json "$out/fcn-ens-switch.json" --workdir /tmp/wf >"$out/fcn-ens-switch.log" 2>&1
    sed -n '/Whole call/,/^$/p' "$out/fcn-ens-switch.log" | tail -6
    ;;
  th-cuda)
    ls .whl-thcuda/*.whl >/dev/null 2>&1 ||
      { echo "carry .whl-thcuda (bash .ci/build-th-cuda-wheel.sh)" >&2; exit 3; }
    python3 -m pip install -q --no-index --no-deps --target /tmp/thcuda .whl-thcuda/*.whl
    export PYTHONPATH=/tmp/thcuda:$PYTHONPATH
    bash docs/bench/2026-11-28-h200-twentyfirst/next_calls.sh "$out" fcn3-gpu
    ;;
  *) echo "phase: convoy, switch or th-cuda (the others: the paths above)" >&2; exit 2 ;;
esac
