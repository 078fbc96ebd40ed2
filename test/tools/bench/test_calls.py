"""The workflow mode's calls (earth2studio_compile.tools.bench.calls): an
ensemble's calls with overlapped writes, and the storage floor's writer pool."""

from __future__ import annotations

import inspect
import json
import sys

import pytest


def test_workflow_calls_of_an_ensemble_and_overlapped_writes(tmp_path, monkeypatch):
    """The child's calls in this process: upstream's ensemble eager then ours
    compiled (a padded last batch) into AsyncZarrBackend, the floors of a batched
    ensemble, and a compiled deterministic call writing through OverlappedIO."""
    from earth2studio_compile.tools.bench import calls, floors, phases

    monkeypatch.delenv("EARTH2STUDIO_COMPILE_PRECISION", raising=False)
    base = {"model": "fcn", "size": "small", "device": "cpu", "precision": "tf32"}
    ens = base | {"workflow": "ensemble", "steps": 2, "members": 3, "batch_size": 2}
    spec = ens | {"io": "async-zarr", "kind": "second", "repeats": 1}
    eager, compiled = calls.run(spec, tmp_path / "out.json", tmp_path)
    assert [(r["run"], r["call"]) for r in (eager, compiled)] == [
        ("eager", 1),
        ("compiled", 1),
    ]
    # 3 members x 3 lead times x 26 variables x 16 x 32 float32, in both stores
    expected = 4 * 3 * 3 * 26 * 16 * 32
    assert eager["store_bytes"] == compiled["store_bytes"] > expected // 2
    assert compiled["wall_s"] >= compiled["returned_s"] > compiled["first_step_s"] > 0
    assert eager["returned_s"] > eager["first_step_s"] > 0
    assert "padded batch" in compiled["report"]["summary"]  # the last batch: 1 of 2
    phases_timed = {"iterator_s", "map_coords_s", "split_coords_s", "write_s"}
    # compile=True writes AsyncZarrBackend through OverlappedIO: its blocked_s too
    assert (
        compiled["thread_s"]["blocked_s"] >= 0 and "blocked_s" not in eager["thread_s"]
    )
    for row in (eager, compiled):  # where the workflow's thread spent the call
        spent = dict(row["thread_s"])
        spent.pop("blocked_s", None)
        assert set(spent) == phases_timed
        assert all(v > 0 for v in spent.values())
        assert sum(spent.values()) < row["returned_s"]
        # the same phases' CPU time on the workflow's thread: at most their wall
        cpu = row["thread_cpu_s"]
        assert set(cpu) == set(spent) - {"blocked_s"}
        assert all(v > 0 for v in cpu.values())
        assert all(cpu[k] <= spent[k] + 0.02 for k in cpu)
        first = row["first_step"]  # where the first step went, each part timed
        assert list(first) == list(phases.FIRST_STEP)
        assert all(v > 0 for v in first.values())
        assert sum(first.values()) < row["first_step_s"]
        assert first["iterator"] < spent["iterator_s"]
        # the initial state's and each step's write: 3 lead times, 2 batches
        assert len(row["write_seconds"]) == 6
        assert row["write_seconds"][0] == first["write"]
        assert sum(row["write_seconds"]) == pytest.approx(spent["write_s"])
    assert json.loads((tmp_path / "out.json").read_text())["rows"][1]["call"] == 1
    (floor,) = calls.run(
        ens | {"io": None, "kind": "floor"}, tmp_path / "f.json", tmp_path
    )
    assert floor["model_steps"] == 4  # 2 steps x 2 batches
    assert floor["eager_step_ms"] > 0 and floor["compiled_step_ms"] > 0
    # on disk, the store's chunks: a member each, 3 lead times x 2 batches x 26
    assert floor["io_chunks"] == 3 * 2 * 26 * 2 and floor["io_chunks_floor_s"] > 0
    assert floor["floor_s"] == floor["compute_floor_s"] + floor["io_chunks_floor_s"]
    assert floor["io_floor_writers"] == floors.FLOOR_WRITERS == 8
    assert not list(tmp_path.glob("floor-*"))  # the floor's files are removed
    det = base | {"workflow": "deterministic", "steps": 2, "members": 1}
    det |= {"batch_size": 1, "io": "overlapped", "kind": "fresh", "run": "compiled"}
    (row,) = calls.run(det, tmp_path / "d.json", tmp_path)
    assert row["store_bytes"] > 0 and row["wall_s"] >= row["returned_s"] > 0
    assert row["thread_s"]["blocked_s"] >= 0  # an OverlappedIO's
    # its host memory: at most max_pending + 1 steps of 26 fields, one member
    assert row["max_pending"] == 2
    assert 0 < row["host_bytes"] <= 3 * 26 * 16 * 32 * 4
    assert eager["host_bytes"] is eager["max_pending"] is None  # AsyncZarrBackend
    assert row["first_step"]["perturbation"] == 0  # a deterministic call has none
    assert {x["status"] for x in row["report"]["regions"]} == {"compiled"}


