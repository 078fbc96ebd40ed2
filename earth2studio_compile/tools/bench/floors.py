"""The storage floors of the workflow mode (:mod:`.calls`) and the ensemble
breakdown: a store's bytes copied to the host a step at a time into reused buffers, as
:class:`~earth2studio_compile.io.OverlappedIO` copies a step, then kept
by a pool of writer threads, one array per variable per step as the Zarr stores
chunk them: written to files with ``numpy.save`` (:func:`write_store`, against
stores on disk), or copied into fresh host memory (:func:`write_memory`, against
stores in memory, which keep what they are given).

A store on disk with upstream's chunks (one member, one variable, one lead time a
chunk) is as many files as it has chunks, each in directories of its own:
:func:`write_chunks` writes the same bytes that way, the floor of that layout. On an
H100 host (2026-11-27), DLWP's ensemble store (9.77 GB) took 1.01 s as its 2352 chunk
files and 0.64 s as a file per variable per step (8 members a file), from 8 threads
each: files and directories made, not bytes.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: Writer threads of the storage floor unless the spec says: as many as the fastest
#: backend of the comparison uses (``AsyncZarrBackend``'s pool of 8; ``OverlappedIO``
#: uses min(8, cores)), so the floor is below what parallel writing reaches.
FLOOR_WRITERS = 8


def storage_floor(
    tmp: Path,
    total: int,
    writes: int,
    variables: int,
    device: Any,
    writers: int,
    memory: bool = False,
    members: int | None = None,
) -> dict[str, Any]:
    """The storage floor of a store of ``total`` bytes: :func:`write_store` with one
    writer, then with ``writers``, then an ``os.sync()`` (timed, not in the floor);
    then :func:`write_chunks` with ``writers``.

    Parameters
    ----------
    tmp : Path
        Where the files go (removed after)
    total : int
        The store's bytes, float32
    writes : int
        Host copies of a step (lead times x batches); each is written as
        ``variables`` files
    variables : int
        Variables written per step
    device : Any
        Where a step lives before its copy
    writers : int
        Writer threads of the floor
    memory : bool, optional
        Also the in-memory floor, by default False
    members : int | None, optional
        Members of a step (an ensemble's batch), each a chunk of its own; by
        default None: a store without an ensemble dimension

    Returns
    -------
    dict[str, Any]
        ``io_floor_s`` (``writers`` threads), ``io_floor_writers``,
        ``io_floor_1writer_s``, ``io_sync_s``, ``io_chunks_floor_s``
        (:func:`write_chunks` with ``writers`` threads), ``io_chunks``
        (files it wrote); with ``memory``, ``io_memory_floor_s``
        (:func:`write_memory` with ``writers`` threads)
    """
    values = total // (4 * writes * variables)
    out: dict[str, Any] = {}
    seconds: dict[int, float] = {}
    for n in dict.fromkeys((1, writers)):  # one writer first; once if writers is 1
        directory = tmp / f"floor-{n}"
        directory.mkdir()
        seconds[n] = write_store(directory, writes, variables, values, device, n)
        if n == writers:
            start = time.perf_counter()
            os.sync()
            out["io_sync_s"] = time.perf_counter() - start
        shutil.rmtree(directory)
    out["io_floor_s"], out["io_floor_writers"] = seconds[writers], writers
    out["io_floor_1writer_s"] = seconds[1]
    directory = tmp / "floor-chunks"
    directory.mkdir()
    out["io_chunks_floor_s"] = write_chunks(
        directory, writes, variables, values, device, writers, members
    )
    out["io_chunks"] = writes * variables * (members or 1)
    shutil.rmtree(directory)
    if memory:
        out["io_memory_floor_s"] = write_memory(
            writes, variables, values, device, writers
        )
    return out


def write_store(
    directory: Path, writes: int, variables: int, values: int, device: Any, writers: int
) -> float:
    """Seconds to write a store's bytes with ``numpy.save`` from ``writers`` threads.

    Each of ``writes`` steps (steps x batches) is one device tensor of ``variables`` x
    ``values`` float32, copied to the host into a reused buffer (:func:`_write_steps`),
    then saved one file per variable (``floor-{step}-{variable}.npy``), as the Zarr
    stores chunk it, by a ``ThreadPoolExecutor`` of ``writers`` threads (``numpy.save``
    releases the GIL in its file writes). The clock runs from the first copy until every
    file is written and the device is idle; an ``os.sync()`` before it keeps earlier
    writes' dirty pages out of this figure. The files are left in ``directory``.

    Parameters
    ----------
    directory : Path
        An existing directory for the files
    writes, variables, values : int
        Steps, files per step and float32 values per file
    device : Any
        Where the step lives before its copy (``torch.device`` or its name)
    writers : int
        Writer threads

    Returns
    -------
    float
        Wall seconds
    """
    import numpy as np

    def save(i: int, v: int, field: Any) -> None:
        np.save(directory / f"floor-{i}-{v}.npy", field)

    os.sync()
    return _write_steps(writes, variables, values, device, writers, save)


def write_chunks(
    directory: Path,
    writes: int,
    variables: int,
    values: int,
    device: Any,
    writers: int,
    members: int | None = None,
) -> float:
    """Seconds to write a store's bytes as its chunks, with ``numpy.save`` from
    ``writers`` threads.

    As :func:`write_store`, but each field is split into ``members`` equal parts,
    each saved as a file of its own where Zarr's local store puts a chunk of that
    shape: upstream's Zarr stores chunk one member, one lead time and one variable a
    chunk, under the key ``c/<member>/<time>/<lead time>/0/0`` of the variable's
    array (``c/<time>/<lead time>/0/0`` without an ensemble), a directory per key
    part, made as its chunk is written (Zarr's ``LocalStore`` makes them so). Here a
    variable ``v`` of step ``i``, member ``m``, goes to ``v<v>/c/<m>/0/<i>/0/0``:
    as many files and directories as the store, without Zarr's own temporary file and
    rename per chunk, nor its Python.

    Parameters
    ----------
    directory : Path
        An existing directory for the files
    writes, variables, values : int
        Steps, fields per step and float32 values per field (all its members)
    device : Any
        Where the step lives before its copy (``torch.device`` or its name)
    writers : int
        Writer threads
    members : int | None, optional
        Members of a field, a chunk each (as equal as ``numpy.array_split`` makes
        them); by default None: one chunk per field, and no ensemble part in the key

    Returns
    -------
    float
        Wall seconds
    """
    import numpy as np

    def save(i: int, v: int, field: Any) -> None:
        for m, chunk in enumerate(np.array_split(field, members or 1)):
            key = [f"v{v}", "c", *([str(m)] if members else []), "0", str(i), "0"]
            folder = directory.joinpath(*key)
            folder.mkdir(parents=True, exist_ok=True)
            np.save(folder / "0", chunk)

    os.sync()
    return _write_steps(writes, variables, values, device, writers, save)


def write_memory(
    writes: int,
    variables: int,
    values: int,
    device: Any,
    writers: int,
    kept: list[Any] | None = None,
) -> float:
    """Seconds to keep a store's bytes in fresh host memory from ``writers`` threads.

    As :func:`write_store`, but each field is copied into a new array and kept until
    every step is (an in-memory store keeps what it stores: its pages are new memory,
    which the operating system hands out one fault at a time).

    Parameters
    ----------
    writes, variables, values : int
        Steps, fields per step and float32 values per field
    device : Any
        Where the step lives before its copy (``torch.device`` or its name)
    writers : int
        Writer threads
    kept : list[Any] | None, optional
        Where the copies go and stay; by default a list let go on return

    Returns
    -------
    float
        Wall seconds
    """
    copies: list[Any] = [] if kept is None else kept
    return _write_steps(
        writes,
        variables,
        values,
        device,
        writers,
        lambda i, v, field: copies.append(field.copy()),
    )


def _write_steps(
    writes: int,
    variables: int,
    values: int,
    device: Any,
    writers: int,
    store: Callable[[int, int, Any], None],
) -> float:
    """Seconds from the first step's host copy until ``store`` has had every field
    of every step (``store(step, variable, field)``, from a pool of ``writers``
    threads) and the device is idle.

    Each step is copied into one of a few host buffers (pinned from CUDA), made and
    touched before the clock starts and reused once the step they held is stored,
    as :class:`~earth2studio_compile.io.OverlappedIO` reuses its own: a copy into
    fresh memory per step would add the operating system's page faults (~1 GB/s on
    the H100 host, 2026-11-26), which no storage needs, and a floor must not hold
    more than the storage.
    """
    import torch

    from earth2studio_compile.metrics import synchronize

    device = torch.device(device)
    step = torch.randn(variables, values, device=device)
    # Steps in flight: host copies wait for writers, not the whole store in memory.
    depth = max(2, writers)
    pinned = device.type == "cuda"
    free = [
        torch.zeros(variables, values, pin_memory=pinned)
        for _ in range(min(depth, writes))
    ]
    backlog: deque[tuple[Any, list[Future[None]]]] = deque()
    synchronize(device)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=writers) as pool:
        for i in range(writes):
            if not free:
                buffer, futures = backlog.popleft()
                for done in futures:
                    done.result()
                free.append(buffer)
            buffer = free.pop()
            buffer.copy_(step)
            host = buffer.numpy()
            backlog.append(
                (buffer, [pool.submit(store, i, v, host[v]) for v in range(variables)])
            )
        for _, futures in backlog:
            for done in futures:
                done.result()
    synchronize(device)
    return time.perf_counter() - start
