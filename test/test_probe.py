"""The speed probe (earth2studio_compile.probe): eager and compiled calls
interleaved after the first steps, timed, and a verdict only where their ranges
say so; one WARNING when compiled is slower, none in short sessions.
"""

from __future__ import annotations

import pytest
import torch
from conftest import eager_backend, messages

from earth2studio_compile import CompileSession
from earth2studio_compile.tools import zoo


def test_speed_probe_can_be_turned_off():
    core = zoo.ToyCore(4, 8).eval()
    x = torch.randn(2, 4, 8, 8)
    with CompileSession(core, regions=("net",), backend=eager_backend) as on:
        with torch.no_grad():
            for _ in range(8):
                core.net(x)
    with CompileSession(
        core, regions=("net",), backend=eager_backend, probe=False
    ) as off:
        with torch.no_grad():
            for _ in range(8):
                core.net(x)
    assert on.report.regions[0].eager_ms is not None
    assert on.report.regions[0].compiled_ms is not None
    assert off.report.regions[0].eager_ms is None
    assert off.report.regions[0].compiled_ms is None
    with pytest.raises(TypeError, match="probe"):
        CompileSession(core, probe="no")


def test_warns_when_compiled_is_slower_than_eager(logs):
    import time

    def slow_backend(gm, example_inputs):
        def run(*args):
            time.sleep(0.05)  # a compiled region that loses to eager
            return gm.forward(*args)

        return run

    model = zoo.build("toy")
    x = torch.randn(1, 4, 16, 32)
    with torch.no_grad():
        expected = model.model(x)
    with CompileSession(model, backend=slow_backend) as session, torch.no_grad():
        outs = [model.model(x) for _ in range(8)]
    region = session.report.regions[0]
    assert region.status == "compiled" and region.eager_calls == 0
    assert region.compiled_ms >= 50 and region.eager_ms < region.compiled_ms
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    slow = [m for m in messages(logs, "WARNING") if "runs slower compiled" in m]
    assert len(slow) == 1 and "compile=False" in slow[0]


def _probe_with(monkeypatch, seconds: list[float]):
    """A toy session of 8 calls whose probe reads ``seconds`` for calls 3 to 8
    (compiled and eager in turn) off an injected clock."""
    from earth2studio_compile.region import SpeedProbe

    now, durations, reads = [0.0], list(seconds), [0]

    def clock() -> float:
        reads[0] += 1
        if reads[0] % 2 == 0:  # each probe's second reading: its end
            now[0] += durations.pop(0)
        return now[0]

    monkeypatch.setattr(SpeedProbe, "clock", staticmethod(clock))
    model = zoo.build("toy")
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        for _ in range(8):
            model.model(torch.randn(1, 4, 16, 32))
    assert not durations
    return session.report


@pytest.mark.parametrize(
    "seconds, slower",
    [
        # One slow compiled call among noise: the ranges overlap.
        ([0.050, 0.010, 0.011, 0.012, 0.010, 0.011], False),
        # Every compiled call slower than every eager one.
        ([0.020, 0.010, 0.021, 0.012, 0.022, 0.011], True),
    ],
)
def test_speed_verdict_rests_on_interleaved_calls_and_their_ranges(
    monkeypatch, logs, seconds, slower
):
    report = _probe_with(monkeypatch, seconds)
    region = report.regions[0]
    assert region.compiled_ms == pytest.approx(1e3 * sorted(seconds[0::2])[1])
    assert region.eager_ms == pytest.approx(1e3 * sorted(seconds[1::2])[1])
    warned = [m for m in messages(logs, "WARNING") if "runs slower compiled" in m]
    assert len(warned) == int(slower)
    summary = report.summary()
    assert ("no measurable difference" in summary) is not slower
    assert f"({1e3 * min(seconds[0::2]):.2f}-{1e3 * max(seconds[0::2]):.2f})" in summary


def test_no_speed_verdict_in_short_sessions():
    model = zoo.build("toy")
    with CompileSession(model, backend=eager_backend) as session, torch.no_grad():
        for _ in range(5):
            model.model(torch.randn(1, 4, 16, 32))
    region = session.report.regions[0]
    assert region.compiled_ms is None and region.eager_ms is None
