"""Storing a step one whole chunk at a time: the same keys and bytes as Zarr's own
``setitem`` of the whole selection, without Zarr's fill-copy-compare of each chunk."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zarr
from zarr.core.buffer.cpu import NDBuffer
from zarr.storage import MemoryStore

from earth2studio_compile.io.chunks import chunk_pieces, store_by_chunk

SHAPE, CHUNKS = (4, 3, 6, 10), (1, 1, 6, 10)


def test_whole_chunks_are_split_one_per_chunk():
    pieces = chunk_pieces(
        (slice(0, 4), slice(1, 2), slice(0, 6), slice(None)),
        SHAPE,
        CHUNKS,
        (4, 1, 6, 10),
    )
    assert pieces is not None and len(pieces) == 4
    assert pieces[2] == (
        (slice(2, 3), slice(1, 2), slice(0, 6), slice(0, 10)),
        (slice(2, 3), slice(0, 1), slice(0, 6), slice(0, 10)),
    )


@pytest.mark.parametrize(
    "selection, value_shape, chunks",
    [
        ((slice(0, 4), slice(1, 2), slice(0, 3), slice(None)), (4, 1, 3, 10), CHUNKS),
        ((slice(0, 4), 1, slice(None), slice(None)), (4, 6, 10), CHUNKS),
        (
            (slice(0, 4, 2), slice(1, 2), slice(None), slice(None)),
            (2, 1, 6, 10),
            CHUNKS,
        ),
        (
            (slice(0, 4), slice(0, 3), slice(None), slice(None)),
            (4, 3, 6, 10),
            (4, 2, 6, 10),
        ),
        ((slice(0, 4), slice(1, 2), slice(None), slice(None)), (4, 2, 6, 10), CHUNKS),
    ],
    ids=["part-of-a-chunk", "an-index", "a-step", "an-edge-chunk", "wrong-shape"],
)
def test_anything_but_whole_chunks_is_left_to_zarr(selection, value_shape, chunks):
    assert chunk_pieces(selection, SHAPE, chunks, value_shape) is None


def _stored(fill, value, selection, by_chunk, dtype="float32", **create):
    store = MemoryStore()
    array = zarr.create_array(
        store, shape=SHAPE, chunks=CHUNKS, dtype=dtype, fill_value=fill, **create
    )

    async def write():
        a = await zarr.api.asynchronous.open_array(store=store, mode="r+")
        if by_chunk:
            await store_by_chunk(a, selection, value)
        else:
            await a.setitem(selection, value)

    asyncio.run(write())
    return {k: bytes(v.to_bytes()) for k, v in store._store_dict.items()}, array[:]


@pytest.mark.parametrize("fill", [0.0, np.nan, 1.5])
def test_the_store_holds_what_zarr_would_have_stored(fill):
    """Chunks all fill value (Zarr skips them), chunks that only start with it,
    -0.0 against a zero fill (other bits: Zarr stores it), NaN, ordinary values."""
    value = np.random.default_rng(0).normal(size=(4, 1, 6, 10)).astype("float32")
    value[0] = fill  # skipped by both
    value[1, ..., 0, 0] = fill  # starts like the fill value, is not
    value[2] = -0.0 if fill == 0.0 else np.nan
    selection = (slice(0, 4), slice(2, 3), slice(None), slice(None))
    ours, read_ours = _stored(fill, value, selection, by_chunk=True)
    zarrs, read_zarrs = _stored(fill, value, selection, by_chunk=False)
    assert ours.keys() == zarrs.keys() and ours == zarrs
    np.testing.assert_array_equal(read_ours, read_zarrs, strict=True)
    skipped = 2 if np.isnan(fill) else 1  # NaN equals a NaN fill for Zarr
    assert len([k for k in zarrs if k.startswith("c/")]) == 4 - skipped


def test_whole_chunks_are_stored_as_given(monkeypatch):
    """Zarr fills a new chunk and copies in any value that is not exactly one chunk:
    none of that for a step of whole chunks."""
    made = []
    create = NDBuffer.create.__func__

    def counted(cls, *args, **kwargs):
        made.append(kwargs.get("shape"))
        return create(cls, *args, **kwargs)

    monkeypatch.setattr(NDBuffer, "create", classmethod(counted))
    value = np.ones((4, 1, 6, 10), dtype="float32")
    selection = (slice(0, 4), slice(0, 1), slice(None), slice(None))
    ours, _ = _stored(0.0, value, selection, by_chunk=True)
    assert made == []
    _stored(0.0, value, selection, by_chunk=False)
    assert len(made) == 4  # what it spares: one per chunk


@pytest.mark.parametrize("whole", [True, False], ids=["whole-chunks", "in-part"])
def test_a_copy_is_stored_where_asked(whole):
    """Zarr's memory store keeps what it is handed: with ``copy`` the caller may
    reuse its buffer at once."""
    store = MemoryStore()
    zarr.create_array(store, shape=SHAPE, chunks=CHUNKS, dtype="float32")
    value = np.arange(4 * 6 * 10, dtype="float32").reshape(4, 1, 6, 10) + 1
    if not whole:
        value = value[..., :3, :]
    selection = (slice(0, 4), slice(0, 1), slice(0, value.shape[2]), slice(None))

    async def write():
        a = await zarr.api.asynchronous.open_array(store=store, mode="r+")
        await store_by_chunk(a, selection, value, copy=True)

    asyncio.run(write())
    expected = value.copy()
    value[:] = -1.0  # the caller's next step
    read = zarr.open_array(store, mode="r")[selection]
    np.testing.assert_array_equal(read, expected, strict=True)


@pytest.mark.parametrize(
    "create, dtype",
    [
        ({"compressors": None}, "float32"),  # upstream ZarrBackend's default
        ({}, "float32"),  # Zarr's default compressor
        ({"zarr_format": 2, "compressors": None, "order": "F"}, "float32"),
        ({"zarr_format": 2}, "float32"),
        ({"compressors": None}, "float64"),  # setitem casts: left to it
    ],
    ids=["v3", "v3-zstd", "v2-order-F", "v2-default", "another-dtype"],
)
def test_whole_chunks_skip_setitem_and_store_its_bytes(monkeypatch, create, dtype):
    """A whole chunk surely not fill value, of the array's dtype, is encoded and set
    by Zarr's own codec pipeline and store path, not ``setitem`` (~5x less Python
    per chunk): the same keys and bytes as ``setitem`` of the whole selection."""
    value = np.random.default_rng(1).normal(size=(4, 1, 6, 10)).astype(dtype)
    value[0] = 0.0  # all fill value: Zarr's setitem decides (skips it)
    selection = (slice(0, 4), slice(1, 2), slice(None), slice(None))
    zarrs, read_zarrs = _stored(0.0, value, selection, False, **create)
    calls = []
    setitem = zarr.AsyncArray.setitem

    async def counted(self, selection, value, prototype=None):
        calls.append(selection)
        await setitem(self, selection, value, prototype)

    monkeypatch.setattr(zarr.AsyncArray, "setitem", counted)
    ours, read_ours = _stored(0.0, value, selection, True, **create)
    assert ours.keys() == zarrs.keys() and ours == zarrs
    np.testing.assert_array_equal(read_ours, read_zarrs, strict=True)
    assert len(calls) == (1 if dtype == "float32" else 4)


@pytest.mark.parametrize("pool", [False, True], ids=["inline", "on-a-pool"])
def test_copies_are_made_without_the_event_loops_executor(monkeypatch, pool):
    """A hop to the event loop's executor per chunk was Python (futures chained to
    the loop, a wake-up each) that the workflow's thread waited on for the GIL: the
    copies are made on the writer's own pool, or its thread, and the caller may
    still reuse its buffer."""
    from concurrent.futures import ThreadPoolExecutor

    hops = []
    to_thread = asyncio.to_thread

    async def counted(func, *args, **kwargs):
        hops.append(func)
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    store = MemoryStore()
    zarr.create_array(
        store, shape=SHAPE, chunks=CHUNKS, dtype="float32", compressors=None
    )
    value = np.arange(4 * 6 * 10, dtype="float32").reshape(4, 1, 6, 10) + 1
    selection = (slice(0, 4), slice(2, 3), slice(None), slice(None))
    submitted = []

    class Pool(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(fn)
            return super().submit(fn, *args, **kwargs)

    async def write(executor):
        a = await zarr.api.asynchronous.open_array(store=store, mode="r+")
        await store_by_chunk(a, selection, value, copy=True, pool=executor)

    with Pool(2) as executor:
        asyncio.run(write(executor if pool else None))
    expected = value.copy()
    value[:] = -1.0
    assert hops == [] and len(submitted) == (4 if pool else 0)
    read = zarr.open_array(store, mode="r")[selection]
    np.testing.assert_array_equal(read, expected, strict=True)
