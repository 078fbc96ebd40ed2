"""Host copies (earth2studio_compile.io.host): views of one storage copied once, the
host views bitwise the tensors, buffers reused across steps and bounded, a buffer
something else still holds never reused.

CPU tensors stand in for the device: the plan and the pool are the same for both;
only the copy is asynchronous on a GPU (the GPU-marked tests here and in
test_overlap.py run it there).
"""

from __future__ import annotations

import threading
from collections import deque

import pytest
import torch

from earth2studio_compile.io.copies import plan_copies
from earth2studio_compile.io.host import HostPool

NVAR = 26


def _state(batch: int = 2) -> torch.Tensor:
    # (batch, time, lead_time, variable, lat, lon), as Earth2Studio's workflows hold it
    return torch.randn(batch, 1, 1, NVAR, 5, 7)


def _split(x: torch.Tensor) -> list[torch.Tensor]:
    """What ``split_coords`` hands ``write``: a view per variable."""
    return [x.select(3, i) for i in range(x.shape[3])]


def _same(host: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
    assert len(host) == len(tensors)
    for h, t in zip(host, tensors):
        assert h.shape == t.shape and h.dtype == t.dtype and h.device.type == "cpu"
        # Bitwise, NaN payloads included.
        assert torch.equal(h.view(torch.int32), t.view(torch.int32))


def _stage_and_give(pool: HostPool, tensors: list[torch.Tensor]) -> None:
    staged = pool.stage(tensors)
    _same(staged.host, tensors)
    buffers = staged.buffers
    del staged  # the writer drops its host views once stored
    pool.give(buffers)


def test_views_of_one_tensor_are_one_copy_of_the_block_that_covers_them():
    x = _state()
    views = _split(x)
    blocks = plan_copies(views)
    assert len(blocks) == 1 and blocks[0].numel == x.numel()
    pool = HostPool(pin_memory=False)
    staged = pool.stage(views)
    assert pool.copies == 1 and len(staged.buffers) == 1 and staged.ready == []
    _same(staged.host, views)
    for h, t in zip(staged.host, views):
        assert h.stride() == t.stride()  # views of the copy, as of the tensor


def test_a_block_covers_only_the_span_it_needs():
    x = _state(batch=1)
    views = _split(x[:, :, :, 3:9])  # offset into the storage, a run of variables
    (block,) = plan_copies(views)
    assert block.numel < x.numel()
    pool = HostPool(pin_memory=False)
    _same(pool.stage(views).host, views)


def test_views_far_apart_are_copied_one_by_one():
    x = _state()
    views = [x.select(3, 0), x.select(3, NVAR - 1)]  # a span ~13x their bytes
    blocks = plan_copies(views)
    assert len(blocks) == 2
    assert all(b.numel == v.numel() for b, v in zip(blocks, views))  # contiguous
    _same(HostPool(pin_memory=False).stage(views).host, views)


def test_separate_tensors_odd_layouts_and_empty_ones_are_each_their_own_copy():
    x = _state(batch=1)
    tensors = [
        torch.randn(3, 4),
        x.select(3, 2),
        torch.randn(4, 3).t(),  # transposed: copied contiguous (rows for the store)
        torch.tensor(2.5).expand(3, 4),  # one element seen 12 times
        torch.empty(0, 4),
        torch.arange(6, dtype=torch.float64),
        x.select(3, 5),
    ]
    blocks = plan_copies(tensors)
    # x's two views (3 variables apart) share a block; the rest are alone.
    assert len(blocks) == len(tensors) - 1
    assert sorted(i for b in blocks for i, *_ in b.members) == list(range(7))
    assert plan_copies([tensors[3]])[0].numel == 1
    staged = HostPool(pin_memory=False).stage(tensors)
    for h, t in zip(staged.host, tensors):
        assert torch.equal(h, t)
    assert staged.host[2].is_contiguous()


def test_interleaved_variables_are_one_copy_into_one_buffer():
    # DLWP's output: its variables interleave (test_copies.py); the step is one
    # copy into one host buffer, each variable contiguous there.
    batch, nvar, lat, lon = 8, 7, 5, 6
    x = torch.randn(lat * lon, batch * nvar).t().reshape(batch, 1, nvar, lat, lon)
    views = [x.select(2, i) for i in range(nvar)]
    pool = HostPool(pin_memory=False)
    staged = pool.stage(views)
    assert pool.copies == 1 and len(staged.buffers) == 1
    _same(staged.host, views)
    assert all(h.is_contiguous() for h in staged.host)


def test_cpu_copies_are_made_before_stage_returns():
    x = _state()
    views = _split(x)
    expected = [v.clone() for v in views]
    staged = HostPool(pin_memory=False).stage(views)
    x.fill_(7.0)
    _same(staged.host, expected)


def test_buffers_are_reused_across_steps():
    pool = HostPool(pin_memory=False)
    x = _state()
    for step in range(10):
        x.normal_()
        _stage_and_give(pool, _split(x))
    assert pool.copies == 10 and pool.allocated == 1 and pool.kept == 0
    assert pool.peak_bytes == x.numel() * x.element_size()


@pytest.mark.parametrize("in_flight", [1, 2, 3])
@pytest.mark.parametrize("ahead", [False, True])
def test_buffers_alive_never_exceed_the_steps_in_flight(in_flight, ahead):
    """OverlappedIO gives a step back once stored, with at most max_pending + 1 in
    flight: the pool then holds no more than that many steps. Made ahead (as
    OverlappedIO has them, ``ahead=max_pending``), the first step makes its own
    buffer and a thread makes those of the steps that may follow it in flight."""
    pool = HostPool(pin_memory=False, ahead=in_flight - 1 if ahead else 0)
    x = _state()
    step_bytes = x.numel() * x.element_size()
    pending: deque[list[torch.Tensor]] = deque()
    for step in range(10):
        if len(pending) == in_flight:
            pool.give(pending.popleft())
        x.normal_()
        staged = pool.stage(_split(x))
        _same(staged.host, _split(x))
        pending.append(staged.buffers)
        del staged
        assert pool.held_bytes <= in_flight * step_bytes
        if ahead:
            assert pool.allocated == in_flight
            assert pool.allocated_ahead == in_flight - 1
    assert pool.allocated == in_flight and pool.peak_bytes == in_flight * step_bytes
    while pending:
        pool.give(pending.popleft())
    pool.clear()
    assert pool.held_bytes == 0


def test_a_buffer_something_still_holds_is_never_reused():
    """An in-memory Zarr store keeps views of what it stores."""
    pool, x = HostPool(pin_memory=False), _state()
    stored = []
    for step in range(4):
        x.fill_(float(step))
        staged = pool.stage(_split(x))
        stored.append(staged.host[0].numpy())  # what the store keeps
        buffers = staged.buffers
        del staged
        pool.give(buffers)
    assert [float(a.flat[0]) for a in stored] == [0.0, 1.0, 2.0, 3.0]
    # Checked at the next step: the last one is still in the pool's hands.
    assert pool.kept == 3 and pool.allocated == 4
    pool.clear()
    assert pool.held_bytes == 0


def test_free_buffers_a_step_does_not_need_are_let_go():
    pool = HostPool(pin_memory=False)
    _stage_and_give(pool, _split(_state(batch=2)))
    big = _state(batch=3)
    _stage_and_give(pool, _split(big))
    # The first step's buffer went when the second needed another size.
    assert pool.allocated == 2 and pool.held_bytes == big.numel() * big.element_size()
    pool.clear()
    assert pool.held_bytes == 0


def test_pinned_memory_refused_is_plain_memory_from_then_on(logs):
    """Where CUDA cannot pin a buffer (here a machine without CUDA refuses, as a
    host short of memory would): the step gets plain buffers, one WARNING, the pool
    pins no more, and what it holds stays within its bound."""
    from conftest import messages

    pool, cpu = HostPool(pin_memory=True, ahead=1), torch.device("cpu")
    pinned, plain = (torch.float32, 1000, True), (torch.float32, 1000, False)
    first = pool._take([pinned, pinned], [cpu, cpu])
    assert not pool.pin_memory and len(first) == 2
    assert pool.allocated_ahead == 2  # the step's plain buffers made ahead, as ever
    assert all(b.numel() == 1000 and not b.is_pinned() for b in first)
    pool.give(first)
    for _ in range(3):  # the later steps ask as a pool that pins no more does
        pool.give(pool._take([plain, plain], [cpu, cpu]))
    warned = [m for m in messages(logs, "WARNING") if "pinned host memory" in m]
    assert len(warned) == 1
    assert set(pool._alive) == {plain} and pool.allocated == (1 + 1) * 2
    assert pool.peak_bytes <= 4 * 4000
    pool.clear()
    assert pool.held_bytes == 0


@pytest.mark.gpu
def test_cuda_views_are_one_copy_into_reused_pinned_buffers_before_later_work():
    pool, x = HostPool(pin_memory=True), torch.randn(2, 1, 1, NVAR, 64, 128).cuda()
    for step in range(5):
        expected = [(v + 1.0).cpu() for v in _split(x)]
        torch.cuda._sleep(10_000_000)  # the tensor is finished late on the caller's
        x.add_(1.0)  # stream: the copy must wait for it
        views = _split(x)
        staged = pool.stage(views)
        # A model updating its state in place once write() returned: ordered after
        # the copy, never racing with it.
        x.mul_(-1.0)
        assert len(staged.ready) == 1 and staged.buffers[0].is_pinned()
        staged.ready[0].synchronize()
        _same(staged.host, expected)
        buffers = staged.buffers
        del staged, views
        pool.give(buffers)
    assert pool.copies == 5 and pool.allocated == 1


@pytest.mark.gpu
def test_cuda_copies_run_on_a_side_stream_behind_a_snapshot():
    """The caller's stream does not wait for the copy to the host: it goes on once
    the step's snapshot is taken (here while the side stream is held up), and its
    later in-place work cannot reach what is copied."""
    pool, x = HostPool(pin_memory=True), torch.randn(2, 1, 1, NVAR, 64, 128).cuda()
    # One step without the hold-up first: CUDA loads a kernel at its first launch
    # and loading waits for the kernels running, the hold-up's included. Run first
    # in its process (GPU suite, -n 4), this test saw the caller's `mul_` wait for
    # the side stream's second-long sleep.
    warm = pool.stage(_split(x))
    x.mul_(1.0)
    warm.ready[0].synchronize()
    pool.give(warm.buffers)
    del warm
    for step in range(3):
        expected = [v.cpu() for v in _split(x)]
        side = pool.copy_stream(x.device)
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000_000)  # the copy waits behind this
        staged = pool.stage(_split(x))
        x.mul_(-1.0)  # the model's next step, in place
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream())
        done.synchronize()  # the caller's stream ran on...
        assert not staged.ready[0].query()  # ...while the copy still waits
        staged.ready[0].synchronize()
        _same(staged.host, expected)
        buffers = staged.buffers
        del staged
        pool.give(buffers)
    assert pool.side_copies == 4 and pool.allocated == 1


