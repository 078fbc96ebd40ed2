"""The ensemble mode's measurement (earth2studio_compile.tools.bench.ensemble.measure)
of small FCN in this process."""

from __future__ import annotations


def test_ensemble_mode_measures_small_fcn(tmp_path):
    """One eager and one compiled row of small FCN in this process: every field
    present and sane (nothing timed against a figure)."""
    from earth2studio_compile.tools.bench.ensemble import STEP, measure_ensemble

    ref = tmp_path / "ref.pt"
    base = {"model": "fcn", "mode": "ensemble", "size": "small", "device": "cpu"}
    base |= {"nensemble": 3, "steps": 2, "io": "zarr-disk", "outputs": "few"}
    base |= {"reference": str(ref), "workdir": str(tmp_path)}
    rows = []
    for run, b in (("eager", 2), ("eager", 3), ("compiled", 2)):
        spec = base | {"run": run, "batch_size": b, "save_reference": run == "eager"}
        if run == "compiled":
            spec |= {"precision": "fp32"}
        rows.append(measure_ensemble(spec))
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["member_steps"] == 6 and r["member_steps_per_s"] > 0
        assert 0 < r["first_step_s"] < r["wall_s"]
        assert r["steady_member_steps_per_s"] > 0
        assert r["peak_gpu_bytes"] is None and r["peak_gpu_bytes_per_member"] is None
        # 3 members x 3 lead times x 3 variables x 16 x 32 float32, plus metadata
        assert r["store_bytes_expected"] == 4 * 3 * 3 * 3 * 16 * 32
        assert r["store_bytes"] >= r["store_bytes_expected"] // 2
        b = r["breakdown"]
        assert b["steps"] == 2 and all(b[f"{p}_ms"] >= 0 for p in STEP if p != "loop")
        assert b["core_ms"] > 0 and b["write_ms"] > 0 and b["perturb_ms"] > 0
    assert rows[2]["report"]["regions"][0]["status"] == "compiled"
    # Same seeded data and perturbation at the same batch size as the reference.
    assert rows[2]["rel_l2_first"] < 1e-5
