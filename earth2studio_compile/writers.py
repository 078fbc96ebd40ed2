"""Which IO backends :class:`~earth2studio_compile.overlap.OverlappedIO` writes in
parallel, and how: a ``write`` becomes one future per array, stored concurrently with
the other arrays (of this step and the next), in order per array.

- ``ZarrBackend``: upstream's ``write`` runs unchanged except for its storage step,
  ``_write_array`` (upstream's seam for it), whose assignments are collected and then
  stored through Zarr's async API on one event loop, as in Earth2Studio's
  ``AsyncZarrBackend`` (futures from ``asyncio.run_coroutine_threadsafe``). Encoding
  and storing run on the loop's ``workers`` threads, not on Zarr's one loop thread.
- ``KVBackend``: each array is an upstream ``write`` of that one variable, on a
  single-thread executor chosen per array.
- Everything else keeps one writer: ``NetCDF4Backend`` (HDF5 takes one thread at a
  time), ``AsyncZarrBackend`` (it writes concurrently itself), subclasses that
  override the storage methods, and any backend not listed here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

__all__ = ["ParallelWriter", "parallel_writer"]


class ParallelWriter:
    """Stores the arrays of each write concurrently, in order per array.

    Parameters
    ----------
    io : Any
        The wrapped backend
    workers : int
        Arrays that store at once
    name : str
        Prefix of its threads' names
    """

    def __init__(self, io: Any, workers: int, name: str) -> None:
        self.io, self.workers, self.name = io, workers, name

    def submit(
        self, x: list[Any], coords: Any, names: list[str], go: Callable[[], bool]
    ) -> list[Future]:
        """Start storing one write (host tensors, ready to read), one future per
        array: True once stored, False if ``go()`` said to skip it, or the error."""
        raise NotImplementedError

    def close(self) -> None:
        """Wait for every array submitted, then stop every thread this started."""
        raise NotImplementedError


def _store(go: Callable[[], bool], fn: Callable[..., Any], args: list) -> bool:
    # Emptied before the future resolves: a waiter on it may then copy a new step,
    # and both host copies must not exist at once.
    try:
        return go() and fn(*args) is None
    finally:
        args.clear()


class _KVWriter(ParallelWriter):
    def __init__(self, io: Any, workers: int, name: str) -> None:
        super().__init__(io, workers, name)
        self._lanes = [
            ThreadPoolExecutor(1, thread_name_prefix=f"{name} lane {i}")
            for i in range(workers)
        ]
        self._lane_of: dict[str, ThreadPoolExecutor] = {}

    def submit(
        self, x: list[Any], coords: Any, names: list[str], go: Callable[[], bool]
    ) -> list[Future]:
        if not all(name in self.io.root for name in names):
            # Upstream's write then creates the array, replacing the store's dict
            # entries: it runs alone, after everything before it.
            wait([lane.submit(int) for lane in self._lanes])
            done: Future = Future()
            done.set_result(_store(go, self.io.write, [x, coords, names]))
            return [done]
        lanes = self._lanes
        return [
            self._lane_of.setdefault(
                name, lanes[len(self._lane_of) % len(lanes)]
            ).submit(_store, go, self.io.write, [xi, coords, name])
            for xi, name in zip(x, names)
        ]

    def close(self) -> None:
        for lane in self._lanes:
            lane.shutdown()


class _Collector:
    """Stands in for a ``ZarrBackend`` in upstream's ``write``: all is the backend's
    but the storage step, which is collected instead of run."""

    def __init__(self, io: Any) -> None:
        self._io = io
        self.stores: list[list[Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._io, name)

    def _write_array(self, name: str, selection: tuple, data: np.ndarray) -> None:
        self.stores.append([name, selection, data])


class _ZarrWriter(ParallelWriter):
    def __init__(self, io: Any, workers: int, name: str) -> None:
        super().__init__(io, workers, name)
        self._loop = asyncio.new_event_loop()
        # Zarr encodes and stores in the loop's default executor: its size is the
        # parallelism, and its threads carry this writer's name.
        pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{name} store")
        self._loop.set_default_executor(pool)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"{name} loop", daemon=True
        )
        self._thread.start()
        # Touched on the loop's thread only: the last task per array, open arrays.
        self._last: dict[str, asyncio.Future] = {}
        self._arrays: dict[str, Any] = {}

    def submit(
        self, x: list[Any], coords: Any, names: list[str], go: Callable[[], bool]
    ) -> list[Future]:
        # Upstream's write on a stand-in, not a patched instance: the user's
        # backend stays untouched, also while its write runs here.
        collector = _Collector(self.io)
        type(self.io).write(collector, x, coords, names)
        return [
            asyncio.run_coroutine_threadsafe(self._store(go, store), self._loop)
            for store in collector.stores
        ]

    async def _store(self, go: Callable[[], bool], store: list) -> bool:
        previous = self._last.get(store[0])
        self._last[store[0]] = asyncio.current_task()  # type: ignore[assignment]
        try:
            if previous is not None:
                await asyncio.wait([previous])  # one array's writes in order
            if not go():
                return False
            await self._setitem(*store)
            return True
        finally:
            store.clear()

    async def _setitem(self, name: str, selection: tuple, data: np.ndarray) -> None:
        import zarr

        io = self.io
        if not all(isinstance(s, (slice, int, np.integer)) for s in selection):
            # Zarr's async API takes basic selections only; upstream's storage
            # step handles the rest through Zarr's synchronous API.
            write = type(io)._write_array
            await self._loop.run_in_executor(None, write, io, name, selection, data)
            return
        if name not in self._arrays:
            path = f"{io.root.path}/{name}" if io.root.path else name
            self._arrays[name] = await zarr.api.asynchronous.open_array(
                store=io.root.store, path=path, mode="r+"
            )
        await self._arrays[name].setitem(selection, data)

    def close(self) -> None:
        async def drain() -> None:
            if self._last:
                await asyncio.wait(list(self._last.values()))
            await self._loop.shutdown_default_executor()

        asyncio.run_coroutine_threadsafe(drain(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _overrides(io: Any, base: type, methods: tuple[str, ...]) -> bool:
    return any(
        getattr(type(io), m) is not getattr(base, m) or m in vars(io) for m in methods
    )


def parallel_writer(io: Any) -> tuple[type[ParallelWriter] | None, str]:
    """How ``io`` may be written in parallel.

    Parameters
    ----------
    io : Any
        An Earth2Studio IO backend

    Returns
    -------
    tuple[type[ParallelWriter] | None, str]
        The writer class, or None where the backend keeps one writer, and why
    """
    from earth2studio.io import AsyncZarrBackend, KVBackend, NetCDF4Backend, ZarrBackend

    kind = type(io).__name__
    if isinstance(io, NetCDF4Backend):
        return None, f"{kind} writes HDF5 files, which take one thread at a time"
    if isinstance(io, AsyncZarrBackend):
        return None, f"{kind} already writes concurrently itself"
    if isinstance(io, ZarrBackend):
        if _overrides(io, ZarrBackend, ("write", "_write_array")):
            return None, f"{kind} overrides ZarrBackend's write or _write_array"
        return _ZarrWriter, ""
    if isinstance(io, KVBackend):
        if _overrides(io, KVBackend, ("write", "add_array")):
            return None, f"{kind} overrides KVBackend's write or add_array"
        return _KVWriter, ""
    return None, f"{kind} is not known to take concurrent writes"
