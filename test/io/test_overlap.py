"""OverlappedIO: the bytes of synchronous writing, errors in the caller, bounded memory,
nothing lost or leaked however it ends.

Persistence has no network, so these rollouts cost no compile: they exercise the
writer, not Inductor. Ordering is set with events, not sleeps, wherever a result
depends on it (the machine running them may be loaded); a sleep only makes storage
slower than the caller.
"""

from __future__ import annotations

import gc
import textwrap
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TIME, messages
from io_helpers import (
    NSTEPS,
    Copies,
    Recorder,
    make_backend,
    own_threads,  # noqa: F401 (autouse fixture)
    read_back,
    run_child,
    step_tensors,
    threads_left,
    zarr_writes,
)

from earth2studio_compile import run
from earth2studio_compile.io import OverlappedIO
from earth2studio_compile.tools import zoo

BACKENDS = ["kv", "zarr", "netcdf4", "async-zarr"]


def _rollout(name: str, tmp: Path, overlap: bool) -> dict[str, np.ndarray]:
    model = zoo.build("persistence")
    np.random.seed(0)
    directory = tmp / f"{name}-{overlap}"
    directory.mkdir()
    backend = make_backend(name, directory, model)
    io = OverlappedIO(backend) if overlap else backend
    run.deterministic(TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False)
    if name in ("netcdf4", "async-zarr"):
        io.close()  # file-backed: written out on close
    files = list(directory.iterdir())
    return read_back(name, backend, str(files[0]) if files else None)


@pytest.mark.parametrize("name", BACKENDS)
def test_overlapped_output_equals_synchronous(name, tmp_path):
    sync = _rollout(name, tmp_path, overlap=False)
    overlapped = _rollout(name, tmp_path, overlap=True)
    assert sync.keys() == overlapped.keys() and "t2m" in sync
    for key, value in sync.items():
        np.testing.assert_array_equal(overlapped[key], value, err_msg=key)
    assert np.isfinite(sync["t2m"]).all() and np.abs(sync["t2m"]).sum() > 0


def test_writes_arrive_in_order_from_one_background_thread():
    backend = Recorder()
    with OverlappedIO(backend) as io:
        for i in range(20):
            io.write(
                torch.full((2, 2), float(i)), {"lead_time": np.array([i])}, f"a{i}"
            )
    assert backend.writes == [(float(i), f"a{i}") for i in range(20)]
    assert (
        len(backend.thread_ids) == 1 and threading.get_ident() not in backend.thread_ids
    )


def test_caller_may_modify_its_tensor_after_write():
    backend = Recorder(delay=0.05)
    x = torch.zeros(2, 2)
    with OverlappedIO(backend) as io:
        io.write(x, {}, "a")
        x.fill_(7.0)  # before the background write ran
    assert backend.writes == [(0.0, "a")]


def test_queue_is_bounded_under_a_slow_writer():
    backend = Recorder(delay=0.1)
    io = OverlappedIO(backend, max_pending=2)
    outstanding, start = [], time.perf_counter()
    for i in range(8):
        io.write(torch.full((4,), float(i)), {}, "a")
        outstanding.append(i + 1 - len(backend.writes))
    enqueued = time.perf_counter() - start
    io.close()
    # At most max_pending waiting plus the one being written: host memory is bounded.
    assert max(outstanding) <= 3
    # The producer was held back by the writer (8 writes of 0.1 s, 3 may be pending).
    assert enqueued >= 0.4
    assert [v for v, _ in backend.writes] == [float(i) for i in range(8)]


def test_writer_error_is_raised_once_and_stops_the_writer():
    backend = Recorder(fail_at=2)
    io = OverlappedIO(backend)
    for i in range(3):
        io.write(torch.full((2,), float(i)), {}, "a")
    with pytest.raises(OSError, match="disk full") as raised:
        io.flush()
    # Nothing is accepted after a failure, and the refusal carries the original error.
    with pytest.raises(RuntimeError, match="earlier write error") as refused:
        io.write(torch.zeros(2), {}, "a")
    assert refused.value.__cause__ is raised.value
    with pytest.raises(RuntimeError, match="earlier write error"):
        io.add_array({}, "a")
    assert [v for v, _ in backend.writes] == [0.0, 1.0]
    # Delivered once: flushing and closing do not raise it again.
    io.flush()
    io.close()
    assert backend.closed


