"""Each Aurora region's first-call phases on the Dynamo path with the "flex,math"
attention choice: the small zoo Aurora on the CPU, a 3-step ``deterministic`` call
with ``compile=True``, in-process compiles (EARTH2STUDIO_COMPILE_BACKGROUND=off).

Run twice with one ``EARTH2STUDIO_COMPILE_CACHE``: the first process fills the
cache (cold), the second shows what a later process pays with it (warm)::

    export EARTH2STUDIO_COMPILE_CACHE=$(mktemp -d) EARTH2STUDIO_COMPILE_BACKGROUND=off
    python docs/bench/2026-12-01-h200-fortyfourth/flex_warm_cost.py  # cold
    python docs/bench/2026-12-01-h200-fortyfourth/flex_warm_cost.py  # warm
"""

import time

import torch
from earth2studio.io import KVBackend

from earth2studio_compile import run
from earth2studio_compile.tools import zoo
from earth2studio_compile.tools.bench.attention import attention_choice

model = zoo.build("aurora", size="small")
data = zoo.random_source(model)
with attention_choice(model, ("flex", "math")):
    start = time.perf_counter()
    run.deterministic(
        ["2024-01-01"],
        3,
        model,
        data,
        KVBackend(),
        device=torch.device("cpu"),
        verbose=False,
        compile=True,
    )
    wall = time.perf_counter() - start
report = run.last_report()
print(f"torch {torch.__version__}; call {wall:.2f} s")
for r in report.regions:
    phases = {k: round(v, 2) for k, v in r.phases.items() if v >= 0.05}
    first = r.first_call_seconds
    print(
        f"{r.region}: {r.status} ({r.executor}, {r.cache}), first call "
        f"{first:.2f} s, phases >= 0.05 s: {phases}"
    )
