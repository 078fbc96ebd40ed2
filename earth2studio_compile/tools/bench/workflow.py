"""Workflow mode of the benchmark: the whole call a user makes, timed (issue 30).

``python -m earth2studio_compile.tools.bench workflow`` times upstream's workflow
(``earth2studio.run``, eager) and ours with ``compile=True``
(:mod:`earth2studio_compile.run`) from calling the workflow until the store is written
and the device is idle, three ways:

``cold``
    a fresh process with empty compile caches (``TORCHINDUCTOR_CACHE_DIR`` and
    ``EARTH2STUDIO_COMPILE_CACHE`` in a new directory);
``warm``
    a fresh process given the caches the cold row left, and no ahead-of-time
    ``build()``;
``second``
    calls 1, 2, 3 in one process, eager and compiled interleaved (the compiled call 1
    finds the cold row's caches where that row ran).

Each fresh compiled row is paired with a fresh eager process of upstream's workflow
on the same job, storage and precision (run just before the cold row); each compiled
call of ``second`` with the eager call before it (:mod:`.workflow_tables`). Rows per
job, precision and IO backend (``zarr-disk``: ``ZarrBackend`` on a path;
``memory-zarr``: one in memory; ``async-zarr``: ``AsyncZarrBackend``; ``overlapped``
and ``overlapped-memory``: ``OverlappedIO`` around the first two, whose compiled rows
pair with upstream eager on the backend they wrap and, beside it, with eager through
the same ``OverlappedIO``: how much of the gain is writing, how much compiling),
then per job and precision the floors (:mod:`.calls`): ``N x`` the compiled step,
and the store's bytes written with ``numpy.save`` from ``--writers`` threads (8 by
default, as many as ``AsyncZarrBackend`` uses; one writer is timed too). Jobs:
``fcn`` (40 steps), ``dlwp-ens`` (16 members x 20 steps, batch 8, 3 variables),
``fcn-ens`` (8 members x 10 steps, batch 4, all 26 variables); ensembles report
members x steps per second. Every child is a fresh process (:mod:`.calls`); the
parent rewrites the JSON whenever a child has finished a call, so a run cut short
keeps what it measured, and ``--deadline`` stops starting rows that could not finish
in time (:mod:`.deadline`).

Precision: ``tf32`` (the default) sets PyTorch's global TF32 switches in every row,
eager and compiled, the one line a user adds, so eager in the same precision is the
baseline; ``fp32`` turns them off; ``bf16`` adds bf16 autocast inside the cores
(``EARTH2STUDIO_COMPILE_PRECISION=bf16`` for compiled rows, the same scope eagerly).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.calls import (
    FLOOR_WRITERS,
    IOS,
    OVERLAPPED,
    PRECISIONS,
)
from earth2studio_compile.tools.bench.deadline import Deadline
from earth2studio_compile.tools.bench.workflow_tables import (
    derive,
    storage_floor,
    tables,
)

__all__ = ["derive", "main", "parse", "plan", "run_child", "storage_floor", "tables"]

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
#: What makes two children the same kind, for ``--deadline``'s estimate.
KIND = ("job", "kind", "run", "way")
WAYS = ("cold", "warm", "second")
#: How a child starts: ``python CHILD SPEC_JSON OUT_JSON``.
CHILD: tuple[str, ...] = ("-m", "earth2studio_compile.tools.bench.calls")
#: Seconds between looks at a running child's output.
POLL_S = 0.5
# A failed child's log lines kept in its error row.
LOG_TAIL = 40
EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")


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
        "dlwp-ens (ensemble, 16 members x 20 steps, batch 8, 3 variables), fcn-ens "
        "(ensemble, 8 members x 10 steps, batch 4, every variable), det:MODEL or "
        "ens:MODEL (default fcn,dlwp-ens)",
    )
    p.add_argument("--size", default="full", choices=["full", "medium", "small"])
    p.add_argument("--steps", type=int, default=None, help="override every job's")
    p.add_argument("--members", type=int, default=None, help="override ensembles'")
    p.add_argument("--batch-size", type=int, default=None, help="override ensembles'")
    p.add_argument(
        "--io",
        default=",".join(DEFAULT_IOS),
        help=f"comma-separated IO backends: {', '.join(IOS)}; overlapped and "
        "overlapped-memory are our OverlappedIO around zarr-disk and memory-zarr, "
        "each also run eagerly, and upstream eager on the backend they wrap "
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
    p.add_argument("--workdir", type=Path, default=None, help="caches and stores")
    args = p.parse_args(argv)
    args.io_list = _listed(p, "--io", args.io, IOS)
    args.way_list = _listed(p, "--ways", args.ways, WAYS)
    args.precision_list = _listed(p, "--precision", args.precision, PRECISIONS)
    if "warm" in args.way_list and "cold" not in args.way_list:
        p.error("--ways warm reuses the cold row's caches; add cold (--ways cold,warm)")
    for name in ("steps", "members", "batch_size", "repeats", "writers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, not {value}")
    args.job_list = [_job(p, j, args) for j in args.jobs.split(",") if j.strip()]
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


def _job(p: argparse.ArgumentParser, name: str, args: argparse.Namespace) -> dict:
    name = name.strip()
    kinds = {"det": "fcn", "ens": "dlwp-ens"}
    kind, _, model = name.partition(":")
    if name in JOBS:
        job = {**JOBS[name]}
    elif kind in kinds and model:
        job = {**JOBS[kinds[kind]], "model": model}
    else:
        p.error(
            f"--jobs: unknown {name!r}; use fcn, dlwp-ens, fcn-ens, det:MODEL or "
            "ens:MODEL"
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


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The children, in order: per job, precision and IO the eager fresh process,
    the cold and warm compiled ones and the second-call one; the floors after the
    first IO's. An ``OverlappedIO`` (``overlapped``, ``overlapped-memory``) has its
    eager fresh process (eager + OverlappedIO: our IO path alone) after upstream's
    eager one on the backend it wraps, unless that ran already.

    ``cache`` names the caches a child gets: one directory per job and precision,
    filled by its first cold child and found by every IO's warm and second-call
    children (the artifacts do not depend on the IO, and a warm row whose own cold
    row a deadline skipped would have run cold); None is a fresh empty one of its
    own, as each later IO's cold child gets.
    """
    specs: list[dict[str, Any]] = []
    for job in args.job_list:
        for precision in args.precision_list:
            base = {**job, "precision": precision, "size": args.size}
            base["device"] = args.device
            key = f"{job['job']}-{precision}".replace(":", "_")
            for n, io in enumerate(args.io_list):
                row = {**base, "io": io, "cache": key}
                fresh = {"kind": "fresh", "run": "eager", "way": "fresh", "cache": None}
                for each in dict.fromkeys((OVERLAPPED.get(io, io), io)):
                    if {"cold", "warm"} & set(args.way_list) and not any(
                        s["run"] == "eager" and s["io"] == each and s["way"] == "fresh"
                        for s in specs
                        if s["job"] == job["job"] and s["precision"] == precision
                    ):
                        specs.append({**row, **fresh, "io": each})
                for way in ("cold", "warm"):
                    if way in args.way_list:
                        specs.append(
                            {**row, "kind": "fresh", "run": "compiled", "way": way}
                        )
                        if way == "cold" and n > 0:
                            specs[-1]["cache"] = None
                if "second" in args.way_list:
                    specs.append({**row, "kind": "second", "way": "second"})
                    specs[-1].update(run="both", repeats=args.repeats)
                if n == 0:  # early, so a deadline leaves it; in warm caches
                    specs.append({**base, "io": None, "kind": "floor", "way": "floor"})
                    specs[-1].update(run="floor", cache=key, writers=args.writers)
    return specs


