"""The ensemble mode's summary and tables
(earth2studio_compile.tools.bench.ensemble.tables): compared with upstream's best
batch size, the largest batch that fits, runs merged by ``--render``."""

from __future__ import annotations

import json

import pytest

from earth2studio_compile.tools.bench import __main__ as cli


def _row(run, b, rate, precision=None, io="zarr-disk", **extra):
    return {
        "model": "fcn",
        "io": io,
        "outputs": "few",
        "run": run,
        "precision": precision,
        "batch_size": b,
        "member_steps_per_s": rate,
        **extra,
    }


def test_ensemble_summary_compares_with_upstreams_best_batch():
    from earth2studio_compile.tools.bench.ensemble import summarize, tables

    rows = [
        _row("eager", 4, 10.0),
        _row("eager", 16, 12.0),  # upstream's best batch size
        _row("eager-tf32", 16, 20.0),
        _row("compiled", 4, 30.0, "tf32"),
        _row("compiled", 16, 48.0, "tf32"),
        _row("compiled", 32, None, "tf32", oom=True, error="out of memory: x"),
        _row("compiled", 16, 60.0, "tf32", io="async-zarr"),
        _row("compiled", 16, 1.0, "tf32", prime=True),
    ]
    del rows[5]["member_steps_per_s"], rows[-1]["member_steps_per_s"]
    s = summarize(rows)
    by = {(e["io"], e["run"], e["batch_size"]): e for e in s["rows"]}
    e = by[("zarr-disk", "compiled", 16)]
    assert e["vs_eager"] == pytest.approx(4.0) and e["vs_eager_batch"] == 16
    assert e["vs_eager_tf32"] == pytest.approx(2.4)
    assert by[("async-zarr", "compiled", 16)]["async_vs_zarr"] == pytest.approx(1.25)
    # no eager rows on async-zarr: nothing to compare with there
    assert by[("async-zarr", "compiled", 16)]["vs_eager"] is None
    assert len(s["rows"]) == 6  # the OOM and the prime rows have no throughput
    fits = s["largest_batch"]["fcn zarr-disk few compiled tf32"]
    assert fits == {"fits": 16, "oom_at": 32}
    for r in rows:
        r.setdefault("steady_member_steps_per_s", 1.0)
        r.update(first_step_s=0.5, wall_s=2.0)
    text = tables(rows)
    assert "OOM: out of memory" in text and "4.00 (B=16)" in text
    assert "out of memory at 32" in text


def test_render_merges_ensemble_runs(tmp_path, capsys):
    env = {"torch": "x", "triton": "y", "date": "d", "gpu": "G", "driver": "1"}
    rows = {"zarr-disk": 10.0, "async-zarr": 15.0}
    for io, rate in rows.items():
        row = _row("eager", 16, rate, io=io)
        row |= {"steady_member_steps_per_s": rate, "first_step_s": 0.1, "wall_s": 9.0}
        payload = {"environment": env, "ensemble": [row]}
        (tmp_path / f"{io}.json").write_text(json.dumps(payload))
    paths = [str(tmp_path / f"{io}.json") for io in rows]
    assert cli.main(["--render", *paths]) == 0
    assert "1.50" in capsys.readouterr().out  # async-zarr over its zarr-disk twin


def test_ensemble_breakdown_sits_beside_the_floors():
    from earth2studio_compile.tools.bench.ensemble import STEP, tables
    from earth2studio_compile.tools.bench.ensemble.tables import floors_of

    phases = {f"{p}_ms": 10.0 for p in STEP} | {"setup_s": 0.5}  # 80 ms a step
    floors = {"compute_ms": 2.0, "storage_ms": 18.0, "floor_ms": 20.0, "floor_s": 0.5}
    extra = {"steady_member_steps_per_s": 1.0, "first_step_s": 0.1, "wall_s": 2.0}
    rows = [
        _row("eager", 8, 1.0, breakdown=phases, **extra),
        _row("compiled", 8, 2.0, "fp32", breakdown=phases, floors=floors, **extra),
        _row("compiled", 8, 2.0, "tf32", floors=floors | {"floor_ms": 1.0}, **extra),
        _row("eager", 4, 1.0, breakdown=phases, **extra),  # no floors at B=4
    ]
    assert floors_of(rows[0], rows) is floors  # eager fp32: the fp32 floors
    assert floors_of(rows[3], rows) is None
    text = tables(rows).split("Per batched step")[1].split("Throughput")[0]
    assert "compute floor ms" in text and "wall/floor" in text
    eager = next(x.split() for x in text.splitlines() if " eager " in x and " 8 " in x)
    # step ms (every phase but the perturbation), the floors, step/floor, wall/floor
    assert eager[-5:] == ["80.0", "2.0", "18.0", "4.00", "4.00"]
    small = next(x.split() for x in text.splitlines() if " 4 " in x)
    assert small[-5:] == ["80.0", "-", "-", "-", "-"]
