"""Why ``compile=True`` gives DLESyM nothing on CUDA: the table's spec and the
alternatives, one process, each variant on a freshly built model.

The GPU test (test/tools/zoo/test_dlesym.py, H100, torch 2.11) found the table's
``exclude=("HEALPixPaddingv2",)`` splits the atmosphere into ~44 tiny regions, each
slower compiled than eager, and both ocean regions (physicsnemo's pure-torch
``HEALPixPadding``, not split) fell back at their first call in a "recompile
storm"; without the exclude all four regions fell back. physicsnemo's pads call
``torch.cuda.nvtx.range_push``/``range_pop`` where CUDA is available, and Dynamo
cannot put ``range_pop`` (it returns an int) in a graph: a break in every pad,
whose resumed frames are shared by all pads and layers of a UNet.

Per variant (the DLESyM entry of ``MODEL_TABLE`` replaced for its duration):

- ``table``: the spec as shipped;
- ``opaque_v2``: ``exclude=()``, ``opaque=("HEALPixPaddingv2",)``;
- ``opaque_both``: ``exclude=()``, ``opaque=("HEALPixPaddingv2", "HEALPixPadding")``;
- ``no_exclude``: ``exclude=()`` (the earlier failing configuration, for its logs);
- ``no_nvtx``: ``exclude=()`` with ``torch.cuda.nvtx.range_push/pop`` replaced by
  Python no-ops while the session is open (is the nvtx call the only break?).

Each variant: ``torch._dynamo.reset()``, build ``zoo.build("dlesym", size)``, a
3-step compiled rollout of ``create_iterator`` in a ``CompileSession`` on the
never-run model (as the test: the ConvGRU state is a placeholder until the first
call), then 3 eager steps on the same model (its recurrent state resets every
call), each step synchronized and timed; the rel L2 of the valid atmosphere and
ocean outputs per step, ``report.summary()`` and every ``RegionReport``. Dynamo's
``graph_breaks`` and ``recompiles`` logs go to ``OUTDIR/<variant>.log``;
``OUTDIR/dlesym_probe.json`` is rewritten after every variant. fp32, TF32 off
(``--tf32`` turns it on).

Run from the repository root::

    python3 docs/bench/2026-11-27-h100-fifteenth/dlesym_probe.py OUTDIR \\
        [--size full|small] [--device cuda|cpu] [--variants a,b,...] \\
        [--tf32] [--cache] [--no-probe] [--deadline SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

T0 = time.perf_counter()
import torch  # noqa: E402
from loguru import logger  # noqa: E402

from earth2studio_compile import CompileSession, models, resident  # noqa: E402
from earth2studio_compile.metrics import rel_l2, synchronize  # noqa: E402
from earth2studio_compile.tools import zoo  # noqa: E402
from earth2studio_compile.tools.bench.runs import initial_state  # noqa: E402

STEPS = 3
PADS = ("HEALPixPaddingv2", "HEALPixPadding")
VARIANTS = {
    "table": {},
    "opaque_v2": {"exclude": (), "opaque": PADS[:1]},
    "opaque_both": {"exclude": (), "opaque": PADS},
    "no_exclude": {"exclude": ()},
    "no_nvtx": {"exclude": ()},
}


def rollout(model, device, session=None):
    """``STEPS`` steps of the iterator (step 0, the initial state, skipped): the
    seconds of each step and, once all are done, each step's valid outputs (every
    output held to the end, as the test: a later step must not change one)."""
    x, coords = initial_state(model, torch.device(device))
    held, seconds = [], []
    with torch.inference_mode(), session or contextlib.nullcontext():
        steps = model.create_iterator(x, coords)
        next(steps)
        for _ in range(STEPS):
            synchronize(device)
            start = time.perf_counter()
            held.append(next(steps))
            synchronize(device)
            seconds.append(time.perf_counter() - start)
        steps.close()
    outs = [
        (
            model.retrieve_valid_atmos_outputs(y, c)[0],
            model.retrieve_valid_ocean_outputs(y, c)[0],
        )
        for y, c in held
    ]
    return seconds, outs


@contextlib.contextmanager
def spec_for(model, fields):
    """The model's table entry replaced by ``fields`` over it, restored after."""
    key, spec = models.lookup(model)
    models.MODEL_TABLE[key] = dataclasses.replace(spec, **fields)
    try:
        yield models.MODEL_TABLE[key]
    finally:
        models.MODEL_TABLE[key] = spec


@contextlib.contextmanager
def no_nvtx():
    """``torch.cuda.nvtx.range_push/pop`` as Python no-ops (Dynamo inlines them)."""
    nvtx = torch.cuda.nvtx
    saved = nvtx.range_push, nvtx.range_pop

    def push(msg):
        return None

    def pop():
        return None

    nvtx.range_push, nvtx.range_pop = push, pop
    try:
        yield
    finally:
        nvtx.range_push, nvtx.range_pop = saved


@contextlib.contextmanager
def dynamo_logs(path):
    """Dynamo's graph-break and recompile logs (and Inductor's) into ``path``;
    torch's own stderr handlers show WARNING and above only meanwhile."""
    torch._logging.set_logs(graph_breaks=True, recompiles=True)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(
        logging.Formatter("%(relativeCreated)9.0f %(name)s %(message)s")
    )
    loggers = [logging.getLogger(n) for n in ("torch._dynamo", "torch._inductor")]
    for lg in loggers:
        for h in lg.handlers:
            h.setLevel(logging.WARNING)
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        handler.close()
        torch._logging.set_logs()


