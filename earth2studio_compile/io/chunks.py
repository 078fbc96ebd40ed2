"""Store a step through Zarr's async API one whole chunk at a time.

Zarr writes a selection that spans several chunks chunk by chunk, and for each one
whose value is not exactly that chunk (the step's slab of 8 members is not one
member's chunk) it fills a new chunk with the fill value, copies the part in, and
compares the result with the fill value to skip empty chunks: on an H100's host,
for DLWP's 8-member steps, ~2/3 of each writer thread's time (2026-11-26). Handed
one value per chunk, exactly the chunk, Zarr stores it as it is.

The comparison (``write_empty_chunks=False``, Zarr's default) is kept wherever it
could change what is stored: a chunk whose first element differs from the fill value
cannot be all fill value, so it is stored as ``write_empty_chunks=True`` would store
it; any other chunk goes through the array's ``setitem`` as opened. The store ends up
with the same keys and bytes as one ``setitem`` of the whole selection.

A chunk surely not fill value, of the array's dtype, is stored by Zarr's own storage
step for a whole chunk (:func:`_set_chunk`: the array's codec pipeline encodes it, its
store path sets it under the chunk's key) without ``setitem``'s indexing, batching and
merging around it: ~0.02 ms of Python per chunk against ~0.12 ms (this project's
2-core machine, 2026-11-26). Python is what a writer thread spends the GIL on while
the workflow's own thread waits for it: with Zarr's memory store behind
:class:`~earth2studio_compile.io.OverlappedIO`, a compiled DLWP ensemble's model
steps took 10 times longer than with a store that drops its writes (H100,
2026-11-26).

In a local directory such chunks are written without the event loop, by
:mod:`~earth2studio_compile.io.local_store` (the same keys and bytes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from concurrent.futures import Executor
from typing import Any, cast

import numpy as np

__all__ = ["chunk_pieces", "store_by_chunk"]


def chunk_pieces(
    selection: tuple[Any, ...],
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    value_shape: tuple[int, ...],
) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]] | None:
    """The chunks a basic selection writes whole, or None where it writes any in part.

    Parameters
    ----------
    selection : tuple[Any, ...]
        One ``slice`` (step 1) per dimension of the array
    shape : tuple[int, ...]
        The array's shape
    chunks : tuple[int, ...]
        Its (regular) chunk shape
    value_shape : tuple[int, ...]
        Shape of the value written

    Returns
    -------
    list[tuple[tuple[slice, ...], tuple[slice, ...]]] | None
        ``(selection in the array, selection in the value)`` per chunk, in the
        chunks' order; None unless every chunk touched is written whole and lies
        within the array (an edge chunk is stored at full size, so it is never whole)
    """
    if not (len(selection) == len(shape) == len(chunks) == len(value_shape)):
        return None
    ranges, starts = [], []
    for s, n, c, v in zip(selection, shape, chunks, value_shape):
        if not isinstance(s, slice) or s.step not in (None, 1):
            return None
        start, stop, _ = s.indices(n)
        if stop - start != v or v == 0 or start % c or stop % c:
            return None
        ranges.append([(k, min(k + c, stop)) for k in range(start, stop, c)])
        starts.append(start)
    return [
        (
            tuple(slice(a, b) for a, b in piece),
            tuple(slice(a - o, b - o) for (a, b), o in zip(piece, starts)),
        )
        for piece in itertools.product(*ranges)
    ]


def _surely_not_fill(value: np.ndarray, fill: Any) -> bool:
    """Whether ``value`` (non-empty) cannot be all ``fill`` by Zarr's comparison
    (equal, NaN equal to NaN, or for a zero fill the same bits): its first element
    differs from ``fill`` in value."""
    if fill is None:  # Zarr v2 without a fill value: never skipped
        return True
    first = value[(0,) * value.ndim]
    try:
        if bool(first == fill):
            return False
        return not (bool(np.isnan(first)) and bool(np.isnan(fill)))
    except (TypeError, ValueError):  # types np.isnan does not take: not numbers
        return False


async def store_by_chunk(
    array: Any,
    selection: tuple[Any, ...],
    value: np.ndarray,
    unchecked: Any | None = None,
    copy: bool = False,
    pool: Executor | None = None,
) -> None:
    """``await array.setitem(selection, value)``, one whole chunk at a time where
    the selection writes whole chunks of an unsharded array (the same bytes and
    keys stored either way; see the module's docstring).

    Parameters
    ----------
    array : zarr.AsyncArray
        The array, opened on the running event loop
    selection : tuple[Any, ...]
        A basic selection
    value : np.ndarray
        Exactly the selection's shape
    unchecked : zarr.AsyncArray | None, optional
        ``array.with_config({"write_empty_chunks": True})``, kept by a caller that
        stores to the array often; by default made here
    copy : bool, optional
        Store a copy of ``value``, not ``value`` itself, by default False: for a
        store that keeps what it is given (Zarr's memory store) while the caller
        reuses ``value``
    pool : Executor | None, optional
        Where the chunks' copies are made, several at once (page faults into fresh
        memory, mostly, on several cores), the event loop waiting (it is meant to
        be a writer's own); by default on the calling thread. Not the event loop's
        executor: its hop per chunk (futures chained to the loop, a wake-up each)
        was Python that the workflow's thread waited on for the GIL
    """
    pieces = _whole_chunks(array, selection, value)
    if pieces is None:
        await array.setitem(selection, np.array(value) if copy else value)
        return
    fill = getattr(array.metadata, "fill_value", None)
    if unchecked is None:
        unchecked = array.with_config({"write_empty_chunks": True})

    # setitem casts to the array's dtype: only a value already of it skips setitem.
    native = value.dtype.name == array.dtype.name

    values = [value[inner] for _, inner in pieces]
    if copy:
        values = _copies(values, pool)

    async def store(outer: tuple[slice, ...], piece: np.ndarray) -> None:
        if not _surely_not_fill(piece, fill):
            await array.setitem(outer, piece)
        elif native:
            await _set_chunk(unchecked, outer, piece)
        else:
            await unchecked.setitem(outer, piece)

    await asyncio.gather(*(store(outer, v) for (outer, _), v in zip(pieces, values)))


def _whole_chunks(
    array: Any, selection: tuple[Any, ...], value: np.ndarray
) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]] | None:
    """:func:`chunk_pieces` for an unsharded array with a regular chunk grid, or
    None."""
    if getattr(array, "shards", None) is not None:
        return None
    try:
        chunks = tuple(array.chunks)
    except NotImplementedError:  # not a regular chunk grid
        return None
    return chunk_pieces(selection, array.shape, chunks, value.shape)


def _copies(values: list[np.ndarray], pool: Executor | None) -> list[np.ndarray]:
    """A copy of each of ``values``, made on ``pool`` where given (numpy lets go of
    the GIL while it copies)."""
    if pool is None:
        return [np.array(v) for v in values]
    return [f.result() for f in [pool.submit(np.array, v) for v in values]]


async def _set_chunk(array: Any, outer: tuple[slice, ...], piece: np.ndarray) -> None:
    """``await array.setitem(outer, piece)`` where ``piece`` is exactly the chunk at
    ``outer``, of the array's dtype, and the array stores every chunk
    (``write_empty_chunks=True``): what Zarr's ``setitem`` does for such a chunk
    (Zarr 3.1's ``_set_selection`` and codec pipeline ``write``), without the rest.
    The same key and bytes (tested against ``setitem``, Zarr formats 2 and 3)."""
    key, chunk, spec = _chunk(array, outer, piece)
    (encoded,) = await array.codec_pipeline.encode([(chunk, spec)])
    if encoded is None:  # a codec that drops it: leave that to Zarr's own path
        await array.setitem(outer, piece)
        return
    await (array.store_path / key).set(encoded)


def _spec(array: Any, coords: tuple[int, ...]) -> tuple[Any, Any]:
    """The buffer prototype and the spec Zarr's ``setitem`` encodes the chunk at
    ``coords`` of ``array`` with."""
    from zarr.buffer import default_buffer_prototype

    metadata = array.metadata
    config = array.config
    if metadata.zarr_format == 2:  # as setitem: a v2 array's order is its metadata's
        config = dataclasses.replace(config, order=metadata.order)
    prototype = default_buffer_prototype()
    return prototype, metadata.get_chunk_spec(coords, config, prototype)


def _chunk(
    array: Any,
    outer: tuple[slice, ...],
    piece: np.ndarray,
    made: tuple[Any, Any] | None = None,
) -> tuple[Any, ...]:
    """What Zarr's ``setitem`` encodes and stores for the whole chunk ``piece`` at
    ``outer``: its key under the array's path, the chunk as Zarr's buffer, and the
    chunk's spec (for :func:`_set_chunk` and :func:`.local_store.store_local`);
    ``made``, where given, is :func:`_spec`'s for a chunk of the same regular grid
    (Zarr 3.1 takes a chunk's coordinates but returns the same spec for every chunk
    of one)."""
    metadata = array.metadata
    coords = tuple(s.start // c for s, c in zip(outer, array.chunks))
    prototype, spec = _spec(array, coords) if made is None else made
    chunk = prototype.nd_buffer.from_ndarray_like(cast(Any, piece))
    return metadata.encode_chunk_key(coords), chunk, spec
