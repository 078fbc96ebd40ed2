"""Writers: how :class:`~earth2studio_compile.io.OverlappedIO` stores each step.

A :class:`Writer` takes one step's host copies and returns one future per array (one
for the whole step where it calls the backend's ``write`` once), each resolving to
True once stored, False if skipped because an earlier step failed, or the error.
Writes to one array keep their order; after a failure, only steps queued after the
failed one are skipped (the failing step's other arrays are still stored, as the
backend's own ``write`` would have stored those before the failing one).

- :class:`SerialWriter`: any backend, upstream's ``write`` of the whole step on one
  thread. The only writer for ``NetCDF4Backend`` (HDF5 takes one thread at a time),
  ``AsyncZarrBackend`` (it writes concurrently itself), subclasses that override
  the storage methods, and any backend not listed below.
- :class:`KVWriter`: ``KVBackend``, upstream's ``write`` of each variable on that
  array's lane.
- :class:`ZarrWriter`: ``ZarrBackend``, upstream's ``write`` runs once per step on a
  stand-in that keeps the storage step (``_write_array``, upstream's seam for it);
  each array is then stored through Zarr's async API on its lane, an event loop of
  its own, one whole chunk at a time where it can (:mod:`.chunks`; a store that
  keeps views gets copies, made on a pool of the writer's own; a store that writes
  files does so on a few threads per lane, :data:`FILE_THREADS` in all). In a
  local directory a step is one job on a thread of the writer's: whole chunks of
  its uncompressed arrays skip the lanes and the event loop, Zarr's own encode
  step and its file step's files, taken by a pool of :data:`FILE_THREADS` from one
  batch per step (:func:`.local_store.local_chunks`), in chunk directories made ahead
  from the moment the arrays are added (:meth:`ZarrWriter.ahead`). Measured
  against one shared loop with a future per array (as Earth2Studio's
  ``AsyncZarrBackend`` does), the lanes were faster on a writing-bound CPU rollout.

A lane is a one-thread ``ThreadPoolExecutor``; each array always goes to the same
one, so its writes keep their order. A local directory's steps keep it by chunk: a
step's write of a chunk still being written by an earlier step waits for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

import torch

from earth2studio_compile.io.lanes import KVWriter, SerialWriter, keeps_views
from earth2studio_compile.io.zarr_writer import FILE_THREADS, ZarrWriter

# Type hints only: importing Earth2Studio takes a minute on a small machine, and
# the package is imported before it (the demo's banner comes first).
if TYPE_CHECKING:
    from earth2studio.io.base import IOBackend
    from earth2studio.utils.type import CoordSystem

__all__ = [
    "FILE_THREADS",
    "KVWriter",
    "SerialWriter",
    "Writer",
    "ZarrWriter",
    "keeps_views",
    "parallel_writer",
]


class Writer(Protocol):
    """Stores steps of host copies in the background.

    Attributes
    ----------
    own_copies : bool
        Whether the writer copies each step (on its threads, once its copies are
        ready) before storing it: for a backend that keeps what it is given
        (:func:`keeps_views`), which then keeps copies of its own, so that the
        caller's buffers can be reused
    """

    own_copies: bool

    def submit(
        self,
        step: int,
        x: torch.Tensor | list[torch.Tensor],
        coords: CoordSystem,
        array_name: str | list[str],
        ready: Sequence[torch.cuda.Event] = (),
    ) -> list[Future[bool]]:
        """Queue one step; returns at once.

        Parameters
        ----------
        step : int
            Its number, increasing with each call: after a failure, later ones are
            skipped
        x : torch.Tensor | list[torch.Tensor]
            Host tensors, the writer's own (it drops them once stored)
        coords : CoordSystem
            Their coordinates, the writer's own
        array_name : str | list[str]
            Array name(s), as the backend's ``write`` takes them
        ready : Sequence[torch.cuda.Event], optional
            Events to wait for before reading ``x`` (its device-to-host copies)

        Returns
        -------
        list[Future[bool]]
            One per array, or one for the whole step: True once stored, False if
            skipped, or the backend's error
        """
        ...

    def close(self, then: Callable[[], None] | None = None) -> None:
        """Wait for every step submitted, call ``then``, stop the threads.

        Called on one of its own threads (which cannot wait for itself), it returns
        at once; the queued steps are stored, then ``then`` runs, on its threads.
        """
        ...


def _overrides(io: IOBackend, base: type, methods: tuple[str, ...]) -> bool:
    return any(
        getattr(type(io), m) is not getattr(base, m) or m in vars(io) for m in methods
    )


def parallel_writer(io: IOBackend) -> tuple[type[KVWriter | ZarrWriter] | None, str]:
    """How ``io`` may be written in parallel.

    Parameters
    ----------
    io : IOBackend
        An Earth2Studio IO backend

    Returns
    -------
    tuple[type[KVWriter | ZarrWriter] | None, str]
        The writer class, or None where the backend keeps one writer
        (:class:`SerialWriter`), and why
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
        return ZarrWriter, ""
    if isinstance(io, KVBackend):
        if _overrides(io, KVBackend, ("write", "add_array")):
            return None, f"{kind} overrides KVBackend's write or add_array"
        return KVWriter, ""
    return None, f"{kind} is not known to take concurrent writes"
