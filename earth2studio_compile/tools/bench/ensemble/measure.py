"""One row of the ensemble mode, measured in this process (:func:`measure_ensemble`).

Run as ``python -m earth2studio_compile.tools.bench.ensemble.measure SPEC_JSON
OUT_JSON``, once per row, by the CLI's fresh-process runner.

Throughput from the call of ``ensemble`` until the store is written, the first
step's seconds (:func:`first_step_timer`), peak GPU memory, relative L2 against the
eager fp32 reference and the breakdown (:mod:`.breakdown`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from earth2studio_compile.metrics import rel_l2, synchronize
from earth2studio_compile.tools.bench.ensemble.breakdown import breakdown, floors
from earth2studio_compile.tools.bench.ensemble.upstream import (
    COMPILED,
    EAGER_TF32,
    make_ensemble_io,
    output_coords,
    read_step,
    run_ensemble,
    store_bytes,
    store_path,
    tf32,
    tree_bytes,
)


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


def measure_ensemble(spec: dict[str, Any]) -> dict[str, Any]:
    """One row, in this process (:mod:`earth2studio_compile.tools.bench.ensemble`).

    Parameters
    ----------
    spec : dict[str, Any]
        ``model``, ``size``, ``device``, ``run`` (``eager``, ``eager-tf32``,
        ``compiled``), ``precision`` (compiled rows), ``nensemble``, ``steps``,
        ``batch_size``, ``io``, ``outputs``; optional ``reference`` (a ``.pt`` path),
        ``save_reference``, ``prime`` (compile only: one batch, two steps),
        ``breakdown`` (default True), ``floors`` (compiled rows, default True)

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
                if (
                    run == COMPILED
                    and spec.get("floors", True)
                    and not spec.get("prime")
                ):  # in the session: the compiled step the run used
                    result["floors"] = floors(
                        model, n, steps, b, device, tmp, spec["outputs"]
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
            store_bytes=tree_bytes(store_path(io)),
        )
        if "floors" in result:
            result["wall_over_floor"] = wall / result["floors"]["floor_s"]
        _compare(result, spec, store_path(io))
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


def main() -> None:
    spec, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    out.write_text(json.dumps(measure_ensemble(spec)))


if __name__ == "__main__":
    main()
