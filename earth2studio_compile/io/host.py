"""Host copies of one step's tensors for :class:`~earth2studio_compile.io.OverlappedIO`.

The copies are planned by :func:`~earth2studio_compile.io.copies.plan_copies`: one per
block of views of one storage (or per tensor, or per gathered group of them); the
writer gets host views with the tensors' strides and offsets into the copy, bitwise
what they hold.

:class:`HostPool` holds the host buffers, reused across steps. A step takes its
buffers in :meth:`HostPool.stage` and gives them back in :meth:`HostPool.give` once
it is stored; a buffer is reused only when, at the next step, nothing else holds its
memory (an in-memory Zarr store keeps views of what it stores: such a buffer is left
to it; :class:`~earth2studio_compile.io.OverlappedIO` hands a store known to keep
views copies made by its writer instead, :func:`.writers.keeps_views`).
With steps alike, buffers exist for at most the steps in flight, which
``OverlappedIO`` bounds by ``max_pending + 1``; a step that needs none of the free
buffers' sizes drops them. The first step that needs buffers of a size makes its own,
and a thread of the pool's makes those of the steps that may follow it in flight
(``ahead``), so that the next steps find them: a pinned buffer takes a tenth of a
second per few hundred MB to make (:mod:`.pinned`, which makes them without
stalling the caller's CUDA work).
Copies from CUDA go into pinned buffers, asynchronously, on a side stream of the
pool's, from a snapshot of the step taken on the caller's current stream (a device
copy: 0.22 ms of FCN's 432 MB step on an H200, where the copy to the host takes 7.9):
the caller's later work on its stream (a model that updates its state in place, for
one) cannot race the copy, and the next step computes while the copy engine runs.
On the compute stream, each copy lengthened a 67 ms stand-in step to 74.0 ms; behind
a snapshot on a side stream to 70.5 ms (docs/bench/2026-11-29-h200-twentysixth,
``sidecopy.py``). The writer waits for the event recorded after the copies before
reading host memory. The snapshots cost device memory until their copies end (the
caching allocator reuses it then); where the device has none to spare (out of
memory), that step is copied on the caller's stream, as before.
Copies from the CPU are synchronous, into plain buffers: the caller may change its
tensors once ``write`` returns.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.io.copies import Block, plan_copies
from earth2studio_compile.io.pinned import pinned_empty

__all__ = ["HostPool", "Staged"]

_MB = 1e6


@dataclass
class Staged:
    """One step's host copies, as :meth:`HostPool.stage` made them.

    Attributes
    ----------
    host : list[torch.Tensor]
        The step's tensors on the host, in order: views of :attr:`buffers`
    buffers : list[torch.Tensor]
        The pool's buffers the step holds; give them back once it is stored
    ready : list[torch.cuda.Event]
        Recorded after the copies from CUDA, one per device: wait before reading
    """

    host: list[torch.Tensor]
    buffers: list[torch.Tensor] = field(default_factory=list)
    ready: list[torch.cuda.Event] = field(default_factory=list)


_Key = tuple[torch.dtype, int, bool]  # dtype, elements, pinned


class HostPool:
    """Host buffers reused across steps.

    Parameters
    ----------
    pin_memory : bool
        Copy CUDA tensors into pinned buffers, asynchronously (else synchronously
        into plain ones); copies from the CPU never pin
    ahead : int, optional
        Steps whose buffers are made ahead, on a thread of the pool's, when a step
        first needs buffers of a size, by default 0 (none): what is alive stays
        within ``ahead + 1`` steps like it (``OverlappedIO`` passes
        ``max_pending``)
    """

    def __init__(self, pin_memory: bool, ahead: int = 0) -> None:
        self.pin_memory = pin_memory
        self.ahead = ahead
        self._free: dict[_Key, list[torch.Tensor]] = {}
        self._coming: dict[_Key, deque[Future[torch.Tensor]]] = {}
        self._alive: Counter[_Key] = Counter()  # held, free or coming
        self._returned: list[torch.Tensor] = []  # given back, not yet checked
        self._reuse = _torch.missing("storage_holders") is None
        self.copies = 0  # blocks copied
        self.allocated = 0  # buffers allocated
        self.allocated_ahead = 0  # of them, on the pool's thread
        # Given back but held by something else when checked: let go, not reused.
        self.kept = 0
        self.peak_bytes = 0
        # One side stream per CUDA device, for the copies behind their snapshots.
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self.side_copies = 0  # blocks copied on a side stream

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers alive that the pool made and has not let go (held
        by a step, free, or being made)."""
        return sum(n * _key_bytes(key) for key, n in self._alive.items())

    def stage(self, tensors: Sequence[torch.Tensor]) -> Staged:
        """Copy one step's tensors to the host: one copy per :class:`Block`.

        Parameters
        ----------
        tensors : Sequence[torch.Tensor]
            The step's tensors, on any devices; the caller may change or drop them
            once this returns

        Returns
        -------
        Staged
            Host views of the copies, the buffers they live in, and the events to
            wait for before reading them
        """
        blocks = plan_copies([t.detach() for t in tensors])
        keys = [
            (b.source.dtype, b.numel, self.pin_memory and b.source.is_cuda)
            for b in blocks
        ]
        buffers = self._take(keys, [b.source.device for b in blocks])
        host: list[torch.Tensor | None] = [None] * len(tensors)
        cuda: dict[torch.device, list[tuple[Block, torch.Tensor]]] = {}
        for block, buffer in zip(blocks, buffers):
            if block.source.is_cuda:
                cuda.setdefault(block.source.device, []).append((block, buffer))
            else:
                block.copy_into(buffer)
            for i, view in block.views(buffer):
                host[i] = view
        ready = [self._copy_from(device, pairs) for device, pairs in cuda.items()]
        self.copies += len(blocks)
        assert all(h is not None for h in host)
        return Staged([h for h in host if h is not None], buffers, ready)

    def give(self, buffers: Sequence[torch.Tensor]) -> None:
        """Take back a stored step's buffers, for reuse where nothing else holds them.

        Parameters
        ----------
        buffers : Sequence[torch.Tensor]
            What :meth:`stage` handed out for the step (:attr:`Staged.buffers`)
        """
        # Checked at the next step: a writer's thread may still be letting go of
        # its last reference to the step as it finishes.
        self._returned += buffers

    def _sort_returned(self) -> None:
        """Returned buffers nothing else holds become free; the others are let go."""
        for buffer in self._returned:
            if self._reuse and not _torch.storage_shared(buffer):
                self._free.setdefault(self._key(buffer), []).append(buffer)
                continue
            self._let_go(buffer)
            self.kept += 1
            if self.kept == 1 and self._reuse:
                logger.debug(
                    "OverlappedIO: a stored step's host buffer is held elsewhere (a "
                    "store that keeps views of what it stores, such as Zarr's memory "
                    "store, or a thread still letting go of it): not reused."
                )
        self._returned = []

    def clear(self) -> None:
        """Let every free buffer go, and those still being made (the pool stays
        usable)."""
        free = [b for bs in self._free.values() for b in bs] + self._returned
        self._free.clear()
        self._returned = []
        for buffer in free:
            self._let_go(buffer)
        for key in list(self._coming):
            self._drop_coming(key)
        if self.allocated:
            logger.debug(
                f"OverlappedIO: host buffers freed; {self.allocated} allocated, "
                f"{self.copies} copies, peak {self.peak_bytes / _MB:.1f} MB held."
            )

    def _take(
        self, keys: Sequence[_Key], devices: Sequence[torch.device]
    ) -> list[torch.Tensor]:
        self._sort_returned()
        # Free buffers of sizes this step does not need would stay unused while new
        # ones are made: let them go, so that what is held stays within the steps
        # in flight.
        for key in set(self._free) - set(keys):
            for buffer in self._free.pop(key):
                self._let_go(buffer)
        for key in set(self._coming) - set(keys):
            self._drop_coming(key)
        out, missed = [], {}
        for key, device in zip(keys, devices):
            if not self.pin_memory:  # unpinned by an allocation of this step's
                key = _unpinned(key)
            free, coming = self._free.get(key), self._coming.get(key)
            if free:
                out.append(free.pop())
            elif coming:
                out.append(self._arrived(key, coming.popleft(), device))
            else:
                out.append(self._allocate(key, device))
                missed[key] = device
        if not self.pin_memory:  # unpinned by one of this step's allocations
            keys = [_unpinned(k) for k in keys]
            missed = {_unpinned(k): d for k, d in missed.items()}
        for key, device in missed.items():
            self._make_ahead(key, device, (self.ahead + 1) * keys.count(key))
        return out

    def _new(self, key: _Key, device: torch.device) -> torch.Tensor:
        dtype, numel, pinned = key
        if pinned:
            return pinned_empty(numel, dtype, device)
        return torch.empty(numel, dtype=dtype)

    def _allocate(self, key: _Key, device: torch.device) -> torch.Tensor:
        try:
            buffer = self._new(key, device)
        except RuntimeError as err:  # CUDA could not pin it: go on without pinning
            if not key[2]:
                raise
            self._unpin(err)
            key = _unpinned(key)
            buffer = self._new(key, device)
        self._count(key, ahead=False)
        logger.debug(
            f"OverlappedIO: {'pinned ' * key[2]}host buffer of "
            f"{_key_bytes(key) / _MB:.1f} MB allocated ({self.allocated} so far, "
            f"{self.held_bytes / _MB:.1f} MB held, peak {self.peak_bytes / _MB:.1f})."
        )
        return buffer

    def _unpin(self, err: BaseException) -> None:
        """Pinned memory could not be had: this pool's buffers are plain from now
        on, its copies synchronous (still bitwise the same), and what it counted as
        pinned is counted as plain, so that the bound on what it holds stays."""
        logger.warning(
            f"OverlappedIO: pinned host memory could not be allocated ({err}); "
            "copies go to plain host memory from now on, synchronously: the writes "
            "still overlap the steps, the copies no longer do."
        )
        self.pin_memory = False
        for key in [k for k in self._free if k[2]]:
            self._free.setdefault(_unpinned(key), []).extend(self._free.pop(key))
        for key in [k for k in self._coming if k[2]]:
            self._coming.setdefault(_unpinned(key), deque()).extend(
                self._coming.pop(key)
            )
        for key in [k for k in self._alive if k[2]]:
            self._alive[_unpinned(key)] += self._alive.pop(key)

    def _make_ahead(self, key: _Key, device: torch.device, alive: int) -> None:
        """Have buffers of ``key`` made on a thread until ``alive`` exist."""
        n = alive - self._alive[key]
        if n <= 0:
            return
        maker = ThreadPoolExecutor(1, thread_name_prefix="OverlappedIO buffers")
        queue = self._coming.setdefault(key, deque())
        for _ in range(n):
            queue.append(maker.submit(self._new, key, device))
            self._count(key, ahead=True)
        maker.shutdown(wait=False)  # its thread ends once they are made
        logger.debug(
            f"OverlappedIO: {n} {'pinned ' * key[2]}host buffer(s) of "
            f"{_key_bytes(key) / _MB:.1f} MB being made ahead."
        )

    def _arrived(
        self, key: _Key, coming: Future[torch.Tensor], device: torch.device
    ) -> torch.Tensor:
        try:
            return coming.result()
        except Exception as err:  # made here instead; nothing is lost
            logger.debug(f"OverlappedIO: a host buffer made ahead failed: {err!r}")
            self._uncount(key)
            self.allocated -= 1
            self.allocated_ahead -= 1
            return self._allocate(key, device)

    def _drop_coming(self, key: _Key) -> None:
        for coming in self._coming.pop(key, ()):
            coming.cancel()  # one being made is dropped once made
            self._uncount(key)

    def _count(self, key: _Key, ahead: bool) -> None:
        self.allocated += 1
        self.allocated_ahead += ahead
        self._alive[key] += 1
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def _uncount(self, key: _Key) -> None:
        self._alive[key] -= 1

    def _key(self, buffer: torch.Tensor) -> _Key:
        # is_pinned() asks CUDA: only where pinning is asked for.
        pinned = self.pin_memory and buffer.is_pinned()
        return buffer.dtype, buffer.numel(), pinned

    def _let_go(self, buffer: torch.Tensor) -> None:
        self._uncount(self._key(buffer))

    def copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The side stream the pool copies ``device``'s blocks to the host on.

        Parameters
        ----------
        device : torch.device
            A CUDA device

        Returns
        -------
        torch.cuda.Stream
            Made at the first copy from ``device``, kept for the pool's life
        """
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def _copy_from(
        self, device: torch.device, pairs: list[tuple[Block, torch.Tensor]]
    ) -> torch.cuda.Event:
        """Queue the copies of one CUDA device's blocks; the event to wait for
        before reading them. Pinned: on the side stream, from snapshots taken on
        the current stream; else (or without device memory for the snapshots) on
        the current stream."""
        stream = torch.cuda.current_stream(device)
        snapshots = self._snapshots(pairs) if self.pin_memory else None
        if snapshots is None:
            for block, buffer in pairs:
                # A CUDA block's buffer is pinned exactly when the pool pins (its key).
                block.copy_into(buffer, non_blocking=self.pin_memory)
        else:
            side = self.copy_stream(device)
            side.wait_stream(stream)  # the snapshots are taken
            with torch.cuda.stream(side):
                for snapshot, (_, buffer) in zip(snapshots, pairs):
                    buffer.view(snapshot.shape).copy_(snapshot, non_blocking=True)
                    # Its memory is not reused before the copy has read it.
                    snapshot.record_stream(side)
            self.side_copies += len(pairs)
            stream = side
        ready = torch.cuda.Event()
        ready.record(stream)
        return ready

    def _snapshots(
        self, pairs: list[tuple[Block, torch.Tensor]]
    ) -> list[torch.Tensor] | None:
        """The blocks' snapshots on the current stream, or None where the device
        has no memory for them."""
        try:
            return [block.snapshot() for block, _ in pairs]
        except torch.cuda.OutOfMemoryError as err:
            logger.debug(
                f"OverlappedIO: no device memory for a step's snapshot ({err}); its "
                "copy to the host runs on the caller's stream."
            )
            return None


def _unpinned(key: _Key) -> _Key:
    """``key`` for a plain (not pinned) buffer."""
    return key[0], key[1], False


def _key_bytes(key: _Key) -> int:
    dtype, numel, _ = key
    return numel * dtype.itemsize
