"""Ensemble mode of the benchmark: upstream's ``ensemble`` workflow, run for real.

``python -m earth2studio_compile.tools.bench --ensemble N --batch-size B[,B...]`` runs
Earth2Studio's ``earth2studio.run.ensemble`` (N members, a seeded ``Gaussian``
perturbation, a seeded ``Random`` initial state) once per row, each row in a fresh
process, and writes the JSON after every row. Rows, per model, IO backend and batch
size:

``eager``
    Upstream as shipped, TF32 off everywhere (the fp32 reference).
``eager-tf32``
    Upstream with PyTorch's TF32 switches on (``torch.backends.cuda.matmul`` and
    ``cudnn``), restored afterwards: the one line a user can add by hand. CUDA only.
``compiled``
    Ours: upstream's ``ensemble`` inside a :class:`~earth2studio_compile.CompileSession`
    with ``precision`` fp32, tf32 or bf16, which is what
    ``earth2studio_compile.run.ensemble(..., compile=True)`` does with
    ``EARTH2STUDIO_COMPILE_PRECISION`` set. With a warm start (the default), a short
    "prime" process (one batch, two steps) compiles cold and saves the portable
    bundles, then the measured row starts warm from them in a fresh process with an
    empty local Inductor cache, as the rollout benchmark's warm rows do.

Each row reports members x steps per second from the call of ``ensemble`` until the
store is written (first step included) and with the first step apart, the first
step's seconds, peak GPU memory per member, relative L2 at lead step 1 against the
eager fp32 row of the same batch size (the perturbation's draws depend on the batch
shape), and a per-step breakdown from a second, instrumented run of one batch,
synchronized around each phase with :mod:`.e2e`'s machinery plus timers on the core
network and the perturbation. A row that runs out of GPU memory is recorded as such
and larger batches of its kind are skipped.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earth2studio_compile.metrics import rel_l2, synchronize
from earth2studio_compile.tools.bench.e2e import _instrumented, _TimedIO, make_io
from earth2studio_compile.tools.bench.runs import TIME, finish
from earth2studio_compile.tools.bench.text import format_table

EAGER, EAGER_TF32, COMPILED = "eager", "eager-tf32", "compiled"
IO_CHOICES = ("zarr-disk", "async-zarr", "zarr")
OUTPUTS = ("few", "all")
#: Variables written per member in "few" rows: the first three the model has.
FEW = ("t2m", "z500", "u10m", "v10m", "t850", "tcwv", "z1000")
#: Per-step phases of the breakdown, ms per batched forecast step: the core
#: network's calls; the rest of the model's step (its coordinate code: normalizing,
#: zenith angles, regridding); the workflow's ``map_coords``/``split_coords``; the
#: perturbation (once per batch, spread over its steps); device-to-host copies; the
#: backend's ``write``; the progress bar; the rest of the loop.
STEP = (
    "core",
    "model_rest",
    "map_coords",
    "split_coords",
    "perturb",
    "d2h",
    "write",
    "progress",
    "loop",
)
NOISE = 0.05
#: Steps of the instrumented breakdown run (one batch).
BREAKDOWN_STEPS = 6


def output_coords(model: Any, outputs: str) -> OrderedDict:
    """``output_coords`` of a row: a few variables, or everything (empty).

    Parameters
    ----------
    model : Any
        Prognostic model
    outputs : str
        ``"few"`` or ``"all"``

    Returns
    -------
    OrderedDict
        Upstream's ``output_coords`` argument
    """
    if outputs == "all":
        return OrderedDict()
    variables = [str(v) for v in model.input_coords()["variable"]]
    few = [v for v in FEW if v in variables][:3] or variables[:3]
    return OrderedDict({"variable": np.array(few)})


def store_bytes(model: Any, nensemble: int, nsteps: int, outputs: str) -> int:
    """Bytes the store of a row holds (float32, uncompressed)."""
    coords = model.input_coords()
    nvar = len(output_coords(model, outputs).get("variable", coords["variable"]))
    return 4 * nensemble * (nsteps + 1) * nvar * len(coords["lat"]) * len(coords["lon"])


def make_ensemble_io(
    name: str, directory: Path, model: Any, nsteps: int, nensemble: int
) -> Any:
    """A fresh IO backend for an ensemble; see :func:`.e2e.make_io` for the names.

    ``async-zarr`` is upstream's ``AsyncZarrBackend(blocking=False)`` with the
    ensemble, time and lead-time coordinates as its parallel (iterated) ones.
    """
    if name != "async-zarr":
        return make_io(name, directory, model, nsteps)
    from earth2studio.io import AsyncZarrBackend

    step = model.output_coords(model.input_coords())["lead_time"][-1]
    return AsyncZarrBackend(
        str(directory / f"ensemble-{time.monotonic_ns()}.zarr"),
        parallel_coords=OrderedDict(
            {
                "ensemble": np.arange(nensemble),
                "time": np.array([TIME]),
                "lead_time": np.asarray([step * i for i in range(nsteps + 1)]),
            }
        ),
        blocking=False,
    )


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """PyTorch's global TF32 switches (matmul and cuDNN) set, then restored."""
    matmul, cudnn = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (
            matmul,
            cudnn,
        )


