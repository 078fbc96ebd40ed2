"""The workflow mode's plan (earth2studio_compile.tools.bench.workflow)."""

from __future__ import annotations

import argparse


def test_workflow_plan_pairs_and_shares_caches():
    from earth2studio_compile.tools.bench import workflow

    args = workflow.parse(["--device", "cpu", "--io", "zarr-disk,overlapped"])
    specs = workflow.plan(args)
    kinds = [(s["job"], s["io"], s["way"], s["run"]) for s in specs]
    per_io = [("fresh", "eager"), ("cold", "compiled"), ("warm", "compiled")]
    per_io.append(("second", "both"))
    expected = []
    for job in ("fcn", "dlwp-ens"):
        expected += [(job, "zarr-disk", way, run) for way, run in per_io]
        expected.append((job, None, "floor", "floor"))  # early: before a deadline
        expected += [(job, "overlapped", way, run) for way, run in per_io]
    assert kinds == expected
    fcn, dlwp = specs[0], specs[9]
    assert (fcn["steps"], fcn["workflow"]) == (40, "deterministic")
    assert (dlwp["steps"], dlwp["members"], dlwp["batch_size"]) == (20, 16, 8)
    # eager runs in empty caches of its own; cold, warm and second share theirs
    assert fcn["cache"] is None
    assert {s["cache"] for s in specs[1:5]} == {"fcn-tf32-zarr-disk"}  # floor too
    assert specs[8]["cache"] == "fcn-tf32-overlapped"
    # The storage floor writes with AsyncZarrBackend's 8 threads unless told.
    assert {s["writers"] for s in specs if s["kind"] == "floor"} == {8}
    args = workflow.parse(["--device", "cpu", "--jobs", "fcn", "--writers", "3"])
    assert [s["writers"] for s in workflow.plan(args) if s["kind"] == "floor"] == [3]
    small = workflow.parse(["--device", "cpu", "--jobs", "ens:toy,det:toy"])
    small.members, small.batch_size = 2, 8
    job = workflow._job(argparse.ArgumentParser(), "ens:toy", small)
    assert (job["model"], job["members"], job["batch_size"]) == ("toy", 2, 2)
