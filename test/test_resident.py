"""Compiled code kept in the process: a later session over the same core compiles
nothing, never runs code made for other weights or another structure, and keeps no
model alive that its user dropped."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import assert_unchanged, eager_backend, run_workflow, snapshot

from earth2studio_compile import CompileSession, accuracy, resident, run
from earth2studio_compile.executors import DynamoExecutor
from earth2studio_compile.tools import zoo


@pytest.fixture(autouse=True)
def empty_shelf():
    resident.release()
    yield
    resident.release()


@pytest.fixture
def compiles(monkeypatch):
    """How many times a region built a torch.compile wrapper (traced anew): the
    Dynamo executor builds one each time it is made."""
    made = []
    real = DynamoExecutor.__init__

    def counting(self, target):
        made.append(target.report.label)
        real(self, target)

    monkeypatch.setattr(DynamoExecutor, "__init__", counting)
    return made


def _session(model, inputs, **kwargs):
    with CompileSession(model, **kwargs) as session, torch.no_grad():
        outs = [model.model(x) for x in inputs]
    return session.report.regions[0], outs


def _inputs(n=4, batch=2):
    torch.manual_seed(0)
    return [torch.randn(batch, 4, 16, 32) for _ in range(n)]


def test_a_second_session_compiles_nothing_and_matches_eager(compiles):
    model = zoo.build("toy")
    before = snapshot(model)
    inputs = _inputs()
    with torch.no_grad():
        expected = [model.model(x) for x in inputs]
    first, _ = _session(model, inputs)
    assert_unchanged(model, before)
    second, outs = _session(model, inputs)
    assert_unchanged(model, before)
    assert compiles == ["GridPrognostic.model"], "the second session traced again"
    assert first.reused is None and first.compile_seconds > 0
    assert second.status == "compiled" and second.reused is not None
    assert second.compile_seconds == 0.0 and second.recompiles == 0
    assert second.graphs == first.graphs == 1
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert resident.kept_count() == 1


def test_the_summary_says_the_code_was_ready():
    model = zoo.build("toy")
    _session(model, _inputs(), backend=eager_backend)
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        model.model(_inputs(1)[0])
    text = session.report.summary()
    assert "ready: compiled earlier in this process" in text, text
    assert "session 2" in text and "pays for its compile" not in text, text


@pytest.mark.parametrize(
    "change",
    ["in-place update", "load_state_dict", "new parameter", "train mode"],
)
def test_changed_weights_or_structure_are_compiled_again(change, compiles):
    model = zoo.build("toy")
    inputs = _inputs(2)
    _session(model, inputs, backend=eager_backend)
    weight = next(model.model.parameters())
    with torch.no_grad():
        if change == "in-place update":
            weight.add_(1.0)
        elif change == "load_state_dict":
            state = {k: v + 1.0 for k, v in model.model.state_dict().items()}
            model.model.load_state_dict(state)
        elif change == "new parameter":
            first = next(model.model.named_parameters())[0]
            owner, _, name = first.rpartition(".")
            setattr(
                model.model.get_submodule(owner),
                name,
                torch.nn.Parameter(weight.detach() * 2.0),
            )
        else:
            model.model.train()
    with torch.no_grad():
        expected = [model.model(x) for x in inputs]
    report, outs = _session(model, inputs, backend=eager_backend)
    assert len(compiles) == 2, f"kept code ran after a {change}"
    assert report.reused is None
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref)


def test_other_settings_do_not_share_code(compiles):
    model = zoo.build("toy")
    inputs = _inputs(2)
    _session(model, inputs, backend=eager_backend)
    report, _ = _session(model, inputs, backend=eager_backend, precision="bf16")
    assert report.reused is None and len(compiles) == 2
    report, _ = _session(model, inputs, backend=eager_backend, precision="bf16")
    assert report.reused is not None and len(compiles) == 2


def test_the_accuracy_check_runs_once_per_model_and_settings(monkeypatch):
    references = []
    real = accuracy.Reference.before

    def counting(*args, **kwargs):
        references.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(accuracy.Reference, "before", counting)
    model = zoo.build("toy")
    first, _ = _session(model, _inputs(2), backend=eager_backend, precision="bf16")
    second, _ = _session(model, _inputs(2), backend=eager_backend, precision="bf16")
    # The first session's two: bf16's cost against fp32 eager, and the compiled
    # call's check against eager in bf16. The second session takes neither.
    assert len(references) == 2
    assert first.precision_error is not None
    assert second.precision_error == first.precision_error


def test_the_speed_probe_runs_once_per_model_and_settings(monkeypatch, same_speed):
    from earth2studio_compile.probe import SpeedProbe

    timed = []
    real = SpeedProbe.time

    def counting(self, kind, *args, **kwargs):
        timed.append(kind)
        return real(self, kind, *args, **kwargs)

    monkeypatch.setattr(SpeedProbe, "time", counting)
    model = zoo.build("toy")
    first, _ = _session(model, _inputs(12), backend=eager_backend)
    assert first.compiled_ms is not None and "eager" in timed
    timed.clear()
    second, _ = _session(model, _inputs(12), backend=eager_backend)
    assert second.compiled_ms == first.compiled_ms
    assert timed == [], "the probe timed calls again"


def test_a_dropped_model_is_freed_with_its_kept_code():
    model = zoo.build("toy")
    _session(model, _inputs(2))
    assert resident.kept_count() == 1
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None, "kept compiled code keeps the user's model alive"
    assert resident.kept_count() == 0


def test_release_drops_the_kept_code(compiles):
    model = zoo.build("toy")
    _session(model, _inputs(2), backend=eager_backend)
    assert resident.release(model) == 1
    report, _ = _session(model, _inputs(2), backend=eager_backend)
    assert report.reused is None and len(compiles) == 2


def test_an_interrupted_session_keeps_nothing():
    model = zoo.build("toy")
    with pytest.raises(KeyboardInterrupt):
        with CompileSession(model, backend=eager_backend), torch.no_grad():
            model.model(_inputs(1)[0])
            raise KeyboardInterrupt
    assert resident.kept_count() == 0


def test_a_second_workflow_call_reuses_the_compiled_core(compiles):
    model = zoo.build("fcn")
    eager = run_workflow(run.deterministic, "deterministic", model, nsteps=3)
    for _ in range(2):
        got = run_workflow(
            run.deterministic, "deterministic", model, nsteps=3, compile=True
        )
        for name, ref in eager.items():
            torch.testing.assert_close(got[name], ref, rtol=1e-4, atol=1e-4)
    report = run.last_report()
    region = next(r for r in report.regions if r.region == "model")
    assert region.reused is not None, report.summary()
    assert compiles == ["FCN16x32.model"]
