"""The floors a workflow-mode job's calls are measured against (the ``floor`` kind
of :mod:`.calls`): the compiled model's steps alone, and the store's bytes written
as plainly as the machine allows (:mod:`.floors`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.floors import FLOOR_WRITERS, storage_floor

__all__ = ["floor", "store_bytes"]


def store_bytes(spec: dict[str, Any], model: Any) -> int:
    """Bytes of the row's store, float32 and uncompressed: every variable written
    (``spec["outputs"]``: ``all``, the default, or ``few``) of every member at every
    lead time, the initial state included."""
    from earth2studio_compile.tools.bench.ensemble.upstream import (
        store_bytes as ensemble_bytes,
    )

    members = spec["members"] if spec["workflow"] == "ensemble" else 1
    return ensemble_bytes(model, members, spec["steps"], spec.get("outputs", "all"))


def _variables(spec: dict[str, Any], model: Any) -> int:
    """Variables the row writes (``spec["outputs"]``)."""
    from earth2studio_compile.tools.bench.ensemble.upstream import output_coords

    chosen = output_coords(model, spec.get("outputs", "all")).get("variable")
    return len(model.input_coords()["variable"] if chosen is None else chosen)


def floor(spec: dict[str, Any], model: Any, device: Any, tmp: Path) -> dict[str, Any]:
    """The floors of the job's calls.

    Returns
    -------
    dict[str, Any]
        ``eager_step_ms`` and ``compiled_step_ms`` (median ms per forecast step of a
        rollout of ``batch_size`` members, the compiled one after its compile),
        ``model_steps`` (steps the workflow takes: steps x batches),
        ``compute_floor_s`` (``model_steps`` x the compiled step), ``io_floor_s``
        (:func:`.floors.write_store` of the store's bytes with ``io_floor_writers``
        writers, ``spec["writers"]`` or :data:`.floors.FLOOR_WRITERS`),
        ``io_floor_1writer_s`` (the same with one writer), ``io_sync_s`` (the
        ``os.sync()`` after the parallel writes: not in the floor, since no backend
        syncs), ``io_chunks_floor_s`` (the same bytes as the store's chunks,
        :func:`.floors.write_chunks`, with ``io_floor_writers`` writers),
        ``io_chunks`` (their files), ``floor_s`` (``compute_floor_s +
        io_chunks_floor_s``), ``io_memory_floor_s`` (the same bytes kept in host
        memory, :func:`.floors.write_memory`), ``memory_floor_s``
        (``compute_floor_s + io_memory_floor_s``: the floor of stores in memory),
        ``store_bytes_expected``, ``report``
    """
    import numpy as np

    from earth2studio_compile import wait_for_builds
    from earth2studio_compile.tools.bench.measure import eager_precision, time_rollout
    from earth2studio_compile.tools.bench.runs import initial_state

    batch = spec["batch_size"] if spec["workflow"] == "ensemble" else 1
    batches = math.ceil(spec["members"] / batch)  # members is 1 unless an ensemble
    x, coords = initial_state(model, device)
    if spec["workflow"] == "ensemble":
        x = x.unsqueeze(0).repeat(batch, *([1] * x.dim()))
        coords = OrderedDict([("ensemble", np.arange(batch)), *coords.items()])
    # Enough steps for medians over whole model calls (DLWP: two steps per call).
    steps = max(spec["steps"], 8)
    scoped = spec["precision"] if spec["precision"] == "bf16" else None
    with eager_precision(model, scoped):
        time_rollout(model, x, coords, 2)  # one-time costs (kernel selection)
        eager = time_rollout(model, x, coords, steps)
    kwargs = {"precision": scoped, "probe": False}
    time_rollout(model, x, coords, 2, kwargs)  # the compile
    if any(j.poll() == "built" for j in wait_for_builds()):
        time_rollout(model, x, coords, 3, kwargs)  # the switch, the graph capture
    compiled = time_rollout(model, x, coords, steps, kwargs)
    out: dict[str, Any] = {
        "eager_step_ms": eager.steady_ms,
        "compiled_step_ms": compiled.steady_ms,
        "model_steps": spec["steps"] * batches,
        "report": compiled.report,
    }
    out["compute_floor_s"] = out["model_steps"] * compiled.steady_ms / 1e3
    total = store_bytes(spec, model)
    out["store_bytes_expected"] = total
    writes = (spec["steps"] + 1) * batches
    writers = int(spec.get("writers") or FLOOR_WRITERS)
    variables = _variables(spec, model)
    # The in-memory floor too: one floor serves the job's rows on every IO.
    members = batch if spec["workflow"] == "ensemble" else None
    out.update(
        storage_floor(
            tmp, total, writes, variables, device, writers, True, members=members
        )
    )
    # A store on disk is its chunks' files: their floor, not one file per variable.
    out["floor_s"] = out["compute_floor_s"] + out["io_chunks_floor_s"]
    out["memory_floor_s"] = out["compute_floor_s"] + out["io_memory_floor_s"]
    return out
