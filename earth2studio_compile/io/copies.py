"""The copies that bring one step's tensors to the host, planned: which spans of
which storages, or which tensors gathered, each copy covers.

Upstream's workflows write ``io.write(*split_coords(x, coords))``: the tensors of one
write are views (``x[..., i, ...]``) of one device tensor. :func:`plan_copies`, a pure
function, groups such views into a :class:`Block`, the smallest span of their storage
that covers them, copied once; the writer gets host views with the same strides and
offsets into the copy, so what is stored is bitwise what the tensors hold. A span
more than twice the bytes of its views (views picked far apart) is not copied whole:
each of those tensors gets a block of its own, a contiguous copy where its own span is
that sparse. Nor is a tensor whose last two dimensions (a field: what a store's chunk
holds) are not one run of memory, as DLWP's outputs interleave their variables: its
host view would have the same strides, and every store of it would gather from the
whole step's bytes (56 cache lines read per value of a field of a batch of 8); it is
copied contiguous, the gather done by the device, and such views of one storage,
alike in shape, are gathered together: one ``torch.stack`` and one copy for the
step, not a gather and a copy per variable (the PyTorch calls of a write are made on
the workflow's thread, each letting go of the GIL and taking it back while the
writers run).

:class:`~earth2studio_compile.io.host.HostPool` makes the copies, into buffers it
reuses across steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["MAX_SPAN", "Block", "plan_copies"]

# A shared span is copied whole only when it is at most this many times the bytes of
# the views it covers: the rest of it would be host memory and bandwidth for nothing.
MAX_SPAN = 2.0


@dataclass(frozen=True)
class Block:
    """One copy: ``source`` (or its ``parts``, stacked) into a one-dimensional buffer
    of its size, and where each of the step's tensors lies in that buffer.

    Attributes
    ----------
    source : torch.Tensor
        What is copied: a one-dimensional span of a storage, or one tensor whole
        (copied contiguous); where :attr:`parts` are gathered, the first of them
    members : tuple[tuple[int, tuple[int, ...], tuple[int, ...], int], ...]
        Per tensor: its index in the step, shape, strides and offset in the buffer
    parts : tuple[torch.Tensor, ...]
        Tensors of one shape copied contiguous one after another (stacked), or
        none: :attr:`source` alone
    """

    source: torch.Tensor
    members: tuple[tuple[int, tuple[int, ...], tuple[int, ...], int], ...]
    parts: tuple[torch.Tensor, ...] = ()

    @property
    def numel(self) -> int:
        """Elements copied."""
        return self.source.numel() * (len(self.parts) or 1)

    def copy_into(self, buffer: torch.Tensor, non_blocking: bool = False) -> None:
        """Copy the block into ``buffer``.

        Parameters
        ----------
        buffer : torch.Tensor
            One-dimensional, :attr:`numel` elements
        non_blocking : bool, optional
            Queue a copy between devices on the current stream, by default False
        """
        if not self.parts:
            buffer.view(self.source.shape).copy_(self.source, non_blocking=non_blocking)
            return
        out = buffer.view(len(self.parts), *self.source.shape)
        if buffer.device == self.source.device:
            torch.stack(self.parts, out=out)
        else:  # gathered on the device, then one copy
            out.copy_(torch.stack(self.parts), non_blocking=non_blocking)

    def snapshot(self) -> torch.Tensor:
        """The block's values in a new contiguous tensor on its device, laid out as
        :meth:`copy_into` lays them in a buffer: copied into a buffer of
        :attr:`numel` elements (``buffer.view(snapshot.shape)``), they give the
        same bytes.

        Returns
        -------
        torch.Tensor
            :attr:`source` cloned contiguous, or :attr:`parts` stacked
        """
        if self.parts:
            return torch.stack(self.parts)
        return self.source.clone(memory_format=torch.contiguous_format)

    def views(self, buffer: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """The block's tensors as views of ``buffer``, a copy of the block
        (:meth:`copy_into`).

        Parameters
        ----------
        buffer : torch.Tensor
            A one-dimensional tensor of :attr:`numel` elements holding the copy

        Returns
        -------
        list[tuple[int, torch.Tensor]]
            Each tensor's index in the step and its view
        """
        base = buffer.storage_offset()
        return [
            (i, buffer.as_strided(shape, stride, base + offset))
            for i, shape, stride, offset in self.members
        ]


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The elements of ``t``'s storage that ``t`` reaches: ``[start, end)``."""
    start = int(t.storage_offset())
    return start, start + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _plain(t: torch.Tensor) -> bool:
    """Whether ``t`` is a strided tensor with elements, its values as stored: one
    that may be copied as a span of its storage or stacked with views like it."""
    return (
        t.layout == torch.strided
        and t.numel() > 0
        and not t.is_conj()
        and not t.is_neg()
    )


