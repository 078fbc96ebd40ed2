"""DLESyM's 20-step whole call, eager against compiled, the brief's three ways.

Upstream's ``deterministic`` cannot run DLESyM (its iterator yields the initial
context's lead times at step 0 and more of them later; the workflow's store is
sized from one step: "could not broadcast ... (1,0,721,1440)", eager too, checked
at 1f5548b), so ``compile=True`` of ``earth2studio_compile.run`` never reaches it.
A DLESyM user runs the loop of Earth2Studio's own DLESyM example: the iterator,
``retrieve_valid_atmos_outputs`` / ``_ocean_`` on each step. This times that loop
from creating the iterator until the last step's valid outputs are on the host,
eager, and inside a ``CompileSession`` told the steps (``expect``) with its first
calls started ahead, as ``compile=True`` does for the workflows.

One process per call::

    python3 dlesym_calls.py OUT.json --run eager|compiled [--way fresh|second]
        [--size full|small] [--device cuda|cpu] [--steps 20] [--repeats 2]

``fresh``: one call; ``second``: ``--repeats`` rounds of an eager call then a
compiled call in this process. The compile cache is the environment's
(``EARTH2STUDIO_COMPILE_CACHE``): a new directory for a cold row, the same one
again for a warm row. TF32 on (the issue's precision). The JSON (a list of rows,
appended to, rewritten after every call) holds each call's wall seconds, its first
step, and the compiled call's report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

T0 = time.perf_counter()
import torch  # noqa: E402

from earth2studio_compile import CompileSession  # noqa: E402
from earth2studio_compile.metrics import synchronize  # noqa: E402
from earth2studio_compile.tools import zoo  # noqa: E402
from earth2studio_compile.tools.bench.runs import initial_state  # noqa: E402

IMPORT_S = time.perf_counter() - T0


def call(model, device: torch.device, steps: int, compiled: bool) -> dict:
    """One whole loop: seconds, first step's seconds, the report if compiled."""
    x, coords = initial_state(model, device)
    synchronize(device)
    start = time.perf_counter()
    first = None
    session = CompileSession(model) if compiled else None
    with torch.inference_mode(), session or contextlib.nullcontext():
        if session is not None:
            session.expect(steps)
            session.ahead()
        iterator = model.create_iterator(x, coords)
        next(iterator)  # the initial state
        for _ in range(steps):
            y, c = next(iterator)
            atmos = model.retrieve_valid_atmos_outputs(y, c)[0]
            ocean = model.retrieve_valid_ocean_outputs(y, c)[0]
            # On the host, as a workflow's store has them.
            atmos.cpu().numpy(), ocean.cpu().numpy()
            if first is None:
                first = time.perf_counter() - start
        iterator.close()
    synchronize(device)
    row = {"wall_s": time.perf_counter() - start, "first_step_s": first}
    if session is not None:
        report = session.report
        row["summary"] = report.summary()
        row["regions"] = [
            {
                "region": r.region,
                "status": r.status,
                "executor": r.executor,
                "reason": r.reason,
                "first_call_s": r.first_call_seconds,
                "cache": r.cache,
                "calls": r.calls,
                "compiled_ms": r.compiled_ms,
                "eager_ms": r.eager_ms,
            }
            for r in report.regions
        ]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--run", choices=("eager", "compiled"), default="eager")
    parser.add_argument("--way", choices=("fresh", "second"), default="fresh")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--label", default="", help="the row's name in the JSON")
    parser.add_argument(
        "--wait-builds",
        type=float,
        default=0.0,
        help="after the calls, wait up to this many seconds for the background "
        "builds this process started (kept in the last row)",
    )
    a = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = torch.device(a.device)
    build_start = time.perf_counter()
    model = zoo.build("dlesym", size=a.size).to(device)
    setup_s = time.perf_counter() - build_start
    rows = json.loads(a.out.read_text()) if a.out.is_file() else []
    plan = [a.run == "compiled"] if a.way == "fresh" else [False, True] * a.repeats
    for n, compiled in enumerate(plan, 1):
        row = call(model, device, a.steps, compiled)
        row.update(
            label=a.label,
            way=a.way,
            run="compiled" if compiled else "eager",
            call=n if a.way == "second" else 1,
            steps=a.steps,
            size=a.size,
            import_s=IMPORT_S,
            setup_s=setup_s,
            gpu=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            torch=torch.__version__,
        )
        rows.append(row)
        a.out.write_text(json.dumps(rows, indent=1))
        print(
            f"{a.label or a.way} {row['run']} call {row['call']}: "
            f"{row['wall_s']:.2f} s (first step {row['first_step_s']:.2f} s)",
            flush=True,
        )
        if compiled:
            print("  " + row["summary"], flush=True)
    if a.wait_builds > 0:
        from earth2studio_compile.artifacts import background

        start = time.perf_counter()
        jobs = background.wait(timeout=a.wait_builds)
        rows[-1]["background_wait_s"] = time.perf_counter() - start
        rows[-1]["background"] = [j.describe() for j in jobs]
        a.out.write_text(json.dumps(rows, indent=1))
        waited = rows[-1]["background_wait_s"]
        print(f"waited {waited:.1f} s for the builds:", flush=True)
        for text in rows[-1]["background"]:
            print("  " + text, flush=True)


if __name__ == "__main__":
    main()
