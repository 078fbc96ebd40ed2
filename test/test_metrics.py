"""The measures every figure is made of (earth2studio_compile.metrics): relative
L2, device-inclusive timing, laps that add up to the whole."""

from __future__ import annotations

import math

import pytest
import torch

from earth2studio_compile.metrics import Laps, rel_l2, timed, worst_rel_l2


def test_rel_l2_is_relative_and_handles_a_zero_reference():
    b = torch.tensor([3.0, 4.0])
    assert rel_l2(b, b) == 0.0
    assert rel_l2(b + torch.tensor([0.0, 0.5]), b) == pytest.approx(0.1)
    assert rel_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert math.isinf(rel_l2(torch.ones(2), torch.zeros(2)))
    # In float64: a float32 difference below float32's resolution of the norm counts.
    big = torch.full((4,), 1e8, dtype=torch.float32)
    assert rel_l2(big + 8.0, big) > 0.0


class _Clock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_timed_returns_the_output_and_the_seconds_between_its_clocks():
    out, seconds = timed(torch.device("cpu"), lambda: "done", _Clock(1.0, 3.5))
    assert (out, seconds) == ("done", 2.5)


def test_laps_add_up_to_the_whole_and_pieces_inside_a_lap_are_kept_apart():
    laps = Laps(_Clock(0.0, 1.0, 4.0, 4.5))
    assert laps.lap("setup") == 1.0
    assert laps.lap("compile", backend=2.0) == 3.0  # 1 s of it outside the backend
    assert laps.lap("setup") == 0.5  # a phase met again adds up
    assert laps.phases == {"setup": 1.5, "backend": 2.0, "compile": 1.0}
    assert laps.seconds == sum(laps.phases.values()) == 4.5


def test_a_child_attempt_merged_continues_the_laps():
    laps = Laps(_Clock(0.0, 1.0, 2.0, 5.0))
    laps.lap("setup")
    child = laps.child()  # starts at 1.0, where the parent stands
    child.lap("declined")
    child.lap("first_run")
    laps.merge(child)
    assert laps.phases == {"setup": 1.0, "declined": 1.0, "first_run": 3.0}
    assert laps.seconds == 5.0


def test_the_worst_variable_shows_what_the_whole_state_hides():
    """Geopotential near 1e5 beside humidity near 1e-3: a 10% error in humidity
    moves the whole state's relative L2 by about 1e-9; slice by slice it is 0.1."""
    b = torch.stack([torch.full((4, 8), 1e5), torch.full((4, 8), 1e-3)], dim=1)
    a = b.clone()
    a[:, 1] *= 1.1
    assert rel_l2(a, b) < 1e-8
    at, worst = worst_rel_l2(a, b, dim=1)
    assert at == 1 and worst == pytest.approx(0.1)
    assert worst_rel_l2(b, b, dim=1)[1] == 0.0
