"""One 3-step ``deterministic`` call of the zoo's small FCN3 on the CPU, upstream's
eager (``eager``) or ``compile=True`` with every region's first call running
eagerly as the payoff rule decides (``comp``): what deciding costs a call.

Run from the repository root, makani installed as CI's ``.venv/fcn3``::

    PYTHONPATH=.venv/fcn3 python docs/bench/2026-12-02-h200-fortyeighth/\
cpu_fcn3_decided_eager.py eager|comp
"""

import sys
import tempfile
import time

sys.path.insert(0, "test")  # conftest's run_workflow: the suite's seeded call

import os  # noqa: E402

os.environ["EARTH2STUDIO_COMPILE_CACHE"] = tempfile.mkdtemp()

from conftest import run_workflow  # noqa: E402

from earth2studio_compile import run  # noqa: E402
from earth2studio_compile.first_call import FirstCall, RegionState  # noqa: E402
from earth2studio_compile.tools import zoo  # noqa: E402


def decided_eager(self, call, target, chosen):
    """As the payoff rule's answer "it cannot pay": eager for good."""
    self.state = RegionState.EAGER
    self.report.reason = "decided eagerly (bench)"
    return True


FirstCall._not_paying = decided_eager
model = zoo.build("fcn3", size="small")
mode = sys.argv[1]
start = time.perf_counter()
run_workflow(
    run.deterministic, "deterministic", model, nsteps=3, compile=mode == "comp"
)
print(mode, "whole call", round(time.perf_counter() - start, 3))
