"""OverlappedIO however it ends: a backend error reaches the caller once and stops
the writer, a workflow never returns before its writes or past a failed one, and an
unclosed, collected or abandoned writer loses nothing and leaves no thread.

Persistence has no network, so these rollouts cost no compile: they exercise the
writer, not Inductor. Ordering is set with events, not sleeps, wherever a result
depends on it (the machine running them may be loaded).
"""

from __future__ import annotations

import gc
import textwrap
import threading
import time
from collections import OrderedDict

import numpy as np
import pytest
import torch
from conftest import TIME, messages
from io_helpers import (
    NSTEPS,
    Recorder,
    failing_kv,
    own_threads,  # noqa: F401 (autouse fixture)
    run_child,
    run_ensemble,
    step_tensors,
    threads_left,
)

from earth2studio_compile import run
from earth2studio_compile.io import OverlappedIO
from earth2studio_compile.tools import zoo

BACKENDS = ["kv", "zarr", "netcdf4", "async-zarr"]


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


def test_a_write_error_reaches_the_caller_once(logs):
    class SlowCaller(OverlappedIO):
        # Steps slower than the writes: the error is raised at the next write, inside
        # the workflow, which then drains its IO with failed=True.
        def write(self, x, coords, array_name):
            super().write(x, coords, array_name)
            time.sleep(0.2)

    backend = failing_kv(2)
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
    model = zoo.build("persistence")
    with pytest.raises(OSError, match="disk full"):
        run.deterministic(
            TIME,
            NSTEPS,
            model,
            zoo.random_source(model),
            OverlappedIO(failing_kv(3)),
            verbose=False,
        )


def test_an_error_in_the_middle_of_an_ensemble_reaches_the_caller_after_all_before_it():
    """5 members in batches of 2, 3 steps: 4 writes a batch. The 6th write (the
    second batch's first step) fails: the ensemble raises it, and the 5 writes
    before it hold what a synchronous run stores."""
    from earth2studio.io import KVBackend

    model = zoo.build("persistence")
    reference = KVBackend()
    run_ensemble(model, reference)
    backend = failing_kv(6)
    with pytest.raises(OSError, match="disk full"):
        run_ensemble(model, OverlappedIO(backend))
    assert backend.count == 6  # nothing written after the failure
    want, got = reference.root["t2m"], backend.root["t2m"]
    assert want.shape[:3] == (5, 1, NSTEPS + 1)  # ensemble, time, lead time
    assert torch.equal(got[:2], want[:2])  # the first batch, whole
    assert torch.equal(got[2:4, :, 0], want[2:4, :, 0])  # the second's initial state
    assert not got[2:4, :, 1].any()  # the failed write left nothing


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
    backend = failing_kv(3)
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