def _timed(
    fn: Callable[..., Any], device: torch.device, totals: dict[str, float], key: str
) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        synchronize(device)
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        synchronize(device)
        totals[key] += time.perf_counter() - start
        return out

    return wrapper


@contextlib.contextmanager
def core_timer(
    model: Any, device: torch.device, totals: dict[str, float]
) -> Iterator[None]:
    """Time the calls of the model's core networks (the model table's targets).

    Inside a session a compiled core is called through the slot the region occupies
    in the module's ``__dict__``; an eager core through ``forward``. The timer wraps
    whichever is there and puts it back before the session restores the model.
    """
    from earth2studio_compile._torch import MODULE_SLOT
    from earth2studio_compile.planning import plan

    touched: list[tuple[torch.nn.Module, str, Any]] = []
    for _, module in plan(model).targets:
        slot = MODULE_SLOT if MODULE_SLOT in module.__dict__ else "forward"
        had = module.__dict__.get(slot)
        fn = had if had is not None else module.forward
        module.__dict__[slot] = _timed(fn, device, totals, "core")
        touched.append((module, slot, had))
    try:
        yield
    finally:
        for module, slot, had in reversed(touched):
            if had is None:
                module.__dict__.pop(slot, None)
            else:
                module.__dict__[slot] = had


@contextlib.contextmanager
def first_step_timer(
    model: Any, device: torch.device, marks: dict[str, float]
) -> Iterator[None]:
    """Record ``marks["first_step_s"]``: the first batch's first forecast step.

    The step after the initial state's, synchronized on both sides (one sync pair
    per ensemble: nothing a throughput figure would notice).
    """
    create = model.create_iterator

    def create_iterator(x: torch.Tensor, coords: Any) -> Iterator[Any]:
        iterator = create(x, coords)
        if "first_step_s" in marks:
            yield from iterator
            return
        yield next(iterator)  # the initial state: no model call
        synchronize(device)
        start = time.perf_counter()
        out = next(iterator)
        synchronize(device)
        marks["first_step_s"] = time.perf_counter() - start
        yield out
        yield from iterator

    model.__dict__["create_iterator"] = create_iterator
    try:
        yield
    finally:
        model.__dict__.pop("create_iterator", None)


def run_ensemble(
    model: Any,
    io: Any,
    nensemble: int,
    nsteps: int,
    batch_size: int,
    device: torch.device,
    selection: OrderedDict,
    marks: dict[str, float] | None = None,
    perturbation: Any = None,
) -> float:
    """Wall seconds of upstream's ``ensemble`` on seeded data, everything written.

    Parameters
    ----------
    model : Any
        Prognostic model, on ``device``
    io : Any
        IO backend (closed here where it has ``close``)
    nensemble, nsteps, batch_size : int
        Members, forecast steps, members per batch
    device : torch.device
        Where the workflow runs
    selection : OrderedDict
        Upstream's ``output_coords``
    marks : dict[str, float] | None, optional
        Filled with ``perf_counter`` readings ``start``, ``returned``, ``end``
    perturbation : Any, optional
        The perturbation; by default a ``Gaussian`` seeded with 0

    Returns
    -------
    float
        Seconds from the call until the store is written and the device idle
    """
    import earth2studio.run as upstream
    from earth2studio.perturbation import Gaussian

    from earth2studio_compile.tools import zoo

    np.random.seed(0)  # the Random source draws from numpy's global generator
    torch.manual_seed(0)
    data = zoo.random_source(model)
    if perturbation is None:
        perturbation = Gaussian(noise_amplitude=NOISE, seed=0)
    marks = {} if marks is None else marks
    start = marks["start"] = time.perf_counter()
    upstream.ensemble(
        [str(TIME)],
        nsteps,
        nensemble,
        model,
        data,
        io,
        perturbation,
        batch_size=batch_size,
        output_coords=selection,
        device=device,
        verbose=False,
    )
    return finish(io, device, marks, start)


