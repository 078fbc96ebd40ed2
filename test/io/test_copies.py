"""The copies of one step, planned (earth2studio_compile.io.copies): views of one
storage in one block, far-apart views and fields not in rows copied contiguous,
interleaved variables gathered in one; what a block's copy holds is bitwise what its
tensors hold.

CPU tensors stand in for the device: the plan is the same for both (the device's
copy is test_host.py's GPU-marked tests').
"""

from __future__ import annotations

import torch

from earth2studio_compile.io.copies import MAX_SPAN, Block, plan_copies


def _copied(block: Block) -> list[tuple[int, torch.Tensor]]:
    """The block's tensors as views of a copy of it."""
    buffer = torch.empty(block.numel, dtype=block.source.dtype)
    block.copy_into(buffer)
    return block.views(buffer)


def _interleaved(batch: int, nvar: int, lat: int, lon: int) -> torch.Tensor:
    # DLWP's output (its regridding's transpose): the variables of a batch interleave,
    # (batch, time, variable, lat, lon) with strides (7, 7, 1, 7 * 8 * lon, 7 * 8).
    return torch.randn(lat * lon, batch * nvar).t().reshape(batch, 1, nvar, lat, lon)


def test_the_span_limit():
    x = torch.randn(4, 3, 2, 5)  # (batch, variable, lat, lon)
    # Variables 0 and 1 of 3: a span of 110 elements for 80 (1.4x) is one block...
    assert len(plan_copies([x[:, 0], x[:, 1]])) == 1
    # ...variable 0 alone spans 100 for 40 (2.5x): copied contiguous.
    assert plan_copies([x[:, 0]])[0].numel == 40
    assert MAX_SPAN == 2.0


def test_interleaved_variables_are_gathered_in_one_block():
    """Gathered by the device in one stack, one copy for the step: not a gather and
    a copy per variable, each a few PyTorch calls on the workflow's thread. The
    copy holds each variable contiguous (rows for the store), bitwise."""
    batch, nvar = 8, 7
    x = _interleaved(batch, nvar, 5, 6)
    assert x.stride()[-1] == batch * nvar
    views = [x.select(2, i) for i in range(nvar)]
    (block,) = plan_copies(views)
    assert block.numel == x.numel() and len(block.parts) == nvar
    copied = _copied(block)
    assert [i for i, _ in copied] == list(range(nvar))
    for (_, h), v in zip(copied, views):
        assert h.is_contiguous() and torch.equal(
            h.view(torch.int32), v.view(torch.int32)
        )


def test_only_views_of_one_storage_and_shape_are_gathered():
    x, y = _interleaved(8, 7, 5, 6), _interleaved(8, 7, 5, 6)
    mixed = [
        x.select(2, 0),
        x.select(2, 1),
        x[:4, :, 0],
        y.select(2, 0),
        y.select(2, 1),
    ]
    blocks = plan_copies(mixed)
    assert [len(b.parts) for b in blocks] == [2, 0, 2]
    assert sorted(i for b in blocks for i, *_ in b.members) == list(range(5))
    for block in blocks:
        for i, h in _copied(block):
            assert torch.equal(h, mixed[i])


def test_a_snapshot_copied_into_a_buffer_gives_the_blocks_copy():
    """The side stream copies a block's snapshot, taken on the caller's stream: in
    a buffer it lies byte for byte as the block's own copy, for each kind of block
    (a span of views, a tensor alone copied contiguous, views gathered)."""
    x, fields = torch.randn(4, 3, 2, 5), torch.randn(2, 7, 5).transpose(-1, -2)
    y = _interleaved(8, 7, 5, 6)
    blocks = [
        *plan_copies([x[:, 0], x[:, 1]]),
        *plan_copies([x[:, 0]]),
        *plan_copies([fields]),
        *plan_copies([y.select(2, i) for i in range(7)]),
    ]
    assert [len(b.parts) for b in blocks] == [0, 0, 0, 7]
    for block in blocks:
        snapshot = block.snapshot()
        assert snapshot.is_contiguous() and snapshot.numel() == block.numel
        # A copy, not a view: later in-place work on the tensors cannot reach it.
        source = block.parts[0] if block.parts else block.source
        assert snapshot.untyped_storage().data_ptr() != (
            source.untyped_storage().data_ptr()
        )
        own = torch.empty(block.numel, dtype=block.source.dtype)
        block.copy_into(own)
        from_snapshot = torch.empty_like(own)
        from_snapshot.view(snapshot.shape).copy_(snapshot)
        assert torch.equal(own.view(torch.int32), from_snapshot.view(torch.int32))
