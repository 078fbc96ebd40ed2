"""Store whole chunks straight into a local directory, as Zarr's ``LocalStore``
stores them, without an event loop (:func:`store_local`, or :func:`local_chunks` for
a caller that schedules the writes itself), and make their directories ahead of the
writes (:func:`directories_ahead`).

The chunks, and what decides that a chunk is stored so, are those of Zarr's async
path by chunk (:mod:`~earth2studio_compile.io.chunks`): the same keys and bytes.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, wait
from pathlib import Path
from typing import Any, cast
from uuid import uuid4

import numpy as np

from earth2studio_compile.io.chunks import (
    _chunk,
    _spec,
    _surely_not_fill,
    _whole_chunks,
)
from earth2studio_compile.io.directories import known_directories, make_directory

__all__ = ["directories_ahead", "local_chunks", "store_local"]

#: Chunk directories :func:`directories_ahead` makes at most per call: about as many
#: as the directories a store keeps known (``directories._KNOWN_AT_MOST``), within
#: which a larger store's first chunks (its first members' lead times) are made.
AHEAD_AT_MOST = 1 << 13


def store_local(
    array: Any,
    selection: tuple[Any, ...],
    value: np.ndarray,
    files: Executor | None = None,
) -> bool:
    """Store ``value`` at ``selection`` of an array in a local directory, one whole
    chunk at a time, synchronously: the same keys and bytes as
    :func:`~earth2studio_compile.io.chunks.store_by_chunk`, without an event loop.

    It applies where ``store_by_chunk`` would store every chunk by Zarr's own
    storage step (``chunks._set_chunk``: whole chunks of an unsharded array, of its
    dtype, each surely not fill value) and the array is encoded by its bytes codec
    alone (upstream ``ZarrBackend``'s default, no compressor) in Zarr's
    ``LocalStore``. Each chunk
    is then encoded by that codec's synchronous step and written as the store's own
    file step writes it (a temporary file renamed into place, :func:`_write`), no
    coroutine, no batch, no hop to an executor. Through those (their Python per
    chunk taking turns at the GIL), FCN's ensemble steps were stored at 4.1-4.3 GB/s
    from 8 threads, with the codec called synchronously too; the same files written
    by hand at 7.0 (H100 host, 2026-11-27, docs/bench/2026-11-27-h100-fourteenth).
    A chunk's directory is made once per store, not for every chunk as that file
    step does, and made again where it was removed; directories are made side by
    side (see :func:`~earth2studio_compile.io.directories.make_directory`). In
    Earth2Studio's stores (one chunk per member and lead time) each chunk has a
    directory of its own, so they are made for each: ahead of the writes, by
    :func:`directories_ahead`, where the store's arrays are new.

    Parameters
    ----------
    array : zarr.AsyncArray
        The array (its metadata and store are read; no coroutine is run)
    selection : tuple[Any, ...]
        A basic selection
    value : np.ndarray
        Exactly the selection's shape
    files : Executor | None, optional
        Where the chunks are written, several at once; by default on the calling
        thread, one after another. Every chunk's write has ended when this returns,
        also when one failed (its error is raised)

    Returns
    -------
    bool
        Whether it stored the value; False where it does not apply, nothing stored
    """
    planned = local_chunks(array, selection, value)
    if planned is None:
        return False
    put, jobs = planned
    if files is None:
        for outer, piece in jobs:
            put(outer, piece)
        return True
    futures = [files.submit(put, outer, piece) for outer, piece in jobs]
    wait(futures)
    for future in futures:
        future.result()
    return True


def local_chunks(
    array: Any, selection: tuple[Any, ...], value: np.ndarray
) -> tuple[Callable[[tuple[slice, ...], np.ndarray], None], list[Any]] | None:
    """What :func:`store_local` writes, not written: the function that stores one
    whole chunk, and each chunk's place and value, or None where it does not apply.

    Parameters
    ----------
    array : zarr.AsyncArray
        The array (its metadata and store are read)
    selection : tuple[Any, ...]
        A basic selection
    value : np.ndarray
        Exactly the selection's shape

    Returns
    -------
    tuple[Callable, list[tuple[tuple[slice, ...], np.ndarray]]] | None
        ``put`` and its ``(outer, piece)`` arguments, one per chunk (``piece`` a
        view of ``value``), in the chunks' order; ``put(outer, piece)`` may run on
        any thread, several at once (each chunk is its own file)
    """
    put = _local_put(array)
    pieces = _whole_chunks(array, selection, value) if put is not None else None
    if put is None or pieces is None or value.dtype.name != array.dtype.name:
        return None
    fill = getattr(array.metadata, "fill_value", None)
    jobs = [(outer, value[inner]) for outer, inner in pieces]
    if not all(_surely_not_fill(piece, fill) for _, piece in jobs):
        return None
    return put, jobs


def directories_ahead(
    arrays: Sequence[Any], stop: threading.Event, at_most: int = AHEAD_AT_MOST
) -> int:
    """Make the directories :func:`store_local` would make as the chunks of
    ``arrays`` are written, ahead of their writes (see
    :mod:`~earth2studio_compile.io.directories`).

    Only for arrays :func:`store_local` stores (bytes codec alone, in an open,
    writable ``LocalStore``). Chunks are taken in the order of their grid (in
    Earth2Studio's stores, a member's lead times, then the next member's: the order
    an ensemble's batches write them), the arrays' chunks at one position one after
    another, until ``at_most`` directories or ``stop``. A directory made ahead is
    one the writers would have made: its chunk comes in the same store's writes.

    Parameters
    ----------
    arrays : Sequence[zarr.AsyncArray]
        Arrays just created, none of their chunks written
    stop : threading.Event
        Set to stop after the directory being made
    at_most : int, optional
        Directories made at most, by default :data:`AHEAD_AT_MOST`

    Returns
    -------
    int
        Chunk directories made (with their new parents)
    """
    grids: dict[tuple[int, ...], list[Any]] = {}
    for array in arrays:
        if _local_codec(array) is not None:
            grids.setdefault(tuple(array.cdata_shape), []).append(array)
    made = 0
    for grid, alike in grids.items():
        tops = [(a, _top(a), known_directories(a.store_path.store)) for a in alike]
        for coords in itertools.product(*map(range, grid)):
            for array, top, known in tops:
                if stop.is_set() or made >= at_most:
                    return made
                key = array.metadata.encode_chunk_key(coords)
                directory = f"{top}/{key}".rpartition("/")[0]
                if directory not in known:
                    make_directory(directory, known, top)
                    made += 1
    return made


def _top(array: Any) -> str:
    """The directory of ``array`` in its local store (made with the array: its
    metadata is there), normalised; a chunk's file is this, ``/`` and the chunk's
    key (Zarr's keys are ``/``-separated)."""
    root = os.fspath(array.store_path.store.root)
    return os.path.normpath(os.path.join(root, array.store_path.path))


def _local_codec(array: Any) -> Any:
    """The bytes codec of ``array`` where it is bytes-codec-only in an open, writable
    ``LocalStore`` (exactly that class: a subclass may store otherwise), else None."""
    try:
        from zarr.codecs import BytesCodec
        from zarr.core.codec_pipeline import BatchedCodecPipeline
        from zarr.storage import LocalStore
    except ImportError:  # another Zarr: its async path
        return None
    store = array.store_path.store
    pipeline = array.codec_pipeline
    if (
        type(store) is not LocalStore
        or store.read_only
        or not store._is_open
        or type(pipeline) is not BatchedCodecPipeline
        or pipeline.array_array_codecs
        or pipeline.bytes_bytes_codecs
        or type(pipeline.array_bytes_codec) is not BytesCodec
    ):
        return None
    return pipeline.array_bytes_codec


def _local_put(array: Any) -> Callable[[tuple[slice, ...], np.ndarray], None] | None:
    """A function storing one whole chunk of ``array`` synchronously (see
    :func:`store_local`), or None where :func:`_local_codec` finds none."""
    codec = _local_codec(array)
    if codec is None:
        return None
    from zarr.storage import _local
    from zarr.storage._local import _put

    # Zarr 3.1 writes a file as a temporary renamed into place (its _atomic_write),
    # as _write does; a Zarr without it keeps its own whole file step (a mkdir per
    # chunk).
    atomic = hasattr(_local, "_atomic_write")
    known = known_directories(array.store_path.store)
    top = _top(array)  # where a new chunk's directories start at the latest
    # Alike for every chunk of a regular grid (the only one store_local takes):
    # made once a call, not per chunk (a sixth of a put thread's Python per chunk,
    # this project's CPU machine, 2026-11-28).
    made = _spec(array, (0,) * array.ndim)

    def put(outer: tuple[slice, ...], piece: np.ndarray) -> None:
        key, chunk, spec = _chunk(array, outer, piece, made)
        # The bytes codec returns a buffer for every chunk (None is for codecs that
        # drop one).
        encoded = cast(Any, codec._encode_sync(chunk, spec))
        path = f"{top}/{key}"
        if not atomic:
            _put(Path(path), encoded)
            return
        directory = path.rpartition("/")[0]
        if directory not in known:
            make_directory(directory, known, top)
        try:
            _write(path, encoded)
        except FileNotFoundError:
            # Removed since it was made (by someone else): made again, not lost.
            os.makedirs(directory, exist_ok=True)
            _write(path, encoded)

    return put


#: How a chunk's temporary file is opened: as ``open(path, "wb")`` opens it.
_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_TRUNC
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
#: Temporary names: Zarr draws a ``uuid4`` per file (a system call); here one per
#: process (with its id, also after a fork) and a count.
_TOKEN = uuid4().hex[:16]
_serial = itertools.count()


def _write(path: str, value: Any) -> None:
    """Write ``value`` (Zarr's buffer) to the file ``path`` in a directory that
    exists, as Zarr 3.1's ``LocalStore`` does (``zarr.storage._local._put`` without
    its mkdir: a temporary file beside it, renamed into place; removed if that
    fails), in four system calls where it took eight.

    Each call lets go of the GIL and must take it back, waiting for the Python of
    every other writer thread and of the workflow's own: Python's buffered
    ``open`` adds a ``fstat``, an ``ioctl`` and an ``lseek`` to the ``open``, and
    Zarr's ``uuid4`` a ``getrandom``. With those, Zarr's file step moved a step's
    chunks at about half the rate of threads writing the same files with one
    ``open`` and ``write`` each (docs/bench/2026-11-28-cpu-writers).

    Parameters
    ----------
    path : str
        The chunk's file
    value : zarr.core.buffer.Buffer
        The encoded chunk
    """
    view = memoryview(value.as_buffer_like()).cast("B")
    partial = f"{path}.{os.getpid()}-{_TOKEN}-{next(_serial)}.partial"
    fd = os.open(partial, _FLAGS, 0o666)
    try:
        try:
            while view:  # one call for a regular file; more only if it is cut short
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:  # its own error, if any, is not the one to raise
            pass
        raise