def _small_fcn():
    from earth2studio_compile.tools import zoo

    return zoo.build("fcn", size="small")


@pytest.fixture
def slow_builds(tmp_path, monkeypatch):
    """Background builds on, in a cache of the test's own, each a process that
    sleeps (so it is still running when the row ends); a small FCN's spec."""
    from earth2studio_compile.artifacts import background, build_job

    monkeypatch.setenv(background.ENV, "on")
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build_job, "CHILD", "import time; time.sleep(120)")
    monkeypatch.delenv("EARTH2STUDIO_COMPILE_PRECISION", raising=False)
    return {"model": "fcn", "size": "small", "device": "cpu", "precision": "tf32"}


def test_a_cold_row_with_caches_of_its_own_cancels_its_build(tmp_path, slow_builds):
    """Nothing reads a cold repeat's caches after it: its background build (a minute
    on an H100) is cancelled after the timed call, not waited for."""
    from earth2studio_compile.tools.bench import calls

    spec = dict(slow_builds)
    spec |= {"workflow": "deterministic", "steps": 2, "members": 1, "batch_size": 1}
    spec |= {"io": "zarr-disk", "kind": "fresh", "run": "compiled", "build": "cancel"}
    (row,) = calls.run(spec, tmp_path / "out.json", tmp_path)
    assert row["report"]["regions"][0]["status"] == "building"
    said = row["background"][-1]  # this process's latest build (tests run others)
    assert "cancelled" in said, said
    assert row["background_wait_s"] < 30


def test_a_warm_row_cancels_background_work_its_cache_lacked(
    tmp_path, slow_builds, monkeypatch
):
    """A warm row starts from a cache tools.build filled, so background work in its
    process means the build missed something: AIFS2ENS on an H200 (thirty-eighth
    session) judged its processor again there, and the row waited 210 s, until its
    limit, leaving the device call no time for the rows after it. The wait is
    capped at WARM_WAIT_S; the row says the work was cut."""
    from earth2studio_compile.tools.bench import calls

    monkeypatch.setattr(calls, "WARM_WAIT_S", 1.0)
    spec = dict(slow_builds)
    spec |= {"workflow": "deterministic", "steps": 2, "members": 1, "batch_size": 1}
    spec |= {"io": "zarr-disk", "kind": "fresh", "run": "compiled", "way": "warm"}
    (row,) = calls.run(spec, tmp_path / "out.json", tmp_path)
    assert row["report"]["regions"][0]["status"] == "building"
    assert row["background_cut"] is True
    said = row["background"][-1]
    assert "cancelled" in said, said
    assert row["background_wait_s"] < 30


def test_a_cold_row_waits_for_its_builds_only_until_its_limit(tmp_path, slow_builds):
    """A cold row that fills the caches waits for its background builds, but not
    past the parent's limit: FCN3 on an H200 (forty-first session) waited for 17
    regions' builds until the parent stopped it, and its measured call then stood
    beside a row saying the process timed out. It cancels them STOP_MARGIN_S
    before ``stop_by`` and says the work was cut."""
    import time

    from earth2studio_compile.tools.bench import calls

    spec = dict(slow_builds)
    spec |= {"workflow": "deterministic", "steps": 2, "members": 1, "batch_size": 1}
    spec |= {"io": "zarr-disk", "kind": "fresh", "run": "compiled", "way": "cold"}
    spec |= {"build": "wait", "stop_by": time.time() + calls.STOP_MARGIN_S + 60}
    (row,) = calls.run(spec, tmp_path / "out.json", tmp_path)
    assert row["report"]["regions"][0]["status"] == "building"
    assert row["background_cut"] is True
    assert "cancelled" in row["background"][-1], row["background"]
    assert row["background_wait_s"] < 70