def breakdown(
    model: Any,
    io_name: str,
    batch_size: int,
    nsteps: int,
    device: torch.device,
    tmp: Path,
    selection: OrderedDict,
) -> dict[str, float]:
    """Where one batch's instrumented ``ensemble`` run spends its time.

    One batch of ``batch_size`` members, :data:`BREAKDOWN_STEPS` steps at most, a
    device synchronization around each phase so its time is its own.

    Returns
    -------
    dict[str, float]
        ``{phase}_ms`` per batched forecast step for each of :data:`STEP`;
        ``setup_s`` (data, IO arrays, the first ``map_coords`` and the
        perturbation), ``tail_s`` (closing the IO), ``wall_s``, ``steps``. They add
        up: setup + steps x (all phases but perturb) + tail = wall
    """
    from earth2studio.perturbation import Gaussian

    steps = min(nsteps, BREAKDOWN_STEPS)
    names = ("model", "map_coords", "split_coords", "d2h", "write", "progress")
    totals = dict.fromkeys(("data", "add_array", *names, *STEP), 0.0)
    marks: dict[str, float] = {}
    io = _TimedIO(
        make_ensemble_io(io_name, tmp, model, steps, batch_size), device, totals
    )
    noise = Gaussian(noise_amplitude=NOISE, seed=0)
    perturb = _timed(noise, device, totals, "perturb")
    with _instrumented(model, device, totals, marks), core_timer(model, device, totals):
        wall = run_ensemble(
            model, io, batch_size, steps, batch_size, device, selection, marks, perturb
        )
    loop_s = marks["returned"] - marks["loop"]
    totals["model_rest"] = totals["model"] - totals["core"]
    inside = ("model", "map_coords", "split_coords", "d2h", "write", "progress")
    totals["loop"] = loop_s - sum(totals[p] for p in inside)
    out = {f"{p}_ms": 1e3 * totals[p] / steps for p in STEP}
    out["setup_s"] = marks["loop"] - marks["start"]
    out["tail_s"] = marks["end"] - marks["returned"]
    out["wall_s"] = wall
    out["steps"] = steps
    return out


def read_step(path: Path, step: int) -> dict[str, torch.Tensor]:
    """Every array of a Zarr store at lead-time index ``step``, all members."""
    import zarr

    root = zarr.open_group(str(path), mode="r")
    out = {}
    for name, array in root.arrays():
        dims = list(getattr(array.metadata, "dimension_names", None) or ())
        if "lead_time" not in dims or "ensemble" not in dims:
            continue
        index = tuple(step if d == "lead_time" else slice(None) for d in dims)
        out[name] = torch.as_tensor(np.asarray(array[index]))
    return out


def _store_path(io: Any) -> Path | None:
    for attr in ("store", "_store"):
        root = getattr(getattr(io, attr, None), "root", None)
        if root is not None:
            return Path(root)
    name = getattr(io, "file_name", None)
    return Path(name) if name else None


