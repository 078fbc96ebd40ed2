#!/usr/bin/env bash
# One device call: wheels, then the parts named in $@ (tests-aot, tests-rest, fcn, dlwp,
# fcn-tf32, ensemble-fcn), each logging under $OUT. Run from the repository root.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
B="python3 -m earth2studio_compile.tools.bench --steps 40 --e2e-steps 0 --timeout 400"
for part in "$@"; do
  start=$(date +%s)
  case $part in
    tests-aot) python3 -m pytest -m gpu -q -p no:cacheprovider -k "aot or held or cudagraph" 2>&1 | tail -15 > $OUT/gpu-tests-aot.log ;;
    tests-rest) python3 -m pytest -m gpu -q -p no:cacheprovider -k "not (aot or held or cudagraph)" 2>&1 | tail -15 > $OUT/gpu-tests-rest.log ;;
    fcn) $B --models fcn --aot --no-warm --json $OUT/bench-fcn-aot.json > $OUT/bench-fcn-aot.log 2>&1 ;;
    dlwp) $B --models dlwp --aot --no-warm --json $OUT/bench-dlwp-aot.json > $OUT/bench-dlwp-aot.log 2>&1 ;;
    fcn-tf32) $B --models fcn --aot --no-warm --precision tf32 --json $OUT/bench-fcn-tf32-aot.json > $OUT/bench-fcn-tf32-aot.log 2>&1 ;;
    ensemble-fcn) python3 -m earth2studio_compile.tools.bench --models fcn --ensemble 16 --steps 40 --batch-size 16 --precision bf16 --no-precision-eager --json $OUT/ensemble-fcn.json --timeout 300 > $OUT/ensemble-fcn.log 2>&1 ;;
  esac
  echo "$part rc=$? $(( $(date +%s) - start )) s" | tee -a $OUT/parts.txt
done
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee -a $OUT/gpu.txt