def test_the_wait_for_builds_keeps_a_margin_before_the_limit():
    import time

    from earth2studio_compile.tools.bench.calls import STOP_MARGIN_S, wait_cap

    now = time.time()
    assert wait_cap(None, None) is None and wait_cap(5.0, None) == 5.0
    assert wait_cap(None, now + STOP_MARGIN_S + 10) == pytest.approx(10, abs=1)
    assert wait_cap(3.0, now + STOP_MARGIN_S + 10) == 3.0
    assert wait_cap(None, now) == 0.0


def test_second_calls_cancel_the_builds_they_started(tmp_path, slow_builds):
    """Second calls on empty caches start background builds; the child cancels them
    after its last call (else they compile beside the next rows and write into
    caches the parent removes)."""
    from earth2studio_compile.tools.bench import calls

    spec = dict(slow_builds)
    spec |= {"workflow": "deterministic", "steps": 1, "members": 1, "batch_size": 1}
    spec |= {"io": "memory-zarr", "kind": "second", "repeats": 1}
    eager, compiled = calls.run(spec, tmp_path / "out.json", tmp_path)
    assert compiled["report"]["regions"][0]["status"] == "building"
    said = compiled["background"][-1]
    assert "cancelled" in said, said
    assert "background" not in eager


def test_a_child_stopped_by_sigterm_cancels_its_background_build(
    background_on, monkeypatch, tmp_path
):
    """The parent stops a child past its timeout with SIGTERM: the child's entry
    point cancels its background build (which runs in a session of its own, out of
    the parent's reach), exits, and leaves SIGTERM's handler as it found it."""
    import os
    import signal
    import sys
    import time

    import pytest
    import torch
    from tiny_cores import TinyModel

    from earth2studio_compile import CompileSession
    from earth2studio_compile.artifacts import background, build_job
    from earth2studio_compile.tools.bench import calls

    monkeypatch.setattr(build_job, "CHILD", "import time; time.sleep(120)")
    model = TinyModel()
    with CompileSession(model, regions=["core"], probe=False):
        with torch.no_grad():
            model.core(torch.randn(4, 8))
    job = background.wait(timeout=2)[-1]  # launched as the session closed
    assert job.poll() == "running" and job.pid is not None

    def run(spec, out, tmp):  # the parent's SIGTERM, mid-row
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)

    monkeypatch.setattr(calls, "run", run)
    spec = json.dumps({"workdir": str(tmp_path)})
    monkeypatch.setattr(sys, "argv", ["calls", spec, str(tmp_path / "out.json")])

    def unhandled(signum, frame):  # rather than SIGTERM's default: end pytest
        raise AssertionError("the child's entry point left SIGTERM to the default")

    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        start = time.monotonic()
        with pytest.raises(SystemExit) as stopped:
            calls.main()
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, before)
        background.cancel()
    assert stopped.value.code == 128 + signal.SIGTERM
    assert time.monotonic() - start < 10  # the build ended on its SIGTERM
    assert job.poll() == "failed" and job.reason == "cancelled"
    with pytest.raises(ProcessLookupError):
        os.kill(job.pid, 0)  # gone, and reaped


def test_a_child_runs_with_the_switch_interval_it_was_given(tmp_path, monkeypatch):
    """--switch-interval reaches the child: its whole process runs with it; a spec
    without one leaves the process's own."""
    from earth2studio_compile.tools.bench import calls

    seen = []
    monkeypatch.setattr(calls, "run", lambda *a: seen.append(sys.getswitchinterval()))
    before = sys.getswitchinterval()
    try:
        for given in ({"switch_interval": 0.0002}, {}):
            sys.setswitchinterval(0.003)
            argv = ["calls", json.dumps({**given, "workdir": str(tmp_path)}), "out"]
            monkeypatch.setattr(sys, "argv", argv)
            calls.main()
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.0002), pytest.approx(0.003)]


