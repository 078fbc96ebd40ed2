"""The zoo's data sources (earth2studio_compile.tools.zoo.data)."""

from __future__ import annotations

import numpy as np


def test_a_prefetched_source_answers_a_request_again_without_drawing():
    """The same request is answered from what was kept, a copy each time (a
    caller may change it); another request asks the source."""
    from earth2studio_compile.tools import zoo

    model = zoo.build("fcn", size="small")
    calls = []

    class Counted(zoo.SeededRandom):
        def __call__(self, time, variable):
            calls.append(len(variable))
            return super().__call__(time, variable)

    coords = model.input_coords()
    source = Counted({d: coords[d] for d in ("lat", "lon")})
    data = zoo.Prefetched(source)
    time = [np.datetime64("2024-01-01T00")]
    first = data(time, ["t2m", "u10m"])
    again = data(time, np.array(["t2m", "u10m"]))
    assert calls == [2]
    assert np.array_equal(first.values, again.values)
    again[:] = 0
    assert np.array_equal(data(time, ["t2m", "u10m"]).values, first.values)
    assert np.array_equal(data(time, ["t2m"]).values, first.values[:, :1])
    assert calls == [2, 1]


def test_a_prefetched_row_fetches_without_drawing_during_the_call():
    """The bench's prefetched source is asked, before the clock, for exactly
    what the workflow fetches: the workflow's fetch draws nothing."""
    from earth2studio.data import fetch_data
    from earth2studio.utils.time import to_time_array

    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.calls import call_source
    from earth2studio_compile.tools.bench.runs import TIME

    for name in ("fcn", "dlwp"):  # DLWP: two input lead times
        model = zoo.build(name, size="small")
        data = call_source({"source": "prefetched"}, model, TIME)
        drawn = []
        data.source = lambda time, variable: drawn.append(1)  # a draw would fail
        ic = model.input_coords()
        x, _ = fetch_data(
            data, to_time_array([str(TIME)]), ic["variable"], ic["lead_time"]
        )
        assert not drawn and x.shape[-2:] == (len(ic["lat"]), len(ic["lon"]))
    assert isinstance(call_source({}, model, TIME), zoo.SeededRandom)