def test_close_closes_the_backend_after_a_write_error():
    backend = Recorder(fail_at=1)
    io = OverlappedIO(backend)
    for i in range(2):
        io.write(torch.full((2,), float(i)), {}, "a")
    with pytest.raises(OSError, match="disk full"):
        io.close()
    assert backend.closed and [v for v, _ in backend.writes] == [0.0]


@pytest.mark.parametrize("max_pending", [1, 2])
def test_host_copies_never_exceed_max_pending_plus_one(max_pending):
    """The docstring's memory bound: one step being written plus max_pending queued."""
    copies = Copies()

    class Counting(Recorder):
        def write(self, x, coords, array_name):
            copies.seen(x)
            super().write(x, coords, array_name)

    backend = Counting(delay=0.05)
    with OverlappedIO(backend, max_pending=max_pending) as io:
        for i in range(8):
            io.write(torch.full((4,), float(i)), {}, "a")
            copies.wrote(1)
    assert [v for v, _ in backend.writes] == [float(i) for i in range(8)]
    assert copies.peak == max_pending + 1 and io.blocked_s > 0


def test_a_write_error_reaches_the_caller_once(logs):
    from earth2studio.io import KVBackend

    class Failing(KVBackend):
        def __init__(self):
            super().__init__()
            self.count, self.error = 0, None

        def write(self, x, coords, array_name):
            self.count += 1
            if self.count == 2:
                self.error = OSError("disk full (injected)")
                raise self.error
            super().write(x, coords, array_name)

    class SlowCaller(OverlappedIO):
        # Steps slower than the writes: the error is raised at the next write, inside
        # the workflow, which then drains its IO with failed=True.
        def write(self, x, coords, array_name):
            super().write(x, coords, array_name)
            time.sleep(0.2)

    backend = Failing()
    io = SlowCaller(backend)
    model = zoo.build("persistence")
    with pytest.raises(OSError, match="disk full") as raised:
        run.deterministic(
            TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False
        )
    assert raised.value is backend.error and backend.count == 2
    io.close()  # delivered: not raised again
    reports = messages(logs, "ERROR") + messages(logs, "WARNING")
    assert not [m for m in reports if "disk full" in m], reports


def test_workflow_raises_a_background_write_error():
    from earth2studio.io import KVBackend

    class Failing(KVBackend):
        def __init__(self):
            super().__init__()
            self.count = 0

        def write(self, x, coords, array_name):
            self.count += 1
            if self.count == 3:
                raise OSError("disk full (injected)")
            super().write(x, coords, array_name)

    model = zoo.build("persistence")
    with pytest.raises(OSError, match="disk full"):
        run.deterministic(
            TIME,
            NSTEPS,
            model,
            zoo.random_source(model),
            OverlappedIO(Failing()),
            verbose=False,
        )


def test_workflow_returns_only_after_every_write():
    from earth2studio.io import KVBackend

    class Slow(KVBackend):
        def write(self, x, coords, array_name):
            time.sleep(0.05)
            super().write(x, coords, array_name)

    model = zoo.build("persistence")
    backend = Slow()
    io = OverlappedIO(backend)
    np.random.seed(0)
    out = run.deterministic(
        TIME, NSTEPS, model, zoo.random_source(model), io, verbose=False
    )
    assert out is io and not threads_left()
    # Every lead time was written: no slice of the preallocated arrays is left at zero.
    t2m = backend.root["t2m"]
    assert all(t2m[0, i].abs().sum() > 0 for i in range(NSTEPS + 1))


def test_the_backend_read_after_flush_sees_every_write():
    from earth2studio.io import KVBackend

    released = threading.Event()

    class Slow(KVBackend):
        def write(self, x, coords, array_name):
            assert released.wait(30)
            super().write(x, coords, array_name)

    io = OverlappedIO(Slow())
    coords = {"lead_time": np.array([0, 1])}
    io.add_array(coords, "a")
    io.write(torch.ones(1), {"lead_time": np.array([1])}, "a")
    assert io.io.root["a"].tolist() == [0.0, 0.0]  # not stored yet
    released.set()
    io.flush()
    assert io.io.root["a"].tolist() == [0.0, 1.0]
    io.close()


