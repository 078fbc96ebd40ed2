"""Store a step through Zarr's async API one whole chunk at a time.

Zarr writes a selection that spans several chunks chunk by chunk, and for each one
whose value is not exactly that chunk (the step's slab of 8 members is not one
member's chunk) it fills a new chunk with the fill value, copies the part in, and
compares the result with the fill value to skip empty chunks: on an H100's host,
for DLWP's 8-member steps, ~2/3 of each writer thread's time (2026-11-26). Handed
one value per chunk, exactly the chunk, Zarr stores it as it is.

The comparison (``write_empty_chunks=False``, Zarr's default) is kept wherever it
could change what is stored: a chunk whose first element differs from the fill value
cannot be all fill value, so it is written through a copy of the array configured
with ``write_empty_chunks=True``, which stores it exactly as the default would; any
other chunk goes through the array as opened. The store ends up with the same keys
and bytes as one ``setitem`` of the whole selection.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

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
        reuses ``value``. Each chunk is copied on the event loop's default executor,
        so that the chunks' copies (page faults into fresh memory, mostly) run on
        several cores
    """
    pieces = None
    if getattr(array, "shards", None) is None:
        try:
            chunks = tuple(array.chunks)
        except NotImplementedError:  # not a regular chunk grid
            chunks = ()
        if chunks:
            pieces = chunk_pieces(selection, array.shape, chunks, value.shape)
    if pieces is None:
        await array.setitem(selection, np.array(value) if copy else value)
        return
    fill = getattr(array.metadata, "fill_value", None)
    if unchecked is None:
        unchecked = array.with_config({"write_empty_chunks": True})

    async def store(outer: tuple[slice, ...], inner: tuple[slice, ...]) -> None:
        piece = value[inner]
        if copy:
            piece = await asyncio.to_thread(np.array, piece)
        target = unchecked if _surely_not_fill(piece, fill) else array
        await target.setitem(outer, piece)

    await asyncio.gather(*(store(outer, inner) for outer, inner in pieces))
