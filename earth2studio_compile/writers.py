"""Which IO backends :class:`~earth2studio_compile.overlap.OverlappedIO` writes in
parallel, and how: a ``write`` becomes one future per array, stored concurrently with
the other arrays (of this step and the next), in order per array.

- ``ZarrBackend``: upstream's ``write`` runs unchanged except for its storage step,
  ``_write_array`` (upstream's seam for it), whose assignments are collected and then
  stored through Zarr's async API, each on its array's lane: a single-thread executor
  with its own event loop, one ``setitem`` at a time. Measured against one shared loop
  with a future per array (``asyncio.run_coroutine_threadsafe``, as Earth2Studio's
  ``AsyncZarrBackend`` does), the lanes were faster on a writing-bound CPU rollout.
- ``KVBackend``: each array is an upstream ``write`` of that one variable, on its
  array's lane.
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


class _Lanes(ParallelWriter):
    """One single-thread executor per lane; each array always goes to the same one,
    so its writes keep their order."""

    def __init__(self, io: Any, workers: int, name: str) -> None:
        super().__init__(io, workers, name)
        self._lanes = [
            ThreadPoolExecutor(1, thread_name_prefix=f"{name} lane {i}")
            for i in range(workers)
        ]
        self._lane_of: dict[str, ThreadPoolExecutor] = {}

    def _lane(self, name: str) -> ThreadPoolExecutor:
        lanes = self._lanes
        return self._lane_of.setdefault(name, lanes[len(self._lane_of) % len(lanes)])

    def close(self) -> None:
        for lane in self._lanes:
            lane.shutdown()


class _KVWriter(_Lanes):
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
        return [
            self._lane(name).submit(_store, go, self.io.write, [xi, coords, name])
            for xi, name in zip(x, names)
        ]


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


class _ZarrWriter(_Lanes):
    def __init__(self, io: Any, workers: int, name: str) -> None:
        super().__init__(io, workers, name)
        # Each lane's own event loop and opened arrays, used by that lane alone.
        self._local = threading.local()

    def submit(
        self, x: list[Any], coords: Any, names: list[str], go: Callable[[], bool]
    ) -> list[Future]:
        # Upstream's write on a stand-in, not a patched instance: the user's
        # backend stays untouched, also while its write runs here.
        collector = _Collector(self.io)
        type(self.io).write(collector, x, coords, names)
        return [
            self._lane(store[0]).submit(_store, go, self._setitem, store)
            for store in collector.stores
        ]

    def _setitem(self, name: str, selection: tuple, data: np.ndarray) -> None:
        import zarr

        io, local = self.io, self._local
        if not all(isinstance(s, (slice, int, np.integer)) for s in selection):
            # Zarr's async API takes basic selections only; upstream's storage
            # step handles the rest through Zarr's synchronous API.
            type(io)._write_array(io, name, selection, data)
            return
        if not hasattr(local, "loop"):
            local.loop, local.arrays = asyncio.new_event_loop(), {}
        if name not in local.arrays:
            path = f"{io.root.path}/{name}" if io.root.path else name
            local.arrays[name] = local.loop.run_until_complete(
                zarr.api.asynchronous.open_array(
                    store=io.root.store, path=path, mode="r+"
                )
            )
        local.loop.run_until_complete(local.arrays[name].setitem(selection, data))

    def close(self) -> None:
        def close_loop() -> None:
            loop = getattr(self._local, "loop", None)
            if loop is not None:
                loop.run_until_complete(loop.shutdown_default_executor())
                loop.close()

        wait([lane.submit(close_loop) for lane in self._lanes])
        super().close()


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
