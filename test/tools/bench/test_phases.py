"""Where a workflow's thread spends a call (earth2studio_compile.tools.bench.phases):
upstream's calls timed in wall and CPU seconds, the first step's parts, everything
put back after."""

from __future__ import annotations

import time

import pytest


class _Model:
    def to(self, device):
        return self

    def create_iterator(self, x, coords):
        for step in range(3):
            sum(range(20_000))  # CPU work: counted in both
            yield x + step, coords


class _IO:
    def add_array(self, coords, name):
        pass

    def write(self, x, coords, name):
        time.sleep(0.02)  # waiting: wall time, hardly any CPU


def test_phases_time_the_workflow_threads_calls_in_wall_and_cpu_seconds():
    import earth2studio.run as upstream

    from earth2studio_compile.tools.bench.phases import FIRST_STEP, thread_phases

    model, io = _Model(), _IO()
    fetch = upstream.fetch_data
    with thread_phases(model, io, None) as phases:
        model.to("cpu")
        io.add_array({}, "a")
        for x, coords in model.create_iterator(0, {}):
            io.write(x, coords, "a")
    assert len(phases.writes) == 3 and len(phases.each_write) == 3
    spent, cpu = phases.spent, phases.cpu
    assert spent["write_s"] >= 0.06 and cpu["write_s"] < spent["write_s"] / 2
    assert 0 < cpu["iterator_s"] <= spent["iterator_s"] + 0.01
    assert list(phases.first) == list(FIRST_STEP)
    # Write 0 (the initial state's) is the first step's; write 1 ends it.
    assert phases.first["write"] == pytest.approx(sum(phases.each_write[:1]))
    assert phases.perturbation is None
    # Put back: the classes' methods and upstream's functions again.
    assert "create_iterator" not in vars(model) and "write" not in vars(io)
    assert upstream.fetch_data is fetch