def fresh(device):
    """Forget the previous variant: kept executors, Dynamo's caches, memory."""
    resident.release()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def probe(name, args, out, record):
    """Fill one variant's ``record``; what it raises, the caller records."""
    fields = VARIANTS[name]
    record["fields"] = {k: list(v) for k, v in fields.items()}
    start = time.perf_counter()
    model = zoo.build("dlesym", size=args.size).to(args.device).eval()
    record["build_s"] = time.perf_counter() - start
    record["pads"] = Counter(
        n for m in model.modules() if (n := type(m).__name__) in PADS
    )
    warnings, session = [], None
    sink = logger.add(lambda m: warnings.append(str(m).strip()), level="WARNING")
    log = out / f"{name}.log"
    try:
        with spec_for(model, fields) as spec, dynamo_logs(log):
            record["spec"] = {"exclude": spec.exclude, "opaque": spec.opaque}
            with no_nvtx() if name == "no_nvtx" else contextlib.nullcontext():
                session = CompileSession(model, cache=args.cache, probe=args.probe)
                compiled_s, compiled = rollout(model, args.device, session)
    finally:
        logger.remove(sink)
        record["warnings"] = warnings
        if session is not None:
            record["summary"] = session.report.summary()
            record["report"] = session.report.to_dict()
        text = log.read_text() if log.exists() else ""
        record["log"] = {
            "file": log.name,
            "lines": text.count("\n"),
            "graph_break_records": text.count("__graph_breaks"),
            "recompile_records": text.count("__recompiles"),
        }
        breaks = torch._dynamo.utils.counters["graph_break"]
        record["break_reasons"] = [[str(k)[:300], v] for k, v in breaks.most_common(10)]
    record["compiled_step_ms"] = [1e3 * s for s in compiled_s]
    eager_s, eager = rollout(model, args.device)
    record["eager_step_ms"] = [1e3 * s for s in eager_s]
    record["rel_l2"] = [
        {"atmos": rel_l2(ca, ea), "ocean": rel_l2(co, eo)}
        for (ca, co), (ea, eo) in zip(compiled, eager, strict=True)
    ]


def line(r):
    """One short line per variant (partial where it raised)."""
    parts = [f"ERROR {r['error'][:160]}"] if "error" in r else []
    regions = r.get("report", {}).get("regions", [])
    if regions:
        total = {k: sum(x[k] for x in regions) for k in ("graphs", "graph_breaks")}
        status = dict(Counter(x["status"] for x in regions))
        parts.append(
            f"{len(regions)} regions {status}, {total['graphs']} graphs, "
            f"{total['graph_breaks']} breaks, "
            f"{sum(x['recompiles'] for x in regions)} recompiles"
        )
    timed = [x for x in regions if x["compiled_ms"] and x["eager_ms"]]
    if timed:
        c, e = (sum(x[k] for x in timed) for k in ("compiled_ms", "eager_ms"))
        parts.append(f"probed {len(timed)}: compiled {c:.1f} ms vs eager {e:.1f}")
    for key in ("compiled_step_ms", "eager_step_ms"):
        if key in r:
            parts.append(f"{key} " + "/".join(f"{s:.0f}" for s in r[key]))
    if "rel_l2" in r:
        parts.append(f"rel L2 <= {max(max(e.values()) for e in r['rel_l2']):.1e}")
    if "log" in r:
        parts.append(f"log {r['log']['graph_break_records']} breaks")
        parts.append(f"{r['log']['recompile_records']} recompiles")
    return f"{r['variant']}: " + "; ".join(parts)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--size", default="full", choices=("full", "small"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument(
        "--variants", default="table,opaque_v2,opaque_both,no_exclude,no_nvtx"
    )
    p.add_argument("--tf32", action="store_true", help="TF32 on (default fp32)")
    p.add_argument("--cache", action="store_true", help="the package's compile cache")
    p.add_argument("--no-probe", dest="probe", action="store_false")
    p.add_argument(
        "--deadline", type=float, default=0.0, help="start no variant after S s"
    )
    args = p.parse_args()
    names = args.variants.split(",")
    if unknown := set(names) - set(VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}; known: {list(VARIANTS)}")
    args.outdir.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.tf32
    from earth2grid.healpix._padding import cuda as e2g_cuda

    result = {
        "argv": sys.argv[1:],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "healpixpad_cuda": e2g_cuda.healpixpad_cuda is not None,
        "import_s": time.perf_counter() - T0,
        "variants": [],
    }
    print(f"imports {result['import_s']:.0f} s, {result['device']}", flush=True)
    for name in names:
        if args.deadline and time.perf_counter() - T0 > args.deadline:
            record = {"variant": name, "error": "not started: past --deadline"}
        else:
            record, start = {"variant": name}, time.perf_counter()
            fresh(args.device)
            try:
                probe(name, args, args.outdir, record)
            except Exception as err:
                record["error"] = f"{type(err).__name__}: {err}"
                record["traceback"] = traceback.format_exc()
            record["seconds"] = time.perf_counter() - start
        record["at_s"] = time.perf_counter() - T0
        result["variants"].append(record)
        (args.outdir / "dlesym_probe.json").write_text(
            json.dumps(result, indent=1, default=str)
        )
        print(f"[{record['at_s']:.0f} s] {line(record)}", flush=True)


if __name__ == "__main__":
    main()
