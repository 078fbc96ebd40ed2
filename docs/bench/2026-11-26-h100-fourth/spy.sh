python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/spy .whl-spy/*.whl
export PYTHONPATH=/tmp/site:$PWD/.shim:$PWD PYTHONUNBUFFERED=1
ONLY=overlapped-8 /tmp/spy/bin/py-spy record -r 250 --gil --threads --nonblocking -f raw -o $OUT/gil.raw -- python3 docs/bench/2026-11-26-h100-fourth/writes.py $OUT/gil 2>&1 | grep -v DEBUG | tail -4
ONLY=overlapped-8 /tmp/spy/bin/py-spy record -r 250 --threads --nonblocking -f raw -o $OUT/cpu.raw -- python3 docs/bench/2026-11-26-h100-fourth/writes.py $OUT/cpu 2>&1 | grep -v DEBUG | tail -4