def run_child(
    spec: dict[str, Any],
    caches: Path,
    timeout: float,
    progress: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
) -> list[dict[str, Any]]:
    """Run one child (:mod:`.calls`) with its caches; its rows, each with the spec,
    the child's ``import_s`` and ``setup_s`` and its ``process_s`` (start to exit).

    ``progress`` gets the rows so far whenever the child has written more. A child
    that fails or runs past ``timeout`` is killed; its finished calls are kept and
    one row with ``error`` stands for the rest.
    """
    local = caches / (spec["cache"] or f"own-{time.monotonic_ns()}")
    env = {
        **os.environ,
        "EARTH2STUDIO_COMPILE_CACHE": str(local / "bundles"),
        "TORCHINDUCTOR_CACHE_DIR": str(local / "inductor"),
        "TRITON_CACHE_DIR": str(local / "triton"),
    }
    env.pop("EARTH2STUDIO_COMPILE_PRECISION", None)
    if spec["precision"] == "bf16":
        env["EARTH2STUDIO_COMPILE_PRECISION"] = "bf16"
    warm = local.exists() and any(local.rglob("*"))
    out = caches / f"out-{time.monotonic_ns()}.json"
    start = time.perf_counter()
    spec = {**spec, "launched": time.time(), "workdir": str(caches)}
    with open(caches / "child.log", "a") as log:
        log_start = log.tell()
        proc = subprocess.Popen(
            [sys.executable, *CHILD, json.dumps(spec), str(out)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own process group: Inductor's compile workers go with it.
            start_new_session=True,
        )
        seen, error = 0.0, None
        while proc.poll() is None:
            if time.perf_counter() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                error = f"timed out after {timeout:.0f} s"
                break
            time.sleep(POLL_S)
            if out.exists() and out.stat().st_mtime != seen:
                seen = out.stat().st_mtime
                progress(_rows(spec, out, None, warm))
    process_s = time.perf_counter() - start
    with open(caches / "child.log") as log:
        log.seek(log_start)
        lines = log.read().strip().splitlines()
    if error is None and proc.returncode != 0:
        error = _failure(lines) or f"exit {proc.returncode}"
    rows = _rows(spec, out, process_s, warm)
    if error is not None:
        rows.append(
            {
                **_base(spec, warm),
                "error": error,
                "log_tail": lines[-LOG_TAIL:],
                "process_s": process_s,
            }
        )
    out.unlink(missing_ok=True)
    return rows


def _failure(lines: list[str]) -> str:
    """A failed child's error: its last exception line (a CUDA error's own message
    precedes three lines of advice), then its last line."""
    raised = [x for x in lines if EXCEPTION.match(x)]
    picked = [raised[-1]] if raised else []
    if lines and lines[-1] not in picked:
        picked.append(lines[-1])
    return " | ".join(picked)


def _base(spec: dict[str, Any], warm: bool) -> dict[str, Any]:
    row = {k: v for k, v in spec.items() if k not in ("launched", "workdir")}
    if spec.get("run") != "eager" and spec["kind"] != "floor":
        row["cache"] = "warm" if warm else "cold"
    else:
        row["cache"] = None
    return row


def _rows(
    spec: dict[str, Any], out: Path, process_s: float | None, warm: bool
) -> list[dict[str, Any]]:
    try:
        payload = json.loads(out.read_text())
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return []
    head = {k: payload.get(k) for k in ("import_s", "setup_s")}
    rows = [
        {**_base(spec, warm), **head, "process_s": process_s, **r}
        for r in payload["rows"]
    ]
    for r in rows:
        if r["run"] == "eager":  # eager calls of a second-call child use no cache
            r["cache"] = None
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``earth2studio-compile-bench workflow``."""
    from earth2studio_compile.tools.bench.env import environment, git_commit

    args = parse(argv)
    argv = sys.argv[1:] if argv is None else argv
    env = environment(args.device)
    # This process's TF32 switches: the children set their own (``precision``).
    env.pop("cudnn_allow_tf32", None)
    env.pop("matmul_allow_tf32", None)
    meta = {
        "command": shlex.join(
            ["python", "-m", "earth2studio_compile.tools.bench", "workflow", *argv]
        ),
        "device_name": env.get("gpu") or platform.processor() or "CPU",
        "precision": args.precision_list,
        "git_commit": git_commit(),
        "environment": env,
    }
    rows: list[dict[str, Any]] = []
    deadline = Deadline(args.deadline, KIND)

    def save(extra: list[dict[str, Any]] = []) -> None:  # noqa: B006 (read only)
        if args.json:
            both = [*rows, *extra]
            derive(both)
            args.json.write_text(json.dumps({"meta": meta, "rows": both}, indent=1))

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for spec in plan(args):
            why = deadline.skip(spec, rows)
            if why is not None:
                rows.append({**_base(spec, False), "skipped": why})
            else:
                print(
                    f"{spec['job']} {spec['precision']} {spec['io']} {spec['way']}"
                    f" {spec.get('run', '')}".rstrip(),
                    flush=True,
                )
                left = deadline.timeout(args.timeout)
                rows += run_child(spec, Path(tmp), left, progress=save)
            save()
    derive(rows)
    print(tables(rows))
    print(
        f"\n{meta['device_name']}, torch {env['torch']}, earth2studio "
        f"{env.get('earth2studio')}, {args.size} models, {env['date']}, commit "
        f"{meta['git_commit']}"
    )
    return 1 if any("error" in r for r in rows) else 0