def test_overlapped_rows_take_the_max_pending_they_were_given(tmp_path):
    """--max-pending reaches the overlapped rows' OverlappedIO; a spec without one
    keeps OverlappedIO's default; a row of another IO has none to set."""
    from earth2studio_compile import OverlappedIO
    from earth2studio_compile.tools.bench import calls

    model = _small_fcn()
    spec = {"workflow": "deterministic", "steps": 2, "io": "overlapped"}
    default = calls.make_call_io(spec, model, tmp_path / "a")
    given = calls.make_call_io(spec | {"max_pending": 7}, model, tmp_path / "b")
    plain = calls.make_call_io(
        spec | {"io": "zarr-disk", "max_pending": 7}, model, tmp_path / "c"
    )
    try:
        assert isinstance(given, OverlappedIO) and given.max_pending == 7
        own = inspect.signature(OverlappedIO).parameters["max_pending"].default
        assert default.max_pending == own
        assert not isinstance(plain, OverlappedIO)
    finally:
        default.close()
        given.close()


def test_an_overlapped_async_row_writes_through_overlappedio_into_asynczarr(tmp_path):
    """``overlapped-async``: our OverlappedIO around upstream's AsyncZarrBackend,
    eager and compiled (whether compile=True should wrap that backend too): the
    same store as upstream's eager call on the backend alone."""
    from earth2studio_compile.tools.bench import calls
    from earth2studio_compile.tools.bench.call_floor import store_bytes

    base = {"model": "fcn", "size": "small", "device": "cpu", "precision": "tf32"}
    det = base | {"workflow": "deterministic", "steps": 2, "members": 1}
    det |= {"batch_size": 1, "kind": "fresh"}
    spec = det | {"io": "async-zarr", "run": "eager"}
    (alone,) = calls.run(spec, tmp_path / "alone.json", tmp_path)
    assert alone["store_bytes"] > store_bytes(det, _small_fcn()) // 2
    for run in ("eager", "compiled"):
        spec = det | {"io": "overlapped-async", "run": run}
        (row,) = calls.run(spec, tmp_path / f"{run}.json", tmp_path)
        assert row["store_bytes"] == alone["store_bytes"], run
        assert row["max_pending"] == 2 and row["host_bytes"] > 0
    assert calls.OVERLAPPED["overlapped-async"] == "async-zarr"


def test_only_compiled_calls_run_under_the_attention_choice(tmp_path, monkeypatch):
    """--attention reaches a compiled call (the model's table entry changed around
    the workflow, as a user's register_model would), not upstream's eager one,
    and the entry is put back after."""
    import earth2studio.run
    import torch

    import earth2studio_compile.run
    from earth2studio_compile.models import lookup
    from earth2studio_compile.tools.bench import calls

    seen = []
    upstream = earth2studio.run.deterministic

    def ours(*args, compile, **kwargs):
        seen.append(("compiled", lookup(args[2])[1].attention_backends))
        return upstream(*args, **kwargs)

    def eager(*args, **kwargs):
        seen.append(("eager", lookup(args[2])[1].attention_backends))
        return upstream(*args, **kwargs)

    monkeypatch.setattr(earth2studio_compile.run, "deterministic", ours)
    monkeypatch.setattr(earth2studio.run, "deterministic", eager)
    model = _small_fcn()
    before = lookup(model)[1]
    spec = {"workflow": "deterministic", "steps": 1, "io": "memory-zarr"}
    spec |= {"model": "fcn", "precision": "fp32", "attention": ["flex", "math"]}
    for compiled in (False, True):
        calls.call(spec, model, torch.device("cpu"), tmp_path, compiled)
    assert seen == [
        ("eager", before.attention_backends),
        ("compiled", ("flex", "math")),
    ]
    assert lookup(model)[1] == before
