"""Output writing that overlaps the next step's compute.

- :mod:`~earth2studio_compile.io.overlap`: :class:`OverlappedIO`, the wrapper around
  any Earth2Studio IO backend, :func:`drain`, which the workflows call on return,
  and :func:`for_compiled_call`, the wrapper a compile=True call gives a
  ``ZarrBackend``.
- :mod:`~earth2studio_compile.io.copies`: a step's copies planned, one per block of
  views of one storage (or per tensor, or per gathered group of them).
- :mod:`~earth2studio_compile.io.host`: the copies made, into host buffers reused
  across steps (:class:`~.host.HostPool`).
- :mod:`~earth2studio_compile.io.pinned`: pinned host buffers made by registering
  ordinary memory with CUDA: quicker, and without stalling other threads.
- :mod:`~earth2studio_compile.io.chunks`: a step stored through Zarr's async API
  one whole chunk at a time.
- :mod:`~earth2studio_compile.io.local_store`: whole chunks written into a local
  directory as Zarr's file step writes them, without an event loop.
- :mod:`~earth2studio_compile.io.directories`: chunk directories made once each,
  and ahead of the writes where the arrays are new.
- :mod:`~earth2studio_compile.io.writers`: the :class:`Writer` protocol and which
  writer stores a backend's steps: :mod:`~earth2studio_compile.io.lanes` (one
  thread for any backend, per-array lanes for ``KVBackend``) or
  :mod:`~earth2studio_compile.io.zarr_writer` (``ZarrBackend``).
"""

from earth2studio_compile.io.overlap import OverlappedIO, drain, for_compiled_call
from earth2studio_compile.io.writers import (
    KVWriter,
    SerialWriter,
    Writer,
    ZarrWriter,
    parallel_writer,
)

__all__ = [
    "KVWriter",
    "OverlappedIO",
    "SerialWriter",
    "Writer",
    "ZarrWriter",
    "drain",
    "for_compiled_call",
    "parallel_writer",
]