@pytest.mark.gpu
def test_cuda_interleaved_views_are_gathered_by_the_device_in_one_copy():
    # DLWP's output on the device: one stack and one copy into one pinned buffer,
    # ordered before the caller's later work as any copy.
    batch, nvar, lat, lon = 8, 7, 33, 64
    x = torch.randn(lat * lon, batch * nvar).cuda().t()
    x = x.reshape(batch, 1, nvar, lat, lon)
    pool = HostPool(pin_memory=True)
    for step in range(3):
        expected = [v.cpu() for v in (x.select(2, i) for i in range(nvar))]
        torch.cuda._sleep(10_000_000)
        views = [x.select(2, i) for i in range(nvar)]
        staged = pool.stage(views)
        x.mul_(-1.0)  # in place, once write() returned
        assert pool.copies == step + 1 and staged.buffers[0].is_pinned()
        staged.ready[0].synchronize()
        _same(staged.host, expected)
        buffers = staged.buffers
        del staged, views
        pool.give(buffers)
    assert pool.allocated == 1


def test_a_step_of_several_buffers_of_one_size_has_them_made_ahead_for_each():
    # Tensors of their own whose rows are not one run of memory: each copied by
    # itself, a block per variable, all of one size.
    pool = HostPool(pin_memory=False, ahead=1)
    for step in range(4):
        fields = [torch.randn(2, 7, 5).transpose(-1, -2) for _ in range(NVAR)]
        _stage_and_give(pool, fields)
    assert pool.allocated == 2 * NVAR and pool.allocated_ahead == NVAR
    pool.clear()
    assert pool.held_bytes == 0