def _tree_bytes(path: Path | None) -> int | None:
    if path is None or not path.exists():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure_ensemble(spec: dict[str, Any]) -> dict[str, Any]:
    """One row (see the module docstring), in this process.

    Parameters
    ----------
    spec : dict[str, Any]
        ``model``, ``size``, ``device``, ``run`` (``eager``, ``eager-tf32``,
        ``compiled``), ``precision`` (compiled rows), ``nensemble``, ``steps``,
        ``batch_size``, ``io``, ``outputs``; optional ``reference`` (a ``.pt`` path),
        ``save_reference``, ``prime`` (compile only: one batch, two steps),
        ``breakdown`` (default True)

    Returns
    -------
    dict[str, Any]
        The spec plus the figures; ``oom`` and ``error`` where it ran out of memory
    """
    from loguru import logger

    from earth2studio_compile import CompileSession
    from earth2studio_compile.tools import zoo

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    device = torch.device(spec["device"])
    model = zoo.build(spec["model"], size=spec["size"]).to(device)
    b = int(spec["batch_size"])
    n, steps = int(spec["nensemble"]), int(spec["steps"])
    if spec.get("prime"):
        n, steps = b, 2  # DLWP: one model call yields two steps
    selection = output_coords(model, spec["outputs"])
    result: dict[str, Any] = {**spec, "model_class": type(model).__name__}
    result["store_bytes_expected"] = store_bytes(model, n, steps, spec["outputs"])
    with tempfile.TemporaryDirectory(dir=spec.get("workdir")) as directory:
        tmp = Path(directory)
        free = shutil.disk_usage(tmp).free
        if result["store_bytes_expected"] > 0.9 * free:
            gb = result["store_bytes_expected"] / 1e9
            return {
                **result,
                "error": f"store needs {gb:.1f} GB, {free / 1e9:.1f} free",
            }
        run = spec["run"]
        session = (
            CompileSession(model, precision=spec.get("precision"))
            if run == COMPILED
            else contextlib.nullcontext()
        )
        io = make_ensemble_io(spec["io"], tmp, model, steps, n)
        marks: dict[str, float] = {}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            with tf32(run == EAGER_TF32), session:
                with first_step_timer(model, device, marks):
                    wall = run_ensemble(
                        model, io, n, steps, b, device, selection, marks=marks
                    )
                peak = (
                    torch.cuda.max_memory_allocated(device)
                    if device.type == "cuda"
                    else None
                )
                if spec.get("breakdown", True) and not spec.get("prime"):
                    result["breakdown"] = breakdown(
                        model, spec["io"], b, steps, device, tmp, selection
                    )
        except torch.OutOfMemoryError as err:
            why = str(err).strip().splitlines()[0][:160]
            return {**result, "oom": True, "error": f"out of memory: {why}"}
        if run == COMPILED:
            result["report"] = session.report.to_dict()  # type: ignore[union-attr]
        first = marks["first_step_s"]
        result.update(
            wall_s=wall,
            member_steps=n * steps,
            member_steps_per_s=n * steps / wall,
            # The first batch's first step is b member-steps; the rest of the run
            # is everything else.
            steady_member_steps_per_s=(n * steps - b) / (wall - first),
            first_step_s=first,
            peak_gpu_bytes=peak,
            peak_gpu_bytes_per_member=None if peak is None else peak / b,
            store_bytes=_tree_bytes(_store_path(io)),
        )
        _compare(result, spec, _store_path(io))
    return result


def _compare(result: dict[str, Any], spec: dict[str, Any], path: Path | None) -> None:
    """Save the reference (eager fp32) or add ``rel_l2_first`` against it."""
    ref = Path(spec["reference"]) if spec.get("reference") else None
    if ref is None or path is None or spec.get("prime"):
        return
    step1 = read_step(path, 1)
    if spec.get("save_reference"):
        torch.save(step1, ref)
    elif ref.exists():
        saved = torch.load(ref)
        shared = sorted(set(saved) & set(step1))
        if shared:
            a = torch.stack([step1[k] for k in shared])
            result["rel_l2_first"] = rel_l2(a, torch.stack([saved[k] for k in shared]))


# -- The CLI's plan, loop and tables ---------------------------------------------------
def label(r: dict[str, Any]) -> str:
    """``eager``, ``eager-tf32`` or ``compiled tf32``."""
    return f"{r['run']} {r['precision']}" if r["run"] == COMPILED else r["run"]


def plan_rows(args: Any) -> list[dict[str, Any]]:
    """One spec per row, in order: per model and IO backend, each batch size's
    eager, eager TF32 (CUDA, unless ``--no-precision-eager``) and compiled rows (a
    cold prime then the warm row, or one cold row with ``--no-warm``), then the
    all-variables rows (``--all-variables``: eager and the last precision compiled,
    at the largest batch size)."""
    size = "small" if args.small else "full"
    runs: list[tuple[str, str | None]] = [(EAGER, None)]
    if args.device == "cuda" and args.precision_eager:
        runs.append((EAGER_TF32, None))
    runs += [(COMPILED, p) for p in args.precision_list or ["fp32", "tf32", "bf16"]]
    specs = []
    for model in args.model_list:
        for io in args.io_list or ["zarr-disk"]:
            outputs = [("few", b) for b in args.batch_list]
            if args.all_variables:
                outputs.append(("all", max(args.batch_list)))
            for kind, b in outputs:
                chosen = runs if kind == "few" else [runs[0], runs[-1]]
                for run, precision in chosen:
                    base = {
                        "model": model,
                        "mode": "ensemble",
                        "run": run,
                        "precision": precision,
                        "size": size,
                        "device": args.device,
                        "nensemble": args.ensemble,
                        "steps": args.steps,
                        "batch_size": b,
                        "io": io,
                        "outputs": kind,
                        # One bundle directory and local cache per compiled config:
                        # the warm row reads what its prime saved, nothing else.
                        "tag": f"{model}-ens-{precision or run}-b{b}".replace(":", "_"),
                    }
                    if run == COMPILED and args.warm:
                        specs.append({**base, "cache": "cold", "prime": True})
                        specs.append({**base, "cache": "warm"})
                    else:
                        specs.append(
                            {**base, "cache": "cold" if run == COMPILED else None}
                        )
    return specs