def _spannable(t: torch.Tensor) -> bool:
    """Whether ``t`` may be copied as a span of its storage, its strides kept."""
    return _plain(t) and _fields_in_rows(t)


def _fields_in_rows(t: torch.Tensor) -> bool:
    """Whether ``t``'s last two dimensions lie row by row in a run of memory without
    gaps (what a store reads as one chunk; a broadcast value counts)."""
    shape, stride = t.shape[-2:], t.stride()[-2:]
    if len(shape) and shape[-1] > 1 and stride[-1] not in (0, 1):
        return False
    reach = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, stride))
    return reach <= max(1, shape.numel())


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _alone(i: int, t: torch.Tensor) -> Block:
    """A tensor copied by itself: its span where that is dense enough and its fields
    lie in rows, else the tensor contiguous."""
    if _spannable(t):
        start, end = _span(t)
        if end - start <= MAX_SPAN * t.numel():
            return _spanned(t, start, end, [(i, t)])
    shape = tuple(t.shape)
    return Block(t, ((i, shape, _contiguous_strides(shape), 0),))


def _gathered(members: list[tuple[int, torch.Tensor]]) -> Block:
    """Tensors of one shape, stacked: each contiguous, one after another."""
    first = members[0][1]
    shape, n = tuple(first.shape), first.numel()
    strides = _contiguous_strides(shape)
    return Block(
        first,
        tuple((i, shape, strides, k * n) for k, (i, _) in enumerate(members)),
        tuple(t for _, t in members),
    )


def _spanned(
    t: torch.Tensor, start: int, end: int, members: list[tuple[int, torch.Tensor]]
) -> Block:
    source = t.as_strided((end - start,), (1,), start)
    return Block(
        source,
        tuple(
            (i, tuple(m.shape), tuple(m.stride()), int(m.storage_offset()) - start)
            for i, m in members
        ),
    )


def plan_copies(tensors: Sequence[torch.Tensor]) -> list[Block]:
    """The copies that bring one step's tensors to the host (see the module's
    docstring). Pure: nothing is copied or allocated.

    Parameters
    ----------
    tensors : Sequence[torch.Tensor]
        The step's tensors, on any devices (detached)

    Returns
    -------
    list[Block]
        One block per shared storage (its views, spanned, or gathered where their
        fields do not lie in rows) or per tensor; every tensor is in exactly one, in
        the order of their first tensor
    """
    groups: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
    unfit: dict[tuple, list[tuple[int, torch.Tensor]]] = {}  # copied contiguous
    alone: list[Block] = []
    for i, t in enumerate(tensors):
        if not _plain(t):
            alone.append(_alone(i, t))
            continue
        if not _fields_in_rows(t):
            key = (t.device, t.dtype, t.untyped_storage().data_ptr(), t.shape)
            unfit.setdefault(key, []).append((i, t))
            continue
        storage = t.untyped_storage()
        if _span(t)[1] * t.element_size() > storage.nbytes():
            alone.append(_alone(i, t))  # not inside its storage: never seen, but safe
            continue
        groups.setdefault((t.device, t.dtype, storage.data_ptr()), []).append((i, t))
    blocks = alone
    for members in unfit.values():
        if len(members) > 1:
            blocks.append(_gathered(members))
        else:
            blocks += [_alone(i, t) for i, t in members]
    for members in groups.values():
        spans = [_span(t) for _, t in members]
        start, end = min(s for s, _ in spans), max(e for _, e in spans)
        if end - start <= MAX_SPAN * sum(t.numel() for _, t in members):
            blocks.append(_spanned(members[0][1], start, end, members))
        else:
            blocks += [_alone(i, t) for i, t in members]
    return sorted(blocks, key=lambda b: b.members[0][0])
