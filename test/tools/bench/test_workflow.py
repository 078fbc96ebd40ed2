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


def test_workflow_jobs_fcn_ens_and_dlwp_ens_write_what_the_issue_says():
    from earth2studio_compile.tools.bench import workflow

    args = workflow.parse(["--device", "cpu", "--jobs", "fcn-ens,dlwp-ens,fcn"])
    fcn_ens, dlwp, fcn = args.job_list
    assert (fcn_ens["workflow"], fcn_ens["model"]) == ("ensemble", "fcn")
    assert (fcn_ens["members"], fcn_ens["steps"], fcn_ens["batch_size"]) == (8, 10, 4)
    assert fcn_ens["outputs"] == "all"  # every one of FCN's 26 variables
    assert (dlwp["members"], dlwp["steps"], dlwp["batch_size"]) == (16, 20, 8)
    assert dlwp["outputs"] == "few" and fcn["outputs"] == "all"
    # The floor spec carries what the calls write.
    floor = [s for s in workflow.plan(args) if s["kind"] == "floor"]
    assert [(s["job"], s["outputs"]) for s in floor] == [
        ("fcn-ens", "all"),
        ("dlwp-ens", "few"),
        ("fcn", "all"),
    ]


def test_workflow_plan_runs_upstream_on_the_backend_an_overlapped_io_wraps():
    """Each OverlappedIO has its eager + OverlappedIO row, after upstream's eager on
    the backend it wraps (once, whichever order --io lists them in)."""
    from earth2studio_compile.tools.bench import workflow

    argv = ["--device", "cpu", "--jobs", "dlwp-ens", "--ways", "cold"]
    argv += ["--io", "overlapped-memory,memory-zarr,overlapped"]
    specs = workflow.plan(workflow.parse(argv))
    assert [(s["io"], s["way"], s["run"]) for s in specs] == [
        ("memory-zarr", "fresh", "eager"),  # upstream, the wrapped backend
        ("overlapped-memory", "fresh", "eager"),  # eager + OverlappedIO
        ("overlapped-memory", "cold", "compiled"),
        (None, "floor", "floor"),
        ("memory-zarr", "cold", "compiled"),  # its eager ran already
        ("zarr-disk", "fresh", "eager"),
        ("overlapped", "fresh", "eager"),
        ("overlapped", "cold", "compiled"),
    ]
    assert all(s["cache"] is None for s in specs if s["run"] == "eager")
