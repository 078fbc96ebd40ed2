"""Whole chunks written straight into a local directory, without an event loop:
the same files as Zarr's own ``setitem``, their directories made once each and
ahead of the writes."""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest
import zarr
from zarr.storage import MemoryStore

from earth2studio_compile.io.local_store import directories_ahead, store_local

SHAPE, CHUNKS = (4, 3, 6, 10), (1, 1, 6, 10)


def _local(path, dtype="float32", at="t2m", **create):
    """An array in Zarr's local store (a directory), upstream's chunks."""
    from zarr.storage import LocalStore

    store = LocalStore(path)
    zarr.create_array(store, name=at, shape=SHAPE, chunks=CHUNKS, dtype=dtype, **create)
    return store


def _files(path) -> dict[str, bytes]:
    return {
        str(f.relative_to(path)): f.read_bytes()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


def _opened(store, at="t2m"):
    mode = "r" if store.read_only else "r+"

    async def opened():
        return await zarr.api.asynchronous.open_array(store=store, path=at, mode=mode)

    return asyncio.run(opened())


def _store_local(store, selection, value, at="t2m", pool=None) -> bool:
    return store_local(_opened(store, at), selection, value, pool)


@pytest.mark.parametrize("pool", [False, True], ids=["inline", "on-a-pool"])
@pytest.mark.parametrize("at", ["t2m", "group/t2m"])
def test_a_local_directory_gets_zarrs_files_without_an_event_loop(
    tmp_path, monkeypatch, pool, at
):
    """Whole chunks of an uncompressed array in a local directory (upstream
    ``ZarrBackend``'s on disk): Zarr's own encode and file steps, no coroutine,
    pipeline batch or hop to an executor (their Python per chunk took turns at the
    GIL: 4.1-4.3 GB/s from 8 threads on the H100 host, the same files by hand
    7.0); the same files as ``setitem``."""
    from concurrent.futures import ThreadPoolExecutor

    from zarr.core.codec_pipeline import BatchedCodecPipeline
    from zarr.storage import LocalStore

    value = np.random.default_rng(2).normal(size=(4, 1, 6, 10)).astype("float32")
    selection = (slice(0, 4), slice(1, 2), slice(None), slice(None))
    zarrs = _local(tmp_path / "zarrs", at=at, compressors=None)
    zarr.open_array(zarrs, path=at, mode="r+")[selection] = value

    def refused(*args, **kwargs):
        raise AssertionError("an async step of Zarr's was called")

    array = _opened(_local(tmp_path / "ours", at=at, compressors=None), at)
    monkeypatch.setattr(BatchedCodecPipeline, "encode", refused)
    monkeypatch.setattr(LocalStore, "set", refused)
    monkeypatch.setattr(asyncio, "to_thread", refused)
    specs = []
    spec_of = type(array.metadata).get_chunk_spec
    monkeypatch.setattr(
        type(array.metadata),
        "get_chunk_spec",
        lambda *args: specs.append(args[1]) or spec_of(*args),
    )
    with ThreadPoolExecutor(2) as executor:
        assert store_local(array, selection, value, executor if pool else None)
    assert _files(tmp_path / "ours") == _files(tmp_path / "zarrs")
    assert len([k for k in _files(tmp_path / "ours") if "/c/" in k]) == 4
    # The chunks' spec made once for the call's 4 chunks (alike on a regular grid),
    # before any is handed to the pool.
    assert len(specs) == 1


@pytest.mark.parametrize(
    "case",
    [
        "compressed",
        "v2",
        "in-memory",
        "read-only",
        "another-dtype",
        "part-of-a-chunk",
        "starts-with-fill",
    ],
)
def test_a_local_directory_is_left_to_zarr_where_zarr_might_store_otherwise(
    tmp_path, case
):
    """Anything but whole chunks of the array's dtype, each surely not fill value,
    of an uncompressed array in a writable local directory: nothing stored, False
    (the caller stores it through Zarr's async API)."""
    from zarr.storage import LocalStore

    value = np.random.default_rng(3).normal(size=(4, 1, 6, 10)).astype("float32")
    selection = (slice(0, 4), slice(1, 2), slice(None), slice(None))
    create = {
        "compressed": {},
        "v2": {"zarr_format": 2, "compressors": None},
    }.get(case, {"compressors": None})
    store = MemoryStore() if case == "in-memory" else _local(tmp_path / "s", **create)
    if case == "in-memory":
        zarr.create_array(store, name="t2m", shape=SHAPE, chunks=CHUNKS, dtype="f4")
    if case == "read-only":
        store = LocalStore(tmp_path / "s", read_only=True)
    if case == "another-dtype":
        value = value.astype("float64")
    if case == "part-of-a-chunk":
        value = value[..., :3, :]
        selection = (slice(0, 4), slice(1, 2), slice(0, 3), slice(None))
    if case == "starts-with-fill":
        value[2, 0, 0, 0] = 0.0
    before = _files(tmp_path / "s") if case != "in-memory" else {}
    assert not _store_local(store, selection, value)
    after = _files(tmp_path / "s") if case != "in-memory" else {}
    assert after == before


def test_a_failed_chunk_is_raised_once_every_chunk_has_been_tried(
    tmp_path, monkeypatch
):
    """A chunk that cannot be written raises its error to the caller, after the
    step's other chunks are written (a disk full for one file is not a reason to
    lose the rest), and leaves no temporary file behind."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from zarr.storage import _local as local_store

    put, replace = local_store._put, os.replace

    def fails(path):
        if pathlib.Path(path).parts[-4:] == ("1", "1", "0", "0"):
            raise OSError("disk full")

    def failing_put(path, value, exclusive=False):
        fails(path)
        return put(path, value, exclusive)

    def failing_replace(partial, path):
        fails(path)  # once the temporary file is written
        return replace(partial, path)

    # Zarr's whole file step, or the write of its file without the mkdir: whichever
    # is used.
    monkeypatch.setattr(local_store, "_put", failing_put)
    monkeypatch.setattr(os, "replace", failing_replace)
    value = np.random.default_rng(4).normal(size=(4, 1, 6, 10)).astype("float32")
    selection = (slice(0, 4), slice(1, 2), slice(None), slice(None))
    store = _local(tmp_path / "s", compressors=None)
    with ThreadPoolExecutor(4) as executor, pytest.raises(OSError, match="disk full"):
        _store_local(store, selection, value, pool=executor)
    monkeypatch.undo()
    stored = zarr.open_array(store, path="t2m", mode="r")[selection]
    for member in (0, 2, 3):
        np.testing.assert_array_equal(stored[member], value[member], strict=True)
    assert not [f for f in _files(tmp_path / "s") if "partial" in f]


def test_a_chunks_file_is_four_system_calls(tmp_path, monkeypatch):
    """Each call into the system lets go of the GIL and waits to take it back while
    the other writer threads and the workflow's run Python: a chunk's file is one
    ``open``, ``write``, ``close`` and ``rename``, the same bytes as Zarr's file
    step, which adds Python's buffered ``open`` (a ``fstat``, an ``ioctl`` and an
    ``lseek`` more) and a ``uuid4`` (a ``getrandom``) per file: eight calls, and
    half the rate of threads writing the same files (docs/bench/2026-11-28-cpu-
    writers)."""
    import io
    import os
    from collections import Counter

    calls: Counter[str] = Counter()

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    value = np.random.default_rng(4).normal(size=(4, 1, 6, 10)).astype("float32")
    selection = (slice(0, 4), slice(1, 2), slice(None), slice(None))
    ours, zarrs = (_local(tmp_path / n, compressors=None) for n in ("ours", "zarrs"))
    array = _opened(ours)
    for name in ("open", "write", "close", "replace", "urandom"):
        monkeypatch.setattr(os, name, counted(name, getattr(os, name)))
    monkeypatch.setattr(io, "open", counted("io.open", io.open))
    assert store_local(array, selection, value)
    monkeypatch.undo()
    assert dict(calls) == {"open": 4, "write": 4, "close": 4, "replace": 4}
    zarr.open_array(zarrs, path="t2m", mode="r+")[selection] = value
    assert _files(tmp_path / "ours") == _files(tmp_path / "zarrs")


def _steps(store, steps, shape, pool=None) -> np.ndarray:
    """``steps`` steps of 4 members, each stored through ``store_local`` (the array
    opened anew each time, as a caller may); the values stored."""
    values = np.random.default_rng(5).normal(size=shape).astype("float32")
    for step in steps:
        selection = (slice(None), slice(step, step + 1), slice(None), slice(None))
        assert _store_local(store, selection, values[selection], pool=pool)
    return values


@pytest.mark.parametrize("pool", [False, True], ids=["inline", "on-a-pool"])
def test_each_chunk_directory_is_one_mkdir(tmp_path, monkeypatch, pool):
    """Zarr's file step makes a chunk's directory for every chunk (29% of each put
    thread's time on the H100 host), and where its parent is new too (every lead
    time of Earth2Studio's stores) tries it first, fails, makes the parent and
    tries again: made here once per directory, one ``os.mkdir`` each, parents
    first."""
    import os
    from collections import Counter
    from concurrent.futures import ThreadPoolExecutor

    from zarr.storage import LocalStore

    shape, chunks = (4, 4, 6, 10), (1, 1, 6, 5)  # two chunks per directory
    for name in ("zarrs", "ours"):
        zarr.create_array(
            LocalStore(tmp_path / name),
            name="t2m",
            shape=shape,
            chunks=chunks,
            dtype="float32",
            compressors=None,
        )
    made = Counter()
    mkdir = os.mkdir

    def counted(path, mode=0o777, **kwargs):
        made[pathlib.Path(path).relative_to(tmp_path / "ours").as_posix()] += 1
        return mkdir(path, mode, **kwargs)

    store = LocalStore(tmp_path / "ours")
    monkeypatch.setattr(os, "mkdir", counted)
    with ThreadPoolExecutor(4) as executor:
        values = _steps(store, range(4), shape, executor if pool else None)
    monkeypatch.undo()
    zarr.open_array(tmp_path / "zarrs", path="t2m", mode="r+")[:] = values
    ours = _files(tmp_path / "ours")
    assert ours == _files(tmp_path / "zarrs")
    chunk_keys = [k for k in ours if "/c/" in k]
    directories = {k.rsplit("/", 1)[0] for k in chunk_keys}
    assert len(directories) == 16 and len(chunk_keys) == 2 * 16
    everything = {p for d in directories for p in _up_to(d, "t2m")}
    made.pop(".", None)  # the store's own, as it opens
    assert set(made) == everything
    assert {d: made[d] for d in directories} == dict.fromkeys(directories, 1)
    # A parent two chunks' directories share may be tried by both threads at once
    # (the later one finds it made): at most once per thread.
    assert all(made[p] <= (4 if pool else 1) for p in everything)


def _up_to(directory: str, top: str) -> list[str]:
    """``directory`` and its parents below ``top`` (relative paths)."""
    parts = directory.split("/")
    return ["/".join(parts[:n]) for n in range(parts.index(top) + 2, len(parts) + 1)]


def test_a_removed_chunk_directory_is_made_again(tmp_path):
    """A directory known to be there that someone removed between two steps (or a
    step's chunks): made again and every chunk stored, nothing lost."""
    import shutil

    store = _local(tmp_path / "s", compressors=None)
    values = _steps(store, [0, 1], SHAPE)
    shutil.rmtree(tmp_path / "s" / "t2m" / "c" / "2")  # member 2, every step
    shutil.rmtree(tmp_path / "s" / "t2m" / "c" / "1" / "1")  # member 1, step 1
    _steps(store, [1], SHAPE)
    stored = zarr.open_array(store, path="t2m", mode="r")[:, :2]
    expected = values[:, :2].copy()
    expected[2, 0] = 0.0  # removed, not written again: the fill value
    np.testing.assert_array_equal(stored, expected, strict=True)


def test_a_zarr_without_its_atomic_write_gets_its_whole_file_step(
    tmp_path, monkeypatch
):
    """Another Zarr's ``_put`` may make the directory its own way: where
    ``_atomic_write`` is missing, ``_put`` stores every chunk, the same files."""
    import types

    import zarr.storage
    from zarr.storage import _local as local_store

    # Zarr's own _put calls the real one: only local_store.py is shown a module
    # without.
    monkeypatch.setattr(zarr.storage, "_local", types.ModuleType("_local"))
    put, puts = local_store._put, []

    def counted(path, value, exclusive=False):
        puts.append(path)
        return put(path, value, exclusive)

    monkeypatch.setattr(local_store, "_put", counted)
    ours = _local(tmp_path / "ours", compressors=None)
    values = _steps(ours, [0, 2], SHAPE)
    zarrs = _local(tmp_path / "zarrs", compressors=None)
    zarr.open_array(zarrs, path="t2m", mode="r+")[:, [0, 2]] = values[:, [0, 2]]
    assert _files(tmp_path / "ours") == _files(tmp_path / "zarrs")
    chunks = tmp_path / "ours" / "t2m" / "c"
    assert len([p for p in puts if p.is_relative_to(chunks)]) == 8


def _grid_directories(path, at="t2m") -> list[str]:
    """The innermost directories below ``path``'s array's chunks, relative, sorted."""
    return sorted(
        d.relative_to(path / at).as_posix()
        for d in (path / at / "c").rglob("*")
        if d.is_dir() and not any(c.is_dir() for c in d.iterdir())
    )


def test_directories_made_ahead_leave_the_writes_no_mkdir(tmp_path, monkeypatch):
    """Every chunk directory of a new array made ahead (Earth2Studio's stores: a
    directory per member and lead time, new when its chunk is written): the writes
    that follow make none, and store Zarr's own files."""
    import os
    import threading

    store = _local(tmp_path / "ours", compressors=None)
    made = directories_ahead([_opened(store)], threading.Event())
    # One chunk a member and step: c/<member>/<step>/0/0, its directory c/m/s/0.
    expected = [f"c/{m}/{s}/0" for m in range(4) for s in range(3)]
    assert made == 12 and _grid_directories(tmp_path / "ours") == expected
    mkdir, tried = os.mkdir, []

    def counted(path, mode=0o777, **kwargs):
        tried.append(path)
        return mkdir(path, mode, **kwargs)

    monkeypatch.setattr(os, "mkdir", counted)
    values = _steps(store, range(3), SHAPE)
    monkeypatch.undo()
    assert tried == []
    zarrs = _local(tmp_path / "zarrs", compressors=None)
    zarr.open_array(zarrs, path="t2m", mode="r+")[:] = values
    assert _files(tmp_path / "ours") == _files(tmp_path / "zarrs")


def test_directories_ahead_go_in_the_grids_order_to_their_bound(tmp_path):
    """A member's lead times first, as an ensemble's batches write them, each
    position's directory for every array alike; no more than asked, none once
    stopped."""
    import threading

    store = _local(tmp_path / "s", compressors=None)
    zarr.create_array(
        store, name="u10", shape=SHAPE, chunks=CHUNKS, dtype="float32", compressors=None
    )
    arrays = [_opened(store, "t2m"), _opened(store, "u10")]
    assert directories_ahead(arrays, threading.Event(), at_most=5) == 5
    first = ["c/0/0/0", "c/0/1/0", "c/0/2/0"]
    assert _grid_directories(tmp_path / "s", "t2m") == first
    assert _grid_directories(tmp_path / "s", "u10") == first[:2]
    stopped = threading.Event()
    stopped.set()
    assert directories_ahead(arrays, stopped) == 0
    assert _grid_directories(tmp_path / "s", "u10") == first[:2]


@pytest.mark.parametrize("where", ["compressed", "memory"])
def test_directories_ahead_only_where_store_local_writes(tmp_path, where):
    """A compressed array, or a store in memory: Zarr's own writes, nothing made."""
    import threading

    if where == "memory":
        store = MemoryStore()
        zarr.create_array(
            store, name="t2m", shape=SHAPE, chunks=CHUNKS, dtype="float32"
        )
    else:
        store = _local(tmp_path / "s")  # Zarr's default compressor
    assert directories_ahead([_opened(store)], threading.Event()) == 0
    assert not (tmp_path / "s" / "t2m" / "c").exists()