def test_bad_arguments_name_the_fix():
    from earth2studio.io import KVBackend

    with pytest.raises(TypeError, match="has no add_array"):
        OverlappedIO(object())
    with pytest.raises(ValueError, match="max_pending must be >= 1"):
        OverlappedIO(KVBackend(), max_pending=0)
    with pytest.raises(TypeError, match="max_pending must be an int"):
        OverlappedIO(KVBackend(), max_pending=2.5)
    with pytest.raises(TypeError, match="already an OverlappedIO"):
        OverlappedIO(OverlappedIO(KVBackend()))
    io = OverlappedIO(KVBackend())
    io.close()
    with pytest.raises(RuntimeError, match="closed"):
        io.write(torch.zeros(1), {}, "a")


def test_dropping_the_last_reference_flushes_with_a_warning(logs):
    backend = Recorder(delay=0.05)
    io = OverlappedIO(backend)
    for i in range(4):
        io.write(torch.full((2,), float(i)), {}, "a")
    del io
    gc.collect()
    # Flushed by the finalizer, before it returned: nothing was left to the daemon.
    assert [v for v, _ in backend.writes] == [0.0, 1.0, 2.0, 3.0] and backend.closed
    warnings = [m for m in messages(logs, "WARNING") if "not closed" in m]
    assert len(warnings) == 1 and "Recorder" in warnings[0]


def test_a_finalizer_run_by_the_worker_does_not_wait_for_itself(logs):
    released, closed = threading.Event(), threading.Event()

    class Collecting(Recorder):
        def write(self, x, coords, array_name):
            if not self.writes:
                # Garbage collection may run in any thread, here the writer's own.
                released.wait(5)
                gc.collect()
            super().write(x, coords, array_name)

        def close(self):
            super().close()
            closed.set()

    backend = Collecting(delay=0.01)
    gc.disable()  # only the worker's collect() may free the wrapper
    try:
        io = OverlappedIO(backend)
        io.cycle = io  # unreachable only once the reference below is dropped
        for i in range(3):
            io.write(torch.full((2,), float(i)), {}, "a")
        del io
        released.set()
        assert closed.wait(30)
    finally:
        gc.enable()
    assert [v for v, _ in backend.writes] == [0.0, 1.0, 2.0]
    assert [m for m in messages(logs, "WARNING") if "not closed" in m]


def test_an_unclosed_writer_is_flushed_at_exit(tmp_path):
    out = tmp_path / "writes.txt"
    script = textwrap.dedent(
        f"""
        import time

        import torch

        from earth2studio_compile.io import OverlappedIO

        class FileBackend:
            def add_array(self, coords, array_name, **kwargs):
                pass

            def write(self, x, coords, array_name):
                time.sleep(0.05)
                with open({str(out)!r}, "a") as f:
                    f.write(f"{{float(x[0])}}\\n")

        io = OverlappedIO(FileBackend())
        for i in range(4):
            io.write(torch.full((2,), float(i)), {{}}, "a")
        """
    )
    done = run_child(script)
    assert done.returncode == 0, done.stderr
    assert out.read_text().split() == ["0.0", "1.0", "2.0", "3.0"], done.stderr
    assert "WARNING" in done.stderr
    assert "OverlappedIO around FileBackend was not closed" in done.stderr, done.stderr
    assert "pending" in done.stderr


def test_writes_queued_after_a_failure_are_counted_and_logged(logs):
    backend = Recorder(delay=0.05, fail_at=1)
    io = OverlappedIO(backend, max_pending=4)
    for i in range(4):
        io.write(torch.full((2,), float(i)), {}, "a")
    with pytest.raises(OSError, match="disk full"):
        io.close()
    assert [v for v, _ in backend.writes] == [0.0]
    assert io.written == 1 and io.dropped == 2
    assert [m for m in messages(logs, "ERROR") if "2 write(s) queued" in m]


def test_a_failing_backend_never_lets_the_workflow_return():
    from earth2studio.io import KVBackend

    class Failing(KVBackend):
        def __init__(self):
            super().__init__()
            self.count, self.error = 0, None

        def write(self, x, coords, array_name):
            self.count += 1
            if self.count == 3:
                self.error = OSError("disk full (injected)")
                raise self.error
            super().write(x, coords, array_name)

    backend = Failing()
    io = OverlappedIO(backend, max_pending=1)
    model = zoo.build("persistence")
    with pytest.raises(OSError, match="disk full") as raised:
        run.deterministic(
            TIME, 6, model, zoo.random_source(model), io, verbose=False, compile=False
        )
    assert raised.value is backend.error and backend.count == 3
    # Raised once: later writes are refused with the original as their cause.
    with pytest.raises(RuntimeError, match="earlier write error") as refused:
        io.write(torch.zeros(1), {}, "t2m")
    assert refused.value.__cause__ is backend.error
    io.close()
    assert not threads_left()


