"""Which IO backends :class:`~earth2studio_compile.overlap.OverlappedIO` may write in
parallel, and how one ``write`` call is split into parts that store concurrently.

A write is split per array: each part stores one variable, and every part of one array
runs on the same lane (thread) in the order the workflow wrote them, so two writes to
one array, or to one Zarr chunk, never race. Different arrays store concurrently.

- ``ZarrBackend``: upstream's ``write`` runs once per call on the dispatching thread
  (its coordinate checks and index selection, unchanged); only its storage step,
  ``_write_array``, is taken over: each array's assignment runs through Zarr's async
  API on a lane's own event loop, so encoding and storing run on several cores
  instead of Zarr's one event-loop thread.
- ``KVBackend``: each array is an upstream ``write`` of that one variable; writes to
  different tensors do not touch each other.
- Everything else keeps one writer: ``NetCDF4Backend`` (HDF5 takes one thread at a
  time), ``AsyncZarrBackend`` (it already writes concurrently itself), subclasses that
  override the storage methods, and any backend not listed here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["Lane", "Part", "Splitter", "splitter_for"]


class Lane:
    """What one storage thread owns: an event loop for Zarr's async API, opened arrays.

    Only its own thread uses it, so nothing here needs a lock.
    """

    __slots__ = ("_loop", "arrays")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.arrays: dict[str, Any] = {}

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to completion on this lane's event loop."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)

    def close(self) -> None:
        """Close the event loop and its thread pool, if one was made."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
        self.arrays.clear()


# One array's part of a write: its name (the lane key) and what stores it.
Part = tuple[str, Callable[[Lane], None]]


class Splitter:
    """Splits one ``write`` into per-array parts for a backend that takes them."""

    def split(
        self, io: Any, x: list[torch.Tensor], coords: Any, names: list[str]
    ) -> list[Part] | None:
        """The parts of a write, or None to write it whole after everything before.

        Parameters
        ----------
        io : Any
            The wrapped backend
        x : list[torch.Tensor]
            Host tensors, one per array
        coords : Any
            Their coordinates
        names : list[str]
            Array names

        Returns
        -------
        list[Part] | None
            One part per array; None where the write must not overlap any other
        """
        raise NotImplementedError


class _KVSplitter(Splitter):
    def split(
        self, io: Any, x: list[torch.Tensor], coords: Any, names: list[str]
    ) -> list[Part] | None:
        # Upstream's write creates a missing array (and mutates the store's dict) in
        # place: such a write runs alone.
        if not all(name in io.root for name in names):
            return None

        def part(xi: torch.Tensor, name: str) -> Part:
            return name, lambda lane: io.write(xi, coords, name)

        return [part(xi, name) for xi, name in zip(x, names)]


class _ZarrSplitter(Splitter):
    def split(
        self, io: Any, x: list[torch.Tensor], coords: Any, names: list[str]
    ) -> list[Part] | None:
        stores: list[tuple[str, tuple, np.ndarray]] = []

        def collect(name: str, selection: tuple, data: np.ndarray) -> None:
            stores.append((name, selection, data))

        # Upstream's write, with its storage step collected instead of run: the
        # coordinate checks, a missing array's creation and the index selection stay
        # upstream's, in order, on this thread.
        io.__dict__["_write_array"] = collect
        try:
            io.write(x, coords, names)
        finally:
            io.__dict__.pop("_write_array", None)
        return [_zarr_part(io, *store) for store in stores]


def _zarr_part(io: Any, name: str, selection: tuple, data: np.ndarray) -> Part:
    import zarr

    basic = isinstance(selection, tuple) and all(
        isinstance(s, (slice, int, np.integer)) for s in selection
    )

    def store(lane: Lane) -> None:
        if not basic:
            # Zarr's async API takes basic selections only; upstream's storage step
            # handles the rest through Zarr's synchronous API.
            type(io)._write_array(io, name, selection, data)
            return
        array = lane.arrays.get(name)
        if array is None:
            root = io.root
            path = f"{root.path}/{name}" if root.path else name
            array = lane.run(
                zarr.api.asynchronous.open_array(store=root.store, path=path, mode="r+")
            )
            lane.arrays[name] = array
        lane.run(array.setitem(selection, data))

    return name, store


def _overrides(io: Any, base: type, methods: tuple[str, ...]) -> bool:
    return any(
        getattr(type(io), m) is not getattr(base, m) or m in vars(io) for m in methods
    )


def splitter_for(io: Any) -> tuple[Splitter | None, str]:
    """How ``io`` may be written in parallel.

    Parameters
    ----------
    io : Any
        An Earth2Studio IO backend

    Returns
    -------
    tuple[Splitter | None, str]
        The splitter, or None where the backend keeps one writer, and why not
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
        return _ZarrSplitter(), ""
    if isinstance(io, KVBackend):
        if _overrides(io, KVBackend, ("write", "add_array")):
            return None, f"{kind} overrides KVBackend's write or add_array"
        return _KVSplitter(), ""
    return None, f"{kind} is not known to take concurrent writes"
