"""The three workflows: upstream's signatures plus ``compile``; compiled equals eager.

Tolerance: compiled and eager fp32 rollouts are compared on the same coordinates
with relative L2 <= 1e-5 per variable and elementwise
``|compiled - eager| <= 1e-4 + 1e-4 |eager|``. Inductor fuses and reorders fp32
arithmetic (FMA contraction, different reduction order in LayerNorm/matmul), which
moves results by a few ulp (fp32 eps = 1.2e-7) per operation; over a few
autoregressive steps of a randomly initialised network this stays around 1e-6
relative (measured: FCN 2e-6 max abs, DLWP 6e-8). A broken compile, a lost step or
an overwritten buffer gives O(1) differences, far outside these bounds.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict

import earth2studio.run as upstream
import pytest
import torch
from conftest import assert_unchanged, messages, run_workflow, snapshot

from earth2studio_compile import run
from earth2studio_compile.metrics import rel_l2
from earth2studio_compile.tools import zoo

WORKFLOWS = ["deterministic", "diagnostic", "ensemble"]
MODELS = ["fcn", "dlwp", "persistence", "toy"]
REL_L2 = 1e-5


def assert_close(compiled: dict, eager: dict) -> None:
    assert compiled.keys() == eager.keys() and eager
    for name, ref in eager.items():
        out = compiled[name]
        assert out.shape == ref.shape, name
        assert torch.isfinite(out).all(), name
        assert rel_l2(out, ref) <= REL_L2, f"{name}: rel L2 {rel_l2(out, ref):.2e}"
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("name", WORKFLOWS)
def test_signature_is_upstreams_plus_compile(name):
    ours = inspect.signature(getattr(run, name))
    theirs = inspect.signature(getattr(upstream, name))
    params = list(ours.parameters.values())
    assert params[:-1] == list(theirs.parameters.values())
    last = params[-1]
    assert (last.name, last.default, last.kind) == (
        "compile",
        False,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
    assert "compile : bool" in getattr(run, name).__doc__


@pytest.mark.parametrize("kind", WORKFLOWS)
def test_compile_false_is_byte_identical_to_upstream(kind):
    model = zoo.build("fcn")
    ours = run_workflow(getattr(run, kind), kind, model, compile=False)
    theirs = run_workflow(getattr(upstream, kind), kind, model)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("kind", WORKFLOWS)
def test_compiled_rollout_matches_eager(kind, name, logs):
    model = zoo.build(name)
    before = snapshot(model)
    nsteps = 4 if name == "dlwp" else 2  # DLWP predicts two 6 h steps per call
    eager = run_workflow(getattr(run, kind), kind, model, nsteps=nsteps)
    compiled = run_workflow(
        getattr(run, kind), kind, model, nsteps=nsteps, compile=True
    )
    assert_close(compiled, eager)
    assert_unchanged(model, before)

    report = run.last_report()
    assert not report.fell_back, report.summary()
    assert not messages(logs, "WARNING"), messages(logs, "WARNING")
    regions = [r for r in report.regions if r.model == type(model).__name__]
    if name == "persistence":
        assert [r.status for r in regions] == ["skipped"]
        assert "no network" in regions[0].reason
        return
    (region,) = regions
    assert region.status == "compiled" and region.graph_breaks == 0
    assert region.calls >= 2  # the rollout really went through the compiled core
    if kind == "ensemble" and name in ("fcn", "dlwp"):
        # 3 members in batches of 2: the last batch is padded, not recompiled
        assert region.recompiles == 0 and region.padded_calls > 0
    elif kind == "ensemble":
        assert region.recompiles <= 1  # generic path: one recompile, never a storm
    else:
        assert region.recompiles == 0


def test_injected_inductor_failure_in_a_workflow(logs, monkeypatch):
    import torch._inductor.compile_fx as compile_fx

    def broken(*args, **kwargs):
        raise RuntimeError("injected Inductor failure")

    model = zoo.build("toy")
    eager = run_workflow(run.deterministic, "deterministic", model)
    monkeypatch.setattr(compile_fx, "compile_fx", broken)
    compiled = run_workflow(run.deterministic, "deterministic", model, compile=True)
    for name in eager:
        assert torch.equal(compiled[name], eager[name]), name  # eager re-run: exact
    warnings = messages(logs, "WARNING")
    assert len(warnings) == 1 and "injected Inductor failure" in warnings[0]
    assert run.last_report().fell_back


def test_diagnostic_model_with_a_network_is_compiled_too():
    from earth2studio.io import KVBackend

    class Scale(torch.nn.Module):
        """A user diagnostic: a 1x1 conv over the prognostic's variables."""

        def __init__(self, prognostic):
            super().__init__()
            self.coords = prognostic.input_coords()
            self.net = torch.nn.Conv2d(4, 4, 1)

        def input_coords(self):
            return self.coords.copy()

        def output_coords(self, input_coords):
            return input_coords.copy()

        @torch.inference_mode()
        def __call__(self, x, coords):
            shape = x.shape
            return self.net(x.reshape(-1, *shape[-3:])).reshape(shape), coords

    model = zoo.build("toy")
    torch.manual_seed(0)
    diag = Scale(model)

    def once(compile):
        import numpy as np

        np.random.seed(0)
        io = KVBackend()
        run.diagnostic(
            ["2024-01-01"],
            2,
            model,
            diag,
            zoo.random_source(model),
            io,
            device=torch.device("cpu"),
            verbose=False,
            compile=compile,
        )
        return {k: v.clone() for k, v in io.root.items()}

    eager, compiled = once(False), once(True)
    assert_close(compiled, eager)
    labels = {r.label: r.status for r in run.last_report().regions}
    assert labels == {"GridPrognostic.model": "compiled", "Scale.net": "compiled"}


