"""The end-to-end rows and table (earth2studio_compile.tools.bench.e2e)."""

from __future__ import annotations

import pytest

from earth2studio_compile.tools.bench import __main__ as cli
from earth2studio_compile.tools.bench.e2e import SETUP, STEP, _derive_rows, e2e_table


def test_tables_render_errors_and_figures():
    rows = [
        {
            "model": "fcn",
            "mode": "eager",
            "first_step_s": 0.4,
            "steady_ms": 62.0,
            "report": None,
        },
        {"model": "fcn", "mode": "auto", "error": "timed out after 9 s"},
    ]
    text = cli.table(rows)
    assert "62.00" in text and "error: timed out" in text
    # runs with TF32 off are another comparison, and say so
    fp32 = cli.table([rows[0] | {"fp32": True}])
    assert "fcn fp32" in fp32 and "fcn fp32" not in text
    b = {f"{p}_ms": 1.0 for p in STEP} | {f"{p}_s": 0.1 for p in SETUP}
    b |= {"setup_s": 0.5, "tail_s": 0.1, "wall_s": 6.5}
    r = {
        "breakdown": {"eager": b | {"model_ms": 60.0}, "compiled": b},
        "rows": [
            {"run": "eager", "model_run": "eager", "wall_s": 6.5},
            {"run": "compiled+overlap", "model_run": "compiled", "wall_s": 3.7},
        ],
    }
    _derive_rows(r, nsteps=20)
    text = e2e_table("fcn", {"nsteps": 20, "backends": {"zarr": r}})
    assert "6.50" in text and "3.70" in text and "zarr" in text and "1.76" in text
    # The floor: set-up plus 20 compiled model steps, for eager rows too.
    assert r["rows"][1]["floor_s"] == pytest.approx(0.5 + 20 * 1e-3)
    assert r["rows"][0]["floor_ratio"] == pytest.approx(6.5 / 0.52)


def test_e2e_breakdown_attributes_the_time_outside_the_model(monkeypatch, tmp_path):
    """A slow split_coords, data source and progress bar each show in their own
    column, not in the unattributed rest of the loop."""
    import time

    import earth2studio.run as upstream
    import torch

    from earth2studio_compile.tools import zoo
    from earth2studio_compile.tools.bench.e2e import breakdown

    delay, nsteps = 0.05, 3
    split, fetch, tqdm = upstream.split_coords, upstream.fetch_data, upstream.tqdm

    def slow(fn):
        def wrapper(*args, **kwargs):
            time.sleep(delay)
            return fn(*args, **kwargs)

        return wrapper

    class SlowBar(tqdm):
        def update(self, n=1):
            time.sleep(delay)
            return super().update(n)

    slow_split = slow(split)
    monkeypatch.setattr(upstream, "split_coords", slow_split)
    monkeypatch.setattr(upstream, "fetch_data", slow(fetch))
    monkeypatch.setattr(upstream, "tqdm", SlowBar)
    model = zoo.build("persistence")
    b = breakdown(model, "zarr", nsteps, torch.device("cpu"), tmp_path)
    # N + 1 writes (the initial state too) over N steps.
    per_step = 1e3 * delay * (nsteps + 1) / nsteps
    assert b["split_coords_ms"] >= per_step and b["progress_ms"] >= per_step
    assert b["data_s"] >= delay and b["setup_s"] >= b["data_s"] + b["add_array_s"]
    assert b["loop_ms"] < 1e3 * delay
    total = b["setup_s"] + nsteps * sum(b[f"{p}_ms"] for p in STEP) / 1e3 + b["tail_s"]
    assert total == pytest.approx(b["wall_s"], rel=1e-6)
    # What the instrumentation replaced is back.
    assert upstream.split_coords is slow_split and upstream.tqdm is SlowBar
