"""Cold Dynamo first call against an AOT artifact's load + first call (CPU, small FCN).

Each role runs in a fresh process with an empty Inductor cache:

    python measure.py build   # writes the artifact under $ROOT (not timed here)
    python measure.py cold    # CompileSession, first model step (cold compile)
    python measure.py aot     # load_runner + first call of the core
"""

import json
import os
import sys
import tempfile
import time

role = sys.argv[1]
root = os.environ.get("ROOT", "/tmp/e2sc-aot-measure")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
os.environ["EARTH2STUDIO_COMPILE_CACHE"] = root if role == "build" else "off"
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from earth2studio_compile import CompileSession, aot, build, example_input  # noqa: E402
from earth2studio_compile.metrics import rel_l2  # noqa: E402
from earth2studio_compile.tools import zoo  # noqa: E402

model = zoo.build("fcn", size="small")
core = model.model
x, coords = example_input(model)
owner = f"{type(model).__module__}.{type(model).__qualname__}"
res: dict = {"role": role, "torch": torch.__version__}
if role == "build":
    start = time.perf_counter()
    res["built"] = [b.status for b in build(model, precision="fp32")]
    res["build_s"] = time.perf_counter() - start
elif role == "cold":
    with CompileSession(model, precision="fp32", probe=False) as session:
        start = time.perf_counter()
        model(x, coords)
        res["first_step_s"] = time.perf_counter() - start
        start = time.perf_counter()
        model(x, coords)
        res["second_step_s"] = time.perf_counter() - start
    res["phases"] = session.report.regions[0].phases
else:
    args, kwargs = aot._capture(model, [core], x, coords)[id(core)]
    start = time.perf_counter()
    runner = aot.load_runner(
        core, args, kwargs, torch.device("cpu"), "fp32", None, owner, "model",
        root=Path(root),
    )
    out = runner(*args)
    res["load_and_first_call_s"] = time.perf_counter() - start
    res["phases"] = runner.phases
    start = time.perf_counter()
    runner(*args)
    res["second_call_s"] = time.perf_counter() - start
    with torch.no_grad():
        res["rel_l2"] = rel_l2(out, core(*args))
print(json.dumps(res))
