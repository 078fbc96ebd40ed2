"""The workflow mode's arguments and jobs (:mod:`.workflow`): what each named job
runs and writes, and the command line, checked so that an error names its fix."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.attention import HELP, parse_attention
from earth2studio_compile.tools.bench.calls import IOS, PRECISIONS, SOURCES
from earth2studio_compile.tools.bench.floors import FLOOR_WRITERS

__all__ = ["DEFAULT_IOS", "JOBS", "NO_WORKFLOW", "WAYS", "job_spec", "parse"]

#: Named jobs: the workflow, the model, steps, members, members per batch and the
#: variables written (``few``: three, ``all``: every one).
JOBS: dict[str, dict[str, Any]] = {
    "fcn": {"workflow": "deterministic", "model": "fcn", "steps": 40},
    "dlwp-ens": {
        "workflow": "ensemble",
        "model": "dlwp",
        "steps": 20,
        "members": 16,
        "batch_size": 8,
        "outputs": "few",
    },
    # 16 x 21 lead times x 7 x 721 x 1440 float32 = 9.8 GB; one store on disk at a
    # time: every call's store is removed once measured, a child's files after it.
    "dlwp-ens-all": {
        "workflow": "ensemble",
        "model": "dlwp",
        "steps": 20,
        "members": 16,
        "batch_size": 8,
        "outputs": "all",
    },
    "fcn-ens": {
        "workflow": "ensemble",
        "model": "fcn",
        "steps": 10,
        "members": 8,
        "batch_size": 4,
    },
}
#: The IOs of a run unless ``--io`` says.
DEFAULT_IOS = ("zarr-disk", "async-zarr", "overlapped")
WAYS = ("cold", "warm", "second")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The workflow mode's arguments, checked; errors name the fix."""
    p = argparse.ArgumentParser(
        prog="earth2studio-compile-bench workflow",
        description="Time whole workflow calls, upstream eager vs compile=True: a "
        "fresh process with empty caches, one with warm caches, and second calls in "
        "one process; with the floors they are measured against.",
    )
    p.add_argument(
        "--jobs",
        default="fcn,dlwp-ens",
        help="comma-separated: fcn (deterministic, 40 steps, every variable), "
        "dlwp-ens (ensemble, 16 members x 20 steps, batch 8, 3 variables), "
        "dlwp-ens-all (the same, all 7 variables: on disk each call's store is 9.8 "
        "GB, so --workdir needs ~11 GB free: one store at a time, and the caches), "
        "fcn-ens (ensemble, 8 members x 10 steps, batch 4, every variable), "
        "det:MODEL or ens:MODEL (default fcn,dlwp-ens)",
    )
    p.add_argument("--size", default="full", choices=["full", "medium", "small"])
    p.add_argument("--steps", type=int, default=None, help="override every job's")
    p.add_argument("--members", type=int, default=None, help="override ensembles'")
    p.add_argument("--batch-size", type=int, default=None, help="override ensembles'")
    p.add_argument(
        "--io",
        default=",".join(DEFAULT_IOS),
        help=f"comma-separated IO backends: {', '.join(IOS)}; overlapped, "
        "overlapped-memory and overlapped-async are our OverlappedIO around "
        "zarr-disk, memory-zarr and async-zarr, each also run eagerly, and "
        "upstream eager on the backend they wrap "
        f"(default {','.join(DEFAULT_IOS)})",
    )
    p.add_argument(
        "--ways",
        default=",".join(WAYS),
        help="comma-separated: cold, warm (needs cold: it reuses its caches), "
        "second (default all)",
    )
    p.add_argument("--repeats", type=int, default=3, help="calls of 'second'")
    p.add_argument(
        "--fresh-repeats",
        type=int,
        default=1,
        help="processes per row (eager, cold, warm, second-call), in rounds after "
        "every row has run once; the tables show each row's median and its samples "
        "(default 1)",
    )
    p.add_argument(
        "--cold-repeats",
        type=int,
        default=None,
        help="cold processes per IO (each with empty caches); 0 runs only the first "
        "IO's, which fills the caches the warm and second rows use and waits for its "
        "background build (~3x a warm process); the others cancel theirs after the "
        "call (default: --fresh-repeats)",
    )
    p.add_argument(
        "--no-floor",
        action="store_true",
        help="no floor process (the floors do not depend on the IO or the way: "
        "measure them in another run)",
    )
    p.add_argument(
        "--no-eager",
        action="store_true",
        help="no eager processes: the compiled rows alone, compared with nothing "
        "(to profile a compiled call without waiting for upstream's; their ratios "
        "stay blank)",
    )
    p.add_argument(
        "--precision",
        default="tf32",
        help=f"comma-separated, each its own rows: {', '.join(PRECISIONS)} "
        "(default tf32, set globally for eager and compiled rows alike)",
    )
    p.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda if available)"
    )
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    p.add_argument("--timeout", type=int, default=540, help="seconds per process")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds from the start after which no process starts (its rows are "
        "marked skipped) and none runs on; nor does one that an earlier one of its "
        "kind says cannot finish in the time left; the tables still print",
    )
    p.add_argument(
        "--writers",
        type=int,
        default=FLOOR_WRITERS,
        help="writer threads of the storage floor: as many as the fastest backend "
        f"uses (default {FLOOR_WRITERS}, AsyncZarrBackend's pool); one writer is "
        "always timed too",
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="random",
        help="the data source: random (Earth2Studio's Random, drawn during the "
        "call: on an H100 half of FCN's first step) or prefetched (the same fields "
        "drawn before the clock and kept, as a user whose initial state is on "
        "hand; the call still fetches through it); default random",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="the interpreter's switch interval in every child, in seconds "
        "(sys.setswitchinterval; default Python's, 0.005): how soon a thread "
        "running Python lets another have the GIL, e.g. a writer back from a "
        "system call",
    )
    p.add_argument(
        "--max-pending",
        type=int,
        default=None,
        help="the overlapped rows' OverlappedIO(max_pending=N): steps queued behind "
        "the one being stored, so at most N + 1 steps of host memory (default "
        "OverlappedIO's, 2)",
    )
    p.add_argument(
        "--attention",
        type=parse_attention,
        default=None,
        help=HELP + " (the compiled rows' calls)",
    )
    p.add_argument("--workdir", type=Path, default=None, help="caches and stores")
    p.add_argument(
        "--cache-from",
        type=Path,
        default=None,
        help="a compile cache (an EARTH2STUDIO_COMPILE_CACHE directory, e.g. the "
        "one `tools.build` filled) each job's caches start from: its warm and "
        "second-call rows find what was built there (a user who built before "
        "forecasting); takes --ways warm, second or both",
    )
    args = p.parse_args(argv)
    args.io_list = _listed(p, "--io", args.io, IOS)
    args.way_list = _listed(p, "--ways", args.ways, WAYS)
    args.precision_list = _listed(p, "--precision", args.precision, PRECISIONS)
    if args.cache_from is not None:
        if not args.cache_from.is_dir():
            p.error(f"--cache-from: {args.cache_from} is not a directory")
        if "cold" in args.way_list:
            p.error(
                "--cache-from fills the caches a cold row would start without; "
                "use --ways warm, second or both"
            )
    elif "warm" in args.way_list and "cold" not in args.way_list:
        p.error(
            "--ways warm reuses the cold row's caches; add cold (--ways cold,warm) "
            "or give --cache-from"
        )
    for name in ("steps", "members", "batch_size", "repeats", "writers", "max_pending"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, not {value}")
    if args.switch_interval is not None and not args.switch_interval > 0:
        p.error(f"--switch-interval must be > 0 seconds, not {args.switch_interval}")
    if args.fresh_repeats < 1:
        p.error(f"--fresh-repeats must be >= 1, not {args.fresh_repeats}")
    if args.cold_repeats is None:
        args.cold_repeats = args.fresh_repeats
    elif args.cold_repeats < 0:
        p.error(f"--cold-repeats must be >= 0, not {args.cold_repeats}")
    args.job_list = [job_spec(p, j, args) for j in args.jobs.split(",") if j.strip()]
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cuda", "cpu"):
        p.error(f"--device must be cuda or cpu, not {args.device!r}")
    return args


def _listed(
    p: argparse.ArgumentParser, flag: str, text: str, choices: tuple[str, ...]
) -> list[str]:
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    for t in chosen:
        if t not in choices:
            p.error(f"{flag}: unknown {t!r}; use a comma-separated list of {choices}")
    if not chosen:
        p.error(f"{flag} is empty; use a comma-separated list of {choices}")
    return list(dict.fromkeys(chosen))


# Models upstream's workflows cannot store, eager too, and what times them instead:
# the workflow sizes its store from one step's lead times, and DLESyM's iterator
# yields the initial context's at step 0 and sixteen a step after ("could not
# broadcast input array from shape (1,0,...)", checked 2026-11-29 and 2026-11-30).
NO_WORKFLOW = {
    "dlesym": "docs/bench/2026-11-29-h200-twentyseventh/dlesym_calls.py times the "
    "loop of Earth2Studio's DLESyM example instead",
}


def job_spec(
    p: argparse.ArgumentParser, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The job ``name`` (:data:`JOBS`, ``det:MODEL`` or ``ens:MODEL``) with
    ``args``' overrides; an unknown name is ``p``'s error."""
    name = name.strip()
    kinds = {"det": "fcn", "ens": "dlwp-ens"}
    kind, _, model = name.partition(":")
    if name in JOBS:
        job = {**JOBS[name]}
    elif kind in kinds and model:
        job = {**JOBS[kinds[kind]], "model": model}
    else:
        p.error(
            f"--jobs: unknown {name!r}; use {', '.join(JOBS)}, det:MODEL or ens:MODEL"
        )
    if job["model"] in NO_WORKFLOW:
        p.error(
            f"--jobs: {name!r}: upstream's workflows cannot store "
            f"{job['model']}'s outputs, eager too; {NO_WORKFLOW[job['model']]}"
        )
    job["job"] = name
    job.setdefault("members", 1)
    job.setdefault("batch_size", 1)
    job.setdefault("outputs", "all")
    if args.steps:
        job["steps"] = args.steps
    if job["workflow"] == "ensemble":
        job["members"] = args.members or job["members"]
        job["batch_size"] = min(args.batch_size or job["batch_size"], job["members"])
    return job