def test_two_threads_may_write_at_once():
    class Exclusive(Recorder):
        """Fails if it is ever called from two threads at once."""

        def __init__(self):
            super().__init__(delay=0.002)
            self.inside = threading.Lock()

        def write(self, x, coords, array_name):
            assert self.inside.acquire(blocking=False), "called concurrently"
            try:
                super().write(x, coords, array_name)
            finally:
                self.inside.release()

    backend = Exclusive()
    io = OverlappedIO(backend, max_pending=1)
    start = threading.Barrier(2)

    def writer(name: str) -> None:
        start.wait()
        for i in range(20):
            io.write(torch.full((2,), float(i)), {}, name)

    users = [threading.Thread(target=writer, args=(n,)) for n in ("x", "y")]
    for user in users:
        user.start()
    for user in users:
        user.join(30)
    closing = threading.Thread(target=io.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive() and backend.closed  # close() did not hang
    for name in ("x", "y"):
        assert [v for v, n in backend.writes if n == name] == [
            float(i) for i in range(20)
        ]
    assert not threads_left()


@pytest.mark.parametrize("how", ["close", "collected", "exception"])
def test_no_thread_outlives_its_writer(how, tmp_path):
    from earth2studio.io import ZarrBackend

    names = ["a", "b"]
    backend = ZarrBackend(str(tmp_path / "out.zarr"))
    io = OverlappedIO(backend, workers=2)
    io.add_array(OrderedDict(lead_time=np.arange(3), x=np.arange(4)), names)

    def write() -> None:
        for i in range(3):
            io.write(step_tensors(i, 2), OrderedDict(lead_time=np.array([i])), names)

    if how == "close":
        write()
        io.close()
    elif how == "collected":
        write()
        del io
        gc.collect()
    else:
        with pytest.raises(KeyError), io:
            write()
            raise KeyError("the caller's own error")
    assert not threads_left()
    np.testing.assert_array_equal(backend.root["b"][:, 0], [1.0, 11.0, 21.0])


@pytest.mark.parametrize("workers", [1, 4])
def test_an_unclosed_zarr_writer_loses_nothing_at_exit(workers, tmp_path):
    path = tmp_path / "out.zarr"
    script = textwrap.dedent(
        f"""
        from collections import OrderedDict

        import numpy as np
        import torch
        from earth2studio.io import ZarrBackend

        from earth2studio_compile.io import OverlappedIO

        names = ["a", "b", "c", "d"]
        io = OverlappedIO(ZarrBackend({str(path)!r}), max_pending=8, workers={workers})
        io.add_array(OrderedDict(lead_time=np.arange(8), x=np.arange(64)), names)
        for i in range(8):
            io.write(
                [torch.full((1, 64), 1.0 + i) for _ in names],
                OrderedDict(lead_time=np.array([i]), x=np.arange(64)),
                names,
            )
        """
    )
    done = run_child(script)
    assert done.returncode == 0, done.stderr
    import zarr

    group = zarr.open_group(str(path), mode="r")
    for name in ["a", "b", "c", "d"]:
        assert group[name][:, 0].tolist() == [1.0 + i for i in range(8)], done.stderr
    assert "was not closed before exit" in done.stderr


class _Keeper:
    """Keeps a copy of every tensor it is handed, by name."""

    def __init__(self):
        self.stored: dict[str, list[torch.Tensor]] = {}

    def add_array(self, coords, array_name, **kwargs):
        pass

    def write(self, x, coords, array_name):
        for t, name in zip(x, array_name):
            self.stored.setdefault(name, []).append(t.clone())


@pytest.mark.parametrize("max_pending", [1, 2])
def test_a_write_of_views_is_one_copy_into_buffers_reused_across_steps(max_pending):
    """What split_coords hands write(): 26 views of one tensor, one copy per step;
    over 10 steps no more buffers than steps in flight."""
    backend, names = _Keeper(), [f"v{i}" for i in range(26)]
    torch.manual_seed(0)
    x = torch.zeros(2, 1, 1, 26, 9, 12)
    step_bytes = x.numel() * x.element_size()
    with OverlappedIO(backend, max_pending=max_pending) as io:
        for step in range(10):
            x.normal_()  # in place: the writer must hold a copy
            io.write([x[:, :, :, i] for i in range(26)], {}, names)
            assert io._pool.copies == step + 1
        assert io._pool.allocated <= max_pending + 1 + io._pool.kept
        assert 0 < io.host_bytes <= (max_pending + 1) * step_bytes
    assert io._pool.held_bytes == 0  # let go at close
    torch.manual_seed(0)  # the same draws again
    x = torch.zeros(2, 1, 1, 26, 9, 12)
    for step in range(10):
        x.normal_()
        for i, name in enumerate(names):
            assert torch.equal(backend.stored[name][step], x[:, :, :, i])


def test_an_in_memory_zarr_store_keeps_every_step_whole():
    """A memory store keeps views of what it stores: those buffers are never
    reused, or an earlier step would change under the store."""
    from earth2studio.io import ZarrBackend

    names, nsteps = ["a", "b", "c"], 6
    io = OverlappedIO(ZarrBackend(), max_pending=1)
    io.add_array(OrderedDict(lead_time=np.arange(nsteps), x=np.arange(4)), names)
    x = torch.zeros(1, 3, 4)
    for i in range(nsteps):
        x.fill_(float(i))
        io.write(list(x.unbind(1)), OrderedDict(lead_time=np.array([i])), names)
    io.close()
    for name in names:
        np.testing.assert_array_equal(io.io.root[name][:, 0], np.arange(nsteps))
    assert io._pool.kept > 0  # the store held them


@pytest.mark.parametrize("workers", [1, 4])
def test_buffers_are_reused_with_a_zarr_store_on_disk(workers, tmp_path):
    names, nsteps = [f"v{i}" for i in range(6)], 10
    io, backend = zarr_writes(names, nsteps, tmp_path / "out.zarr", workers=workers)
    x = torch.zeros(1, 6, 4)
    for i in range(nsteps):
        x.fill_(float(i))
        io.write(list(x.unbind(1)), OrderedDict(lead_time=np.array([i])), names)
    io.close()
    for name in names:
        np.testing.assert_array_equal(backend.root[name][:, 0], np.arange(nsteps))
    # A buffer is let go, not reused, where a writer's thread still held it when
    # checked (seldom: it lets go as its job ends); nothing else adds buffers.
    assert io._pool.copies == nsteps and io._pool.kept <= 2
    assert io._pool.allocated <= io.max_pending + 1 + io._pool.kept


@pytest.mark.gpu
@pytest.mark.parametrize("max_pending", [1, 2])
def test_a_cuda_rollout_of_views_is_stored_bitwise_with_bounded_buffers(
    max_pending, tmp_path
):
    from earth2studio.io import ZarrBackend
    from earth2studio.utils.coords import split_coords

    nsteps, nvar = 12, 26
    names = [f"v{i}" for i in range(nvar)]
    grid = OrderedDict(lat=np.arange(181), lon=np.arange(360))

    def rollout(io) -> None:
        torch.manual_seed(0)
        io.add_array(
            OrderedDict(batch=np.arange(2), lead_time=np.arange(nsteps), **grid), names
        )
        x = torch.randn(2, 1, nvar, 181, 360, device="cuda")
        for step in range(nsteps):
            torch.cuda._sleep(5_000_000)  # a slow step: the copy must wait for it
            x = x * 1.01 + torch.randn_like(x)  # a new tensor; the old one is freed
            coords = OrderedDict(
                batch=np.arange(2),
                lead_time=np.array([step]),
                variable=np.array(names),
                **grid,
            )
            io.write(*split_coords(x, coords))

    sync = ZarrBackend(str(tmp_path / "sync.zarr"))
    rollout(sync)
    backend = ZarrBackend(str(tmp_path / "overlapped.zarr"))
    with OverlappedIO(backend, max_pending=max_pending) as io:
        rollout(io)
        step_bytes = 2 * nvar * 181 * 360 * 4
        assert io._pool.copies == nsteps and io._pool.kept <= 2
        assert io._pool.allocated <= max_pending + 1 + io._pool.kept
        assert io.host_bytes <= (max_pending + 1) * step_bytes
    for name in names:
        np.testing.assert_array_equal(backend.root[name][:], sync.root[name][:])
