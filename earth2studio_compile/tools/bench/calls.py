"""One child process of the workflow mode (:mod:`.workflow`): whole calls, timed.

Run as ``python -m earth2studio_compile.tools.bench.calls SPEC_JSON OUT_JSON``. The
parent starts it with the compile caches of the row in its environment and reads
``OUT_JSON``, which is rewritten after every call, so a child stopped at its timeout
leaves the calls it finished; the parent stops it with SIGTERM first, on which it
cancels its background builds (:func:`builds_cancelled_on_sigterm`). A ``kind`` of

``fresh``
    one call, eager (upstream's workflow) or compiled (``compile=True``): a fresh
    process, its caches empty (cold) or left by an earlier cold row (warm);
``second``
    ``repeats`` rounds of an eager call then a compiled call, in this process: call 1
    of ``compile=True`` compiles or loads, the later ones find the compiled core kept
    (:mod:`earth2studio_compile.resident`); background builds the calls started
    (no cold row filled the cache) are cancelled after the last call;
``floor``
    the floors a call is measured against: per-step medians of the eager and compiled
    model (``N x`` the compiled step) and the store's bytes copied to the host and
    written with ``numpy.save`` from as many writer threads as the fastest backend
    uses: one file per variable per step (:func:`.floors.write_store`; one writer
    too, for comparison), and one per chunk of the store, laid out as its keys
    (:func:`.floors.write_chunks`: the floor of a store on disk).

Each call is timed from just before calling the workflow until the store is written
(the IO closed, :func:`.runs.finish`) and the device is idle. The data source and the
perturbation are made before the clock starts; the model is built before too
(``setup_s``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from earth2studio_compile.tools.bench.call_floor import floor
from earth2studio_compile.tools.bench.phases import thread_phases

#: Workflows of a job, and the IO backends of a row (the first three by default).
WORKFLOWS = ("deterministic", "ensemble")
IOS = (
    "zarr-disk",
    "async-zarr",
    "overlapped",
    "memory-zarr",
    "overlapped-memory",
    "overlapped-async",
)
#: The IOs that wrap a backend in our ``OverlappedIO``, and the backend they wrap:
#: upstream's eager workflow on that backend is what a user runs without us.
OVERLAPPED = {
    "overlapped": "zarr-disk",
    "overlapped-memory": "memory-zarr",
    # compile=True wraps AsyncZarrBackend itself (for_compiled_call): this row's
    # eager+OvIO shows what of that call's gain is writing.
    "overlapped-async": "async-zarr",
}
#: IOs whose store is in memory: measured against the in-memory storage floor.
IN_MEMORY = ("memory-zarr", "overlapped-memory")
#: Precisions of the mode: ``tf32`` and ``fp32`` are PyTorch's global switches for
#: every row, eager and compiled; ``bf16`` also scopes bf16 autocast to the cores.
PRECISIONS = ("tf32", "fp32", "bf16")
#: Data sources of a row (``spec["source"]``, :func:`call_source`).
SOURCES = ("random", "prefetched")
NOISE = 0.05
#: Seconds a warm row's process waits for its background work after the timed
#: call, before it cancels it: the cache it started from (``--cache-from``) should
#: serve every region, so work there means the build missed one. AIFS2ENS on an
#: H200 (thirty-eighth session): a judge held its warm row 210 s, until the row's
#: limit, and the device call had no time left for the rows after it.
WARM_WAIT_S = 60.0
#: Seconds a child keeps before its limit (``spec["stop_by"]``, the parent's
#: wall clock) to cancel the background builds it waits for and write its rows.
#: FCN3 on an H200 (forty-first session): a cold row waited for its 17 regions'
#: builds until the parent stopped it, and its measured call then stood beside a
#: row saying "timed out".
STOP_MARGIN_S = 15.0


def set_precision(precision: str) -> None:
    """PyTorch's global TF32 switches, as a user sets them for a whole script:
    on for ``tf32`` and ``bf16`` (the cores' bf16 is scoped on top), off for fp32."""
    import torch

    on = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on


def call_source(spec: dict[str, Any], model: Any, time: Any) -> Any:
    """The row's data source, made before the clock starts.

    ``random`` is the zoo's seeded ``Random``, drawn during the call;
    ``prefetched`` the same source behind :class:`~.zoo.Prefetched`, asked here
    for what the workflow will fetch (the model's input variables at ``time``
    and its input lead times), so that the call's fetch only copies.
    """
    from earth2studio.data import fetch_data
    from earth2studio.utils.time import to_time_array

    from earth2studio_compile.tools import zoo

    source = spec.get("source", "random")
    if source not in SOURCES:
        raise ValueError(f"source={source!r} is not one of {', '.join(SOURCES)}")
    drawn = zoo.random_source(model)
    if source == "random":
        return drawn
    kept = zoo.Prefetched(drawn)
    ic = model.input_coords()
    fetch_data(kept, to_time_array([time]), ic["variable"], ic["lead_time"])
    return kept


def make_call_io(spec: dict[str, Any], model: Any, tmp: Path) -> Any:
    """A fresh IO backend of the row on local disk.

    ``zarr-disk`` is ``ZarrBackend`` on a path, ``memory-zarr`` ``ZarrBackend`` in
    memory, ``async-zarr`` upstream's ``AsyncZarrBackend(blocking=False)``,
    ``overlapped`` ``OverlappedIO`` with its default writers around a ``ZarrBackend``
    on a path, ``overlapped-memory`` the same around one in memory,
    ``overlapped-async`` around an ``async-zarr`` (one writer thread calling its
    ``write``); the spec's ``max_pending``, where given, is the ``OverlappedIO``'s.
    """
    from earth2studio_compile import OverlappedIO  # where it lives moves; this stays
    from earth2studio_compile.tools.bench.ensemble.upstream import make_ensemble_io

    name = spec["io"]
    if name not in IOS:
        raise ValueError(f"io={name!r} is not one of {', '.join(IOS)}")
    base = OVERLAPPED.get(name, name)
    base = "zarr" if base == "memory-zarr" else base  # the bench's other modes' name
    if spec["workflow"] == "ensemble":
        io = make_ensemble_io(base, tmp, model, spec["steps"], spec["members"])
    else:
        from earth2studio_compile.tools.bench.e2e import make_io

        io = make_io(base, tmp, model, spec["steps"])
    if name not in OVERLAPPED:
        return io
    if spec.get("max_pending") is None:
        return OverlappedIO(io)
    return OverlappedIO(io, max_pending=spec["max_pending"])


def _store_bytes_then_remove(io: Any) -> int | None:
    """Bytes of the store on disk; then the store is deleted, so that the calls of a
    second-call child do not fill the disk (DLWP's 16 x 20 store is ~10 GB)."""
    from earth2studio_compile.tools.bench.ensemble.upstream import (
        store_path,
        tree_bytes,
    )

    path = store_path(getattr(io, "io", io))  # OverlappedIO's backend
    size = tree_bytes(path)
    if path is not None and path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path is not None:
        path.unlink(missing_ok=True)
    return size


def _report(compiled: bool) -> dict[str, Any] | None:
    import earth2studio_compile.run as ours

    report = ours.last_report() if compiled else None
    if report is None:
        return None
    regions = [
        {
            "region": f"{r.model}.{r.region}",
            "status": r.status,
            "executor": r.executor,
            "reused": r.reused,
            "background": r.background,
            "first_call_s": r.first_call_seconds,
            # Where the first step goes (key, checksum, aot_load, verify, ...).
            "phases": dict(r.phases),
            "cache": r.cache,
            "compile_s": r.compile_seconds,
        }
        for r in report.regions
    ]
    return {"summary": report.summary(), "regions": regions}


def wait_cap(cap: float | None, stop_by: float | None) -> float | None:
    """Seconds to wait for background builds: ``cap``, or less where the child
    must stop by ``stop_by`` (``time.time()``), keeping :data:`STOP_MARGIN_S`.

    Returns
    -------
    float | None
        The wait, at least 0; None (no bound) only where both are None
    """
    if stop_by is None:
        return cap
    left = max(0.0, stop_by - time.time() - STOP_MARGIN_S)
    return left if cap is None else min(cap, left)


def background_builds(
    timeout: float | None = None, cancel: bool = False
) -> dict[str, Any]:
    """Wait for this process's background builds, or ``cancel`` them (a cold row
    whose caches nothing reads after: its build would only cost the run a minute);
    those still running after ``timeout`` seconds are cancelled.

    Returns
    -------
    dict[str, Any]
        ``background_wait_s``, ``background`` (each build in words) and
        ``background_cut`` (whether the timeout cancelled any)
    """
    from loguru import logger

    from earth2studio_compile import cancel_builds, wait_for_builds

    start = time.perf_counter()
    jobs = cancel_builds() if cancel else wait_for_builds(timeout)
    cut = not cancel and any(j.poll() in ("running", "waiting") for j in jobs)
    if cut:
        jobs = cancel_builds()
        logger.warning(
            f"Background work still ran {timeout:g} s after the call: cancelled "
            "(the cache the row started from lacked it)."
        )
    return {
        "background_wait_s": time.perf_counter() - start,
        "background": [f"{j.label}: {j.describe()}" for j in jobs],
        "background_cut": cut,
    }


def call(
    spec: dict[str, Any], model: Any, device: Any, tmp: Path, compiled: bool
) -> dict[str, Any]:
    """One whole call of the job's workflow: upstream's eager, or ours compiled.

    Returns
    -------
    dict[str, Any]
        ``run``, ``wall_s`` (the call until the store is written and the device is
        idle), ``returned_s`` (until the workflow returned), ``first_step_s`` (until
        the first forecast step reached the IO), ``store_bytes`` (on
        disk), ``thread_s`` (where the workflow's thread spent the call;
        ``thread_cpu_s`` its CPU seconds there) and ``first_step`` (where its
        first step went: :func:`.phases.thread_phases`), ``write_seconds`` (each of
        its first :data:`.phases.FIRST_WRITES` writes), ``host_bytes`` and
        ``max_pending`` (an ``OverlappedIO``'s most host memory held and its bound,
        in steps; None for another IO) and, compiled, ``report`` (its summary and
        regions)
    """
    import numpy as np
    import torch

    from earth2studio_compile.tools.bench.attention import attention_choice
    from earth2studio_compile.tools.bench.ensemble.upstream import output_coords
    from earth2studio_compile.tools.bench.measure import eager_precision
    from earth2studio_compile.tools.bench.runs import TIME, finish

    if compiled:
        import earth2studio_compile.run as ours

        workflow = functools.partial(getattr(ours, spec["workflow"]), compile=True)
    else:
        import earth2studio.run as upstream

        workflow = getattr(upstream, spec["workflow"])
    np.random.seed(0)  # the Random source draws from numpy's global generator
    torch.manual_seed(0)
    data = call_source(spec, model, TIME)
    io = make_call_io(spec, model, tmp)
    if compiled:
        from earth2studio_compile.io import for_compiled_call

        # What the compile=True call does with a plain ZarrBackend, done here before
        # its write is timed: timed on the backend itself, the call would take it
        # for one that writes otherwise and leave it unwrapped.
        io = for_compiled_call(io) or io
    args: list[Any] = [[str(TIME)], spec["steps"]]
    kwargs: dict[str, Any] = {"device": device, "verbose": False}
    kwargs["output_coords"] = output_coords(model, spec.get("outputs", "all"))
    perturbation = None
    if spec["workflow"] == "ensemble":
        from earth2studio.perturbation import Gaussian

        args.append(spec["members"])
        kwargs["batch_size"] = spec["batch_size"]
        perturbation = Gaussian(noise_amplitude=NOISE, seed=0)
    # Eager bf16 scopes autocast to the cores as a session does; tf32 and fp32 are
    # the global switches already set for the whole process.
    scoped = spec["precision"] if spec["precision"] == "bf16" else None
    marks: dict[str, float] = {}
    with thread_phases(model, io, perturbation) as phases:
        perturb = phases.perturbation
        rest = [model, data, io] + ([perturb] if perturb is not None else [])
        # The table's choice changed before the clock, as a user registers theirs.
        names = spec.get("attention") if compiled else None
        with (
            attention_choice(model, names),
            eager_precision(model, None if compiled else scoped),
        ):
            start = marks["start"] = time.perf_counter()
            workflow(*args, *rest, **kwargs)
            wall = finish(io, device, marks, start)
    return {
        "run": "compiled" if compiled else "eager",
        "wall_s": wall,
        "returned_s": marks["returned"] - start,
        # The initial state is write 0: write 1 hands the IO the first forecast step.
        "first_step_s": (phases.writes[1] - start if len(phases.writes) > 1 else None),
        "store_bytes": _store_bytes_then_remove(io),
        "report": _report(compiled),
        "thread_s": phases.spent,
        "thread_cpu_s": phases.cpu,
        "first_step": phases.first,
        "write_seconds": phases.each_write,
        "host_bytes": getattr(io, "host_bytes", None),
        "max_pending": getattr(io, "max_pending", None),
    }


def run(spec: dict[str, Any], out: Path, tmp: Path) -> list[dict[str, Any]]:
    """Run the child's ``kind`` (see the module docstring), writing ``out`` after
    every call; the rows.

    ``out`` also holds ``import_s``, from ``spec["launched"]`` (the parent's
    ``time.time()`` as it started this process) until PyTorch, Earth2Studio and this
    package are imported, and ``setup_s``, building the model on the device.
    """
    import torch
    from loguru import logger

    # Before any Earth2Studio module: this one imports earth2studio.run with the
    # quick optional-dependency registry (quiet_imports); imported first, upstream's
    # registry walked the stack ~180 times, ~30 s of every child on 2 cores.
    import earth2studio_compile.run  # noqa: F401
    from earth2studio_compile.tools import zoo

    launched = spec.get("launched")
    head: dict[str, Any] = {"import_s": time.time() - launched if launched else None}
    # After the imports: Earth2Studio installs its own loguru handler on import.
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    rows: list[dict[str, Any]] = []

    def save() -> None:  # whole or not at all: the parent may read it any time
        part = out.with_suffix(".part")
        part.write_text(json.dumps({**head, "rows": rows}))
        part.replace(out)

    start = time.perf_counter()
    set_precision(spec["precision"])
    device = torch.device(spec["device"])
    model = zoo.build(spec["model"], size=spec["size"]).to(device)
    head["setup_s"] = time.perf_counter() - start
    save()
    if spec["kind"] == "fresh":
        rows.append(call(spec, model, device, tmp, spec["run"] == "compiled"))
        if spec["run"] == "compiled":
            # After the timed call, so the next fresh process finds the artifacts
            # (a user's process exits and the build goes on without it); a cold
            # row with caches of its own (``build``: cancel) leaves none to find.
            save()
            cancel = spec.get("build") == "cancel"
            cap = WARM_WAIT_S if spec.get("way") == "warm" else None
            cap = wait_cap(cap, spec.get("stop_by"))
            rows[-1].update(background_builds(cap, cancel=cancel))
    elif spec["kind"] == "floor":
        rows.append({"run": "floor", **floor(spec, model, device, tmp)})
    elif spec["kind"] == "second":
        for repeat in range(1, spec["repeats"] + 1):
            for compiled in (False, True):
                rows.append(
                    {**call(spec, model, device, tmp, compiled), "call": repeat}
                )
                save()
        # Builds its calls started (no cold row filled the cache) would go on
        # beside the next rows' timed calls and write into caches the parent
        # removes (Aurora's six, 2026-11-27): cancelled, and said so.
        rows[-1].update(background_builds(cancel=True))
    else:
        raise ValueError(f"kind={spec['kind']!r}; use fresh, second or floor")
    save()
    return rows


@contextlib.contextmanager
def builds_cancelled_on_sigterm() -> Iterator[None]:
    """In the block, SIGTERM cancels this process's background builds
    (:func:`earth2studio_compile.cancel_builds`), then exits (status 143).

    A build runs in a session of its own so that it outlives a forecast's process;
    a cold child the parent stops at its timeout would leave its build running
    beside the next rows. The handler before the block is restored after it.
    """
    from earth2studio_compile import cancel_builds

    def stop(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_IGN)  # one cancel, however many signals
        cancel_builds()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        # None: a handler not set from Python, which cannot be put back.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def main() -> None:
    spec, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    if spec.get("switch_interval") is not None:  # the whole process, as a user's
        sys.setswitchinterval(spec["switch_interval"])
    with builds_cancelled_on_sigterm():
        with tempfile.TemporaryDirectory(dir=spec.get("workdir")) as tmp:
            run(spec, out, Path(tmp))


if __name__ == "__main__":
    main()