def _kind(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["model"], r["io"], r["outputs"], r["run"], r.get("precision"))


def _skip_reason(spec: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """A larger batch of a kind that ran out of memory is not tried."""
    for r in rows:
        if (
            r.get("oom")
            and _kind(r) == _kind(spec)
            and spec["batch_size"] > r["batch_size"]
        ):
            return f"skipped: batch {r['batch_size']} ran out of memory"
    return None


def measured(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with a throughput (no prime, no error)."""
    return [r for r in rows if not r.get("prime") and "member_steps_per_s" in r]


def _best(rows: list[dict[str, Any]], r: dict[str, Any], run: str) -> dict | None:
    same = [
        x
        for x in rows
        if x["run"] == run
        and (x["model"], x["io"], x["outputs"]) == (r["model"], r["io"], r["outputs"])
    ]
    return max(same, key=lambda x: x["member_steps_per_s"], default=None)


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Ratios per row and the largest batch that fit per kind.

    Returns
    -------
    dict[str, Any]
        ``rows``: per measured row, ``vs_eager`` and ``vs_eager_tf32`` (its
        throughput over the best batch size of upstream eager fp32 / TF32 with the
        same model, IO and outputs; first step included) and ``async_vs_zarr`` (an
        ``async-zarr`` row over its ``zarr-disk`` twin); ``largest_batch``: per kind,
        the largest batch size that ran and whether a larger one ran out of memory
    """
    done = measured(rows)
    out_rows = []
    for r in done:
        entry = {k: r[k] for k in ("model", "io", "outputs", "run", "precision")}
        entry["batch_size"] = r["batch_size"]
        for run, key in ((EAGER, "vs_eager"), (EAGER_TF32, "vs_eager_tf32")):
            best = _best(done, r, run)
            entry[key] = (
                r["member_steps_per_s"] / best["member_steps_per_s"] if best else None
            )
            entry[f"{key}_batch"] = best["batch_size"] if best else None
        twin = next(
            (
                x
                for x in done
                if r["io"] == "async-zarr"
                and x["io"] == "zarr-disk"
                and _kind(x)[2:] == _kind(r)[2:]
                and x["model"] == r["model"]
                and x["batch_size"] == r["batch_size"]
            ),
            None,
        )
        entry["async_vs_zarr"] = (
            r["member_steps_per_s"] / twin["member_steps_per_s"] if twin else None
        )
        out_rows.append(entry)
    largest: dict[str, Any] = {}
    for r in rows:
        if r.get("prime"):
            continue
        key = " ".join(str(x) for x in _kind(r) if x is not None)
        entry = largest.setdefault(key, {"fits": None, "oom_at": None})
        if "member_steps_per_s" in r:
            entry["fits"] = max(entry["fits"] or 0, r["batch_size"])
        if r.get("oom"):
            entry["oom_at"] = min(entry["oom_at"] or r["batch_size"], r["batch_size"])
    return {"rows": out_rows, "largest_batch": largest}


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _vs(ratio: float | None, batch: int | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f} (B={batch})"


ROW_HEADER = [
    "model",
    "io",
    "out",
    "run",
    "cache",
    "B",
    "mem-steps/s",
    "steady/s",
    "first s",
    "GiB/member",
    "relL2@1",
    "wall s",
]


def row_line(r: dict[str, Any]) -> list[str]:
    """One row of the measurement table."""
    head = [r["model"], r["io"], r["outputs"], label(r), r.get("cache") or ""]
    head.append(str(r["batch_size"]))
    if "error" in r or r.get("skipped"):
        return (
            head
            + [
                ("OOM: " if r.get("oom") else "")
                + (r.get("error") or r["skipped"])[:70]
            ]
            + [""] * 5
        )
    if r.get("prime"):
        return head + ["(prime)", "-", _f(r["first_step_s"], ".2f"), "-", "-", "-"]
    mem = r.get("peak_gpu_bytes_per_member")
    return head + [
        _f(r["member_steps_per_s"], ".2f"),
        _f(r["steady_member_steps_per_s"], ".2f"),
        _f(r["first_step_s"], ".2f"),
        _f(mem / 2**30 if mem else None, ".2f"),
        _f(r.get("rel_l2_first"), ".1e"),
        _f(r["wall_s"], ".2f"),
    ]


def tables(rows: Sequence[dict[str, Any]]) -> str:
    """The measurement table, the breakdown, the summary and the largest batches."""
    text = format_table(ROW_HEADER, [row_line(r) for r in rows])
    done = measured(rows)
    header = ["model", "io", "out", "run", "B", *(f"{p} ms" for p in STEP), "setup s"]
    lines = []
    for r in done:
        b = r.get("breakdown")
        if b:
            lines.append(
                [r["model"], r["io"], r["outputs"], label(r), str(r["batch_size"])]
                + [f"{b[f'{p}_ms']:.1f}" for p in STEP]
                + [f"{b['setup_s']:.2f}"]
            )
    if lines:
        text += (
            "\n\nPer batched step (one batch, synchronized around each phase):\n"
            + format_table(header, lines)
        )
    s = summarize(rows)
    header = ["model", "io", "out", "run", "B", "vs eager fp32", "vs eager tf32"]
    header.append("async/zarr")
    lines = []
    for e in s["rows"]:
        lines.append(
            [e["model"], e["io"], e["outputs"], label(e), str(e["batch_size"])]
            + [
                _vs(e["vs_eager"], e["vs_eager_batch"]),
                _vs(e["vs_eager_tf32"], e["vs_eager_tf32_batch"]),
                _f(e["async_vs_zarr"], ".2f"),
            ]
        )
    if lines:
        text += (
            "\n\nThroughput (members x steps per second, first step included) over "
            "upstream eager at its best batch size:\n" + format_table(header, lines)
        )
    fits = [
        f"{k}: largest batch run {v['fits']}"
        + (f", out of memory at {v['oom_at']}" if v["oom_at"] else "")
        for k, v in s["largest_batch"].items()
    ]
    return text + ("\n\n" + "\n".join(fits) if fits else "")


def run_rows(
    args: Any,
    env: dict[str, Any],
    run_one: Callable[[dict[str, Any], int, Path], dict[str, Any]],
) -> int:
    """The ensemble mode's loop: one fresh process per row, the JSON after each.

    Parameters
    ----------
    args : argparse.Namespace
        The CLI's parsed arguments
    env : dict[str, Any]
        Hardware and versions
    run_one : Callable
        Runs one spec in a fresh process (the CLI's ``_run_one``)

    Returns
    -------
    int
        The exit status: 1 if a row failed other than by running out of memory
    """
    from tqdm import tqdm

    specs = plan_rows(args)
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        tqdm(total=len(specs), desc="ensemble") as bar,
    ):
        for spec in specs:
            bar.set_postfix_str(f"{spec['model']} {label(spec)} B={spec['batch_size']}")
            skipped = _skip_reason(spec, rows)
            name = "-".join(str(spec[k]) for k in ("model", "io", "outputs"))
            ref = Path(tmp) / f"ref-{name.replace(':', '_')}-b{spec['batch_size']}.pt"
            spec = {
                **spec,
                "reference": str(ref),
                "save_reference": spec["run"] == EAGER,
                "workdir": tmp,
            }
            if skipped:
                result = {**spec, "skipped": skipped}
            else:
                result = run_one(spec, args.timeout, Path(tmp))
            for key in ("reference", "save_reference", "workdir"):
                result.pop(key, None)
            rows.append(result)
            bar.write(format_table(ROW_HEADER, [row_line(result)]).splitlines()[-1])
            if args.json:
                payload = {
                    "environment": env,
                    "argv": sys.argv,
                    "ensemble": rows,
                    "summary": summarize(rows),
                }
                args.json.write_text(json.dumps(payload, indent=2))
            bar.update(1)
    print(tables(rows))
    print(
        f"\n{env.get('gpu') or 'CPU'}, torch {env['torch']}, earth2studio "
        f"{env.get('earth2studio')}, {args.ensemble} members x {args.steps} steps, "
        f"{'small' if args.small else 'full'} models, {env['date']}"
    )
    failed = [r for r in rows if "error" in r and not r.get("oom")]
    return 1 if failed else 0