@pytest.mark.parametrize(
    "name, batch_size",
    [("fcn", 3), ("fcn", 2), ("dlwp", 2)],
    ids=["fcn-divides", "fcn-padded", "dlwp-padded"],
)
def test_compiled_ensemble_equals_eager_member_by_member(name, batch_size):
    """3 members, a few variables selected with ``output_coords`` and written to a
    Zarr store: each member compiled (fp32) equals the same member eager, from the
    same seeded data and ``Gaussian`` perturbation; a batch size of 2 leaves a
    padded last batch of 1. (Batch shapes of the other ensemble tests: the compile
    cache serves them.)"""
    from collections import OrderedDict

    import numpy as np
    from earth2studio.io import ZarrBackend
    from earth2studio.perturbation import Gaussian

    model = zoo.build(name)
    nsteps, nensemble = 2, 3
    variables = [str(v) for v in model.input_coords()["variable"]][:2]

    def once(compile):
        np.random.seed(0)
        torch.manual_seed(0)
        io = ZarrBackend()
        run.ensemble(
            ["2024-01-01"],
            nsteps,
            nensemble,
            model,
            zoo.random_source(model),
            io,
            Gaussian(noise_amplitude=0.05, seed=0),
            batch_size=batch_size,
            output_coords=OrderedDict({"variable": np.array(variables)}),
            device=torch.device("cpu"),
            verbose=False,
            compile=compile,
        )
        return {v: torch.as_tensor(np.asarray(io.root[v][:])) for v in variables}

    eager = once(False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EARTH2STUDIO_COMPILE_PRECISION", "fp32")
        compiled = once(True)
    assert sorted(eager) == variables
    for v in variables:
        assert eager[v].shape[:3] == (nensemble, 1, nsteps + 1), v
        for member in range(nensemble):
            assert_close({v: compiled[v][member]}, {v: eager[v][member]})
    (region,) = run.last_report().regions
    assert region.status == "compiled" and region.recompiles == 0
    assert region.precision == "fp32"
    assert (region.padded_calls > 0) == (nensemble % batch_size != 0)


def test_last_report_is_the_calling_threads_own():
    import threading

    seen: dict[str, list] = {"a": [], "b": []}
    a_ran, b_ran = threading.Event(), threading.Event()

    def worker(name: str, wait_for: threading.Event | None, done: threading.Event):
        # One after the other (no two compiles at once), each reading its report
        # again after the other thread's call.
        if wait_for is not None:
            wait_for.wait(timeout=600)
        run_workflow(run.deterministic, "deterministic", zoo.build("toy"), compile=True)
        seen[name].append(run.last_report())
        done.set()
        if name == "a":
            b_ran.wait(timeout=600)
        seen[name].append(run.last_report())

    threads = [
        threading.Thread(target=worker, args=("a", None, a_ran)),
        threading.Thread(target=worker, args=("b", a_ran, b_ran)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a1, a2), (b1, b2) = seen["a"], seen["b"]
    assert a1 is not None and b1 is not None and a1 is not b1
    assert a2 is a1 and b2 is b1


def test_last_report_keeps_the_latest_compiled_call():
    """compile=False calls have nothing to report and leave the report alone."""
    model = zoo.build("toy")
    assert run_in_fresh_context(lambda: run.last_report()) is None
    run_workflow(run.deterministic, "deterministic", model, compile=True)
    compiled = run.last_report()
    assert compiled is not None and compiled.regions
    run_workflow(run.deterministic, "deterministic", model, compile=False)
    assert run.last_report() is compiled
    run_workflow(run.deterministic, "deterministic", model, compile=True)
    assert run.last_report() is not compiled


def run_in_fresh_context(fn):
    import contextvars

    return contextvars.Context().run(fn)


def _upstream_error(name: str, args: tuple, kwargs: dict) -> str:
    with pytest.raises(TypeError) as err:
        getattr(upstream, name)(*args, **kwargs)
    return str(err.value)


def _our_error(name: str, args: tuple, kwargs: dict) -> str:
    with pytest.raises(TypeError) as err:
        getattr(run, name)(*args, **kwargs)
    return str(err.value)


# Wrong calls, by workflow: (arguments, keyword arguments). None of them runs
# anything, so plain placeholders do for the models and data.
REQUIRED = {"deterministic": 5, "diagnostic": 6, "ensemble": 7}


@pytest.mark.parametrize("name", WORKFLOWS)
@pytest.mark.parametrize(
    "wrong", ["unknown keyword", "missing positional", "duplicate value"]
)
def test_a_wrong_call_says_what_upstream_says(name, wrong):
    required = tuple(range(REQUIRED[name]))
    call = {
        "unknown keyword": (required, {"compiled": True}),
        "missing positional": (required[:2], {}),
        "duplicate value": (required, {"time": 1}),
    }[wrong]
    theirs = _upstream_error(name, *call)
    ours = _our_error(name, *call)
    assert ours.startswith(f"{name}() ")
    if wrong == "unknown keyword":
        assert ours == f"{theirs}. Did you mean 'compile'?"
    else:
        assert ours == theirs


@pytest.mark.parametrize("name", WORKFLOWS)
def test_too_many_positionals_count_compile_too(name):
    theirs = _upstream_error(name, tuple(range(20)), {})
    ours = _our_error(name, tuple(range(20)), {})
    # Upstream's range plus one: compile may be passed positionally.
    low, high = (int(n) for n in theirs.split("takes from ")[1].split()[0:3:2])
    assert ours == (
        f"{name}() takes from {low} to {high + 1} positional arguments but 20 were "
        "given"
    )


def test_a_misspelt_upstream_keyword_is_named_with_its_fix():
    args = (["2024-01-01"], 2)
    theirs = _upstream_error("ensemble", args, {"n_ensemble": 3})
    ours = _our_error("ensemble", args, {"n_ensemble": 3})
    assert theirs == "ensemble() got an unexpected keyword argument 'n_ensemble'"
    assert ours == f"{theirs}. Did you mean 'nensemble'?"
    far = _our_error("ensemble", args, {"zzzz": 3})
    assert far == "ensemble() got an unexpected keyword argument 'zzzz'"


def test_a_build_launched_as_the_session_closes_waits_for_the_writers(
    background_on, monkeypatch
):
    """A short run's build is launched as its session closes, which is before
    OverlappedIO has written the last steps: the build's copy and save of the
    weights (300 MB for FCN) start once the writes are done, off the call's clock."""
    from earth2studio_compile.artifacts import background
    from earth2studio_compile.io import OverlappedIO

    events: list[str] = []

    class Job:  # a build that never ends, launched by the session's close
        waiting = True

        def launch(self) -> None:
            if self.waiting:
                events.append("launched")
            self.waiting = False

        def poll(self) -> str:
            return "running"

        def describe(self) -> str:
            return "to be built in the background"

    monkeypatch.setattr(background, "start", lambda *a, **k: Job())
    flush = OverlappedIO.flush

    def flushed(self):
        flush(self)
        events.append("written")

    monkeypatch.setattr(OverlappedIO, "flush", flushed)
    model = zoo.build("toy")
    run_workflow(run.deterministic, "deterministic", model, overlap=True, compile=True)
    assert run.last_report().regions[0].status == "building"
    assert "written" in events and events[-1] == "launched", events


def test_builds_held_back_are_launched_when_the_block_raises():
    from earth2studio_compile.artifacts import background

    launched: list[int] = []

    class Job:
        def launch(self) -> None:
            launched.append(1)

    with pytest.raises(KeyError), background.deferred():
        background.launch_later(Job())
        assert not launched  # held back
        raise KeyError("the workflow failed")
    assert launched == [1]
    background.launch_later(Job())  # outside a block: at once
    assert launched == [1, 1]


def _zarr_rollout(io=None, nsteps: int = 3, read: bool = True):
    """A toy deterministic rollout with compile=True into ``io`` (a fresh in-memory
    ZarrBackend by default), from seeded data; the io the workflow returned and the
    stored arrays (none where not ``read``)."""
    import numpy as np
    from earth2studio.io import ZarrBackend

    model = zoo.build("toy")
    np.random.seed(0)
    torch.manual_seed(0)
    io = ZarrBackend() if io is None else io
    returned = run.deterministic(
        ["2024-01-01"],
        nsteps,
        model,
        zoo.random_source(model),
        io,
        device=torch.device("cpu"),
        verbose=False,
        compile=True,
    )
    if not read:  # a backend the caller reads once it is closed
        return returned, {}
    names = [str(v) for v in model.output_coords(model.input_coords())["variable"]]
    return returned, {v: np.asarray(io.root[v][:]) for v in names}


def test_compile_true_overlaps_a_zarr_backends_writes_and_returns_it(logs, monkeypatch):
    """With compile=True a ZarrBackend is written through OverlappedIO for the call
    (its writes bound a compiled call: 4.7-11.6x faster with it on an H100): every
    array stored from a writer's thread, the same bytes as the same compiled call
    writing synchronously, the caller's backend returned, written whole."""
    import threading

    import numpy as np
    from earth2studio.io import ZarrBackend

    from earth2studio_compile.io import zarr_writer

    threads: list[str] = []
    store = zarr_writer.store_by_chunk

    async def watched(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return await store(*args, **kwargs)

    monkeypatch.setattr(zarr_writer, "store_by_chunk", watched)
    given = ZarrBackend()
    returned, overlapped = _zarr_rollout(given)
    assert returned is given
    assert threads and all(n.startswith("OverlappedIO") for n in threads)
    infos = [m for m in messages(logs, "INFO") if "writes overlap" in m]
    assert len(infos) == 1 and "ZarrBackend" in infos[0]
    monkeypatch.setattr(run, "for_compiled_call", lambda io: None)
    threads.clear()
    _, synchronous = _zarr_rollout()
    assert threads == []
    assert overlapped.keys() == synchronous.keys() and overlapped
    for name, value in synchronous.items():
        np.testing.assert_array_equal(overlapped[name], value, err_msg=name)


def test_compile_true_overlaps_an_async_zarr_backends_writes(
    tmp_path, logs, monkeypatch
):
    """With compile=True an AsyncZarrBackend is written through OverlappedIO, by one
    worker (an FCN ensemble on an H200: 5.46 s against 6.41 without it): the same
    values as the same compiled call on the backend alone, the caller's backend
    returned, each write called from the worker's thread."""
    import threading

    import numpy as np
    import zarr
    from earth2studio.io import AsyncZarrBackend

    nsteps = 3
    parallel = OrderedDict(
        time=np.array([np.datetime64("2024-01-01")]),
        lead_time=np.array([np.timedelta64(6 * i, "h") for i in range(nsteps + 1)]),
    )
    threads: list[str] = []
    write = AsyncZarrBackend.write

    def watched(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(AsyncZarrBackend, "write", watched)

    def stored(name: str) -> tuple[object, dict]:
        io = AsyncZarrBackend(str(tmp_path / name), parallel, blocking=False)
        returned, _ = _zarr_rollout(io, nsteps=nsteps, read=False)
        io.close()
        root = zarr.open_group(str(tmp_path / name), mode="r")
        fields = {k: np.asarray(root[k][:]) for k in root.array_keys()}
        return returned is io, fields

    given, overlapped = stored("a.zarr")
    assert given
    assert len(threads) == nsteps + 1
    assert all(n.startswith("OverlappedIO") for n in threads), threads
    infos = [m for m in messages(logs, "INFO") if "writes overlap" in m]
    assert len(infos) == 1 and "AsyncZarrBackend" in infos[0]
    assert "(OverlappedIO, 1 worker)" in infos[0]
    monkeypatch.setattr(run, "for_compiled_call", lambda io: None)
    threads.clear()
    _, direct = stored("b.zarr")
    assert threads and not any(n.startswith("OverlappedIO") for n in threads)
    assert overlapped.keys() == direct.keys()
    assert any(v.ndim == 4 for v in direct.values())
    for name, value in direct.items():
        np.testing.assert_array_equal(overlapped[name], value, err_msg=name)


def test_a_failed_write_of_an_overlapped_call_is_raised_after_the_steps_before(
    monkeypatch,
):
    """A ZarrBackend that fails at its third step's store under compile=True: the
    workflow raises that error, as upstream's synchronous call would, and the steps
    before it are stored."""
    import numpy as np
    from earth2studio.io import ZarrBackend

    from earth2studio_compile.io import zarr_writer

    stores: list[int] = []
    store = zarr_writer.store_by_chunk

    async def failing(array, selection, *args, **kwargs):
        step = selection[1].start  # the lead time
        if step == 2:
            raise OSError("disk full")
        stores.append(step)
        return await store(array, selection, *args, **kwargs)

    monkeypatch.setattr(zarr_writer, "store_by_chunk", failing)
    io = ZarrBackend()
    with pytest.raises(OSError, match="disk full"):
        _zarr_rollout(io, nsteps=4)
    fields = [io.root[k] for k in io.root.array_keys() if io.root[k].ndim == 4]
    assert fields and {0, 1} <= set(stores)
    for field in fields:  # time, lead time, lat, lon: the first two lead times
        assert np.isfinite(np.asarray(field[:, :2])).all(), field.name


@pytest.mark.parametrize(
    ("arguments", "steps"),
    [
        ({"nsteps": 20}, 20),
        ({"nsteps": 20, "nensemble": 16, "batch_size": 8}, 40),
        ({"nsteps": 20, "nensemble": 10, "batch_size": 4}, 60),  # uneven last batch
        ({"nsteps": 20, "nensemble": 16}, 20),  # one batch of every member
        ({"nsteps": 0}, None),
        ({}, None),
    ],
)
def test_the_model_steps_of_a_workflow_call(arguments, steps):
    assert run._model_steps(arguments) == steps


def test_a_compiled_ensemble_tells_its_session_its_model_steps(monkeypatch):
    """What the session's regions weigh a compile against (artifacts/payoff.py):
    3 steps of 3 members in batches of 2, so 6 model steps."""
    from earth2studio_compile import CompileSession

    told: list[int] = []
    monkeypatch.setattr(CompileSession, "expect", lambda self, n: told.append(n))
    run_workflow(run.ensemble, "ensemble", zoo.build("toy"), nsteps=3, compile=True)
    assert told == [6]