def test_buffers_being_made_for_a_size_no_longer_needed_are_dropped():
    pool = HostPool(pin_memory=False, ahead=2)
    _stage_and_give(pool, _split(_state(batch=2)))
    big = _state(batch=3)
    _stage_and_give(pool, _split(big))
    assert pool.held_bytes == 3 * big.numel() * big.element_size()
    pool.clear()
    assert pool.held_bytes == 0


def test_a_buffer_that_fails_to_be_made_ahead_is_made_by_the_step(monkeypatch):
    made = HostPool._new

    def fails_on_its_thread(self, key, device):
        if threading.current_thread() is not threading.main_thread():
            raise MemoryError("no host memory")
        return made(self, key, device)

    monkeypatch.setattr(HostPool, "_new", fails_on_its_thread)
    pool, x = HostPool(pin_memory=False, ahead=2), _state()
    step_bytes = x.numel() * x.element_size()
    staged = []
    for step in range(3):  # none given back: the later two take what was made ahead
        x.normal_()
        staged.append(pool.stage(_split(x)))
        _same(staged[-1].host, _split(x))
    assert pool.allocated == 3 and pool.allocated_ahead == 0
    assert pool.held_bytes == pool.peak_bytes == 3 * step_bytes


@pytest.mark.gpu
def test_pinned_buffers_made_ahead_take_the_copies_of_the_steps_in_flight():
    pool, x = HostPool(pin_memory=True, ahead=2), torch.randn(2, 1, 1, NVAR, 64, 128)
    x = x.cuda()
    staged = []
    for step in range(3):  # none given back: three steps in flight
        x.add_(1.0)
        expected = [v.cpu() for v in _split(x)]
        staged.append(pool.stage(_split(x)))
        staged[-1].ready[0].synchronize()
        _same(staged[-1].host, expected)
        assert staged[-1].buffers[0].is_pinned()
    assert pool.allocated == 3 and pool.allocated_ahead == 2
