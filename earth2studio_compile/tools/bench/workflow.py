"""Workflow mode of the benchmark: the whole call a user makes, timed (issue 30).

``python -m earth2studio_compile.tools.bench workflow`` times upstream's workflow
(``earth2studio.run``, eager) and ours with ``compile=True``
(:mod:`earth2studio_compile.run`) from calling the workflow until the store is written
and the device is idle, three ways:

``cold``
    a fresh process with empty compile caches (``EARTH2STUDIO_COMPILE_CACHE`` in a
    new directory, with Inductor's and Triton's under it, as the package puts them
    for a user who chose none);
``warm``
    a fresh process given the caches the cold row left, and no ahead-of-time
    ``build()``;
``second``
    calls 1, 2, 3 in one process, eager and compiled interleaved (the compiled call 1
    finds the cold row's caches where that row ran).

``--cache-from DIR`` starts the job's caches as a copy of ``DIR`` (a compile cache
``tools.build`` filled), for the warm and second rows without a cold one: a user
who built before forecasting.

Each fresh compiled row is paired with a fresh eager process of upstream's workflow
on the same job, storage and precision (run just before the cold row); each compiled
call of ``second`` with the eager call before it (:mod:`.workflow_tables`). Rows per
job, precision and IO backend (``zarr-disk``: ``ZarrBackend`` on a path;
``memory-zarr``: one in memory; ``async-zarr``: ``AsyncZarrBackend``; ``overlapped``,
``overlapped-memory`` and ``overlapped-async``: ``OverlappedIO`` around the first
three, whose compiled rows pair with upstream eager on the backend they wrap and,
beside it, with eager through the same ``OverlappedIO``: how much of the gain is
writing, how much compiling),
then per job and precision the floors (:mod:`.calls`): ``N x`` the compiled step,
and the store's bytes written with ``numpy.save`` from ``--writers`` threads (8 by
default, as many as ``AsyncZarrBackend`` uses; one writer is timed too). Jobs:
``fcn`` (40 steps), ``dlwp-ens`` (16 members x 20 steps, batch 8, 3 variables),
``dlwp-ens-all`` (the same with all 7 variables: a 9.8 GB store, issue 34's disk
target), ``fcn-ens`` (8 members x 10 steps, batch 4, all 26 variables); ensembles
report members x steps per second (jobs and arguments: :mod:`.workflow_args`).
Every child is a fresh process (:mod:`.calls`); the parent rewrites the JSON
whenever a child has finished a call, so a run cut short keeps what it measured, and
``--deadline`` stops starting rows that could not finish in time (:mod:`.deadline`).

One process is one sample, and two processes of the same row differ by more than the
gains measured (3.28 s and 4.95 s for one eager row on one H100), so
``--fresh-repeats N`` runs each row's process N times (eager, cold, warm and the
second-call one; ``--cold-repeats`` apart for the cold rows: the one that fills the
caches waits for its background build, ~3x the others, until
:data:`.calls.STOP_MARGIN_S` before its limit, then cancels it (``background_cut``,
"builds cut" in its status); the rest cancel theirs after
the call; a warm row waits at most :data:`.calls.WARM_WAIT_S` for work its cache
lacked, then cancels it, ``background_cut`` in its row) and every pair, ratio and
table figure is the median of its samples (a second-call process's call k with the
other processes' call k). It is not ``--repeats``: that counts calls inside one
second-call process (3 by default), and tying the two would triple every fresh row's
device time by default. Every row runs once before any repeat, then the repeats come
in rounds, each round the rows in their first order (eager, cold, warm, second, per
IO): drift across a run spreads over every row alike, and a deadline drops repeats,
judged by the first sample of their kind, never a whole row. ``--no-floor`` leaves
the floor process out; ``--no-eager`` the eager ones (a compiled call alone, to
profile it).

Precision: ``tf32`` (the default) sets PyTorch's global TF32 switches in every row,
eager and compiled, the one line a user adds, so eager in the same precision is the
baseline; ``fp32`` turns them off; ``bf16`` adds bf16 autocast inside the cores
(``EARTH2STUDIO_COMPILE_PRECISION=bf16`` for compiled rows, the same scope eagerly).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.calls import OVERLAPPED
from earth2studio_compile.tools.bench.deadline import Deadline
from earth2studio_compile.tools.bench.workflow_args import JOBS, parse
from earth2studio_compile.tools.bench.workflow_tables import (
    derive,
    storage_floor,
    tables,
)

__all__ = ["JOBS", "derive", "main", "parse", "plan", "run_child", "storage_floor"]
__all__ += ["stop_child", "tables"]

#: What makes two children the same kind, for ``--deadline``'s estimate (the way
#: says the run: a second-call child's spec runs "both", its rows eager or compiled).
KIND = ("job", "kind", "way", "build")
#: How a child starts: ``python CHILD SPEC_JSON OUT_JSON``.
CHILD: tuple[str, ...] = ("-m", "earth2studio_compile.tools.bench.calls")
#: Seconds between looks at a running child's output.
POLL_S = 0.5
#: Seconds a child past its timeout has from SIGTERM, to cancel its background builds
#: (a build has 10 s of its own to end), before its process group is killed.
STOP_GRACE_S = 20.0
# A failed child's log lines kept in its error row.
LOG_TAIL = 40
EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The children, in order: per job, precision and IO the eager fresh process,
    the cold and warm compiled ones and the second-call one; the floors after the
    first IO's. An ``OverlappedIO`` (``overlapped``, ``overlapped-memory``,
    ``overlapped-async``) has its eager fresh process (eager + OverlappedIO: our IO
    path alone) after upstream's eager one on the backend it wraps, unless that
    ran already.

    With ``--fresh-repeats N`` each row runs once in that order, then rounds 2..N
    follow per job and precision, each round its IOs' eager, cold, warm and
    second-call processes again (``repeat``: the round); cold rows run in rounds up
    to ``--cold-repeats``.

    ``cache`` names the caches a child gets: one directory per job and precision,
    filled by its first cold child (the first IO's, round 1) and found by every
    IO's warm and second-call children (the artifacts do not depend on the IO, and
    a warm row whose own cold row a deadline skipped would have run cold); None is
    a fresh empty one of its own, as every other cold child gets.
    """
    specs: list[dict[str, Any]] = []
    for job in args.job_list:
        for precision in args.precision_list:
            base = {**job, "precision": precision, "size": args.size}
            base["device"], base["source"] = args.device, args.source
            for knob in ("switch_interval", "max_pending", "attention"):
                if getattr(args, knob) is not None:  # absent: the rows as before
                    base[knob] = getattr(args, knob)
            key = f"{job['job']}-{precision}".replace(":", "_")
            rows = [{**base, "io": io, "cache": key} for io in args.io_list]
            for n, row in enumerate(rows):
                specs += _round(args, row, 1, first_io=n == 0, done=specs)
                if n == 0 and not args.no_floor:  # early: a deadline leaves it
                    specs.append({**base, "io": None, "kind": "floor", "way": "floor"})
                    specs[-1].update(run="floor", cache=key, writers=args.writers)
            for repeat in range(2, args.fresh_repeats + 1):
                for n, row in enumerate(rows):
                    specs += _round(args, row, repeat, first_io=n == 0, done=specs)
    if args.no_eager:
        specs = [s for s in specs if s.get("run") != "eager"]
    return specs


def compared_with(specs: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Per compiled row of ``specs`` (its index), the eager rows it is compared
    with: the fresh eager processes of its job, precision and round on its IO and,
    for an ``OverlappedIO``, on the backend that one wraps. A second-call child
    is its own comparison."""
    eager = {
        (s["job"], s["precision"], s["io"], s.get("repeat")): i
        for i, s in enumerate(specs)
        if s.get("run") == "eager" and s["kind"] == "fresh"
    }
    compared: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        if s.get("run") == "compiled":
            ios = dict.fromkeys((OVERLAPPED.get(s["io"], s["io"]), s["io"]))
            keys = [(s["job"], s["precision"], io, s.get("repeat")) for io in ios]
            compared[i] = [eager[k] for k in keys if k in eager]
    return compared


def _round(
    args: argparse.Namespace,
    row: dict[str, Any],
    repeat: int,
    first_io: bool,
    done: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """One round of an IO's processes: its eager ones (those ``done`` lacks for
    this round), cold (in rounds up to ``--cold-repeats``; the first IO's round 1
    always, in the job's caches), warm and second-call."""
    specs: list[dict[str, Any]] = []
    fresh: dict[str, Any] = {"kind": "fresh", "way": "fresh", "run": "eager"}
    fresh.update(cache=None, repeat=repeat)
    for io in dict.fromkeys((OVERLAPPED.get(row["io"], row["io"]), row["io"])):
        if {"cold", "warm"} & set(args.way_list) and not any(
            all(s.get(k) == v for k, v in {**fresh, "io": io}.items())
            and (s["job"], s["precision"]) == (row["job"], row["precision"])
            for s in done + specs
        ):
            specs.append({**row, **fresh, "io": io})
    fills = first_io and repeat == 1
    for way in ("cold", "warm"):
        if way not in args.way_list or (
            way == "cold" and repeat > args.cold_repeats and not fills
        ):
            continue
        specs.append({**row, "kind": "fresh", "run": "compiled", "way": way})
        specs[-1]["repeat"] = repeat
        if way == "cold":
            # The row that fills the caches waits for its build; the others'
            # caches are their own and nothing reads them after.
            specs[-1]["build"] = "wait" if fills else "cancel"
            if not fills:
                specs[-1]["cache"] = None
    if "second" in args.way_list:
        specs.append({**row, "kind": "second", "way": "second", "run": "both"})
        specs[-1].update(repeats=args.repeats, repeat=repeat)
    return specs


def seed_caches(specs: list[dict[str, Any]], source: Path, caches: Path) -> None:
    """Start each job's shared caches (``cache``) from ``source``
    (``--cache-from``, a compile cache root), copied to where a child's compile
    cache root is (``bundles``)."""
    for key in dict.fromkeys(s["cache"] for s in specs if s.get("cache")):
        shutil.copytree(source, caches / key / "bundles", dirs_exist_ok=True)


def run_child(
    spec: dict[str, Any],
    caches: Path,
    timeout: float,
    progress: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
) -> list[dict[str, Any]]:
    """Run one child (:mod:`.calls`) with its caches; its rows, each with the spec,
    the child's ``import_s`` and ``setup_s`` and its ``process_s`` (start to exit).

    ``progress`` gets the rows so far whenever the child has written more. A child
    that runs past ``timeout`` is stopped (:func:`stop_child`); a failed or stopped
    child's finished calls are kept and one row with ``error`` stands for the rest.

    The child works in a directory of its own, removed when it has exited, killed
    or not, so no child leaves a store behind for the next (DLWP's 7 variables: 9.8
    GB each); so are caches of its own (``cache`` None), which nothing reads after.
    """
    local = caches / (spec["cache"] or f"own-{time.monotonic_ns()}")
    workdir = caches / f"child-{time.monotonic_ns()}"
    workdir.mkdir()
    precision = "EARTH2STUDIO_COMPILE_PRECISION"  # the row's own, set below
    # Inductor's and Triton's caches go where the package puts them for a user
    # who chose none: under its cache root, where tools.build left its own (a
    # directory of their own hid a --cache-from root's Inductor cache, and the
    # Dynamo-path regions of the warm rows compiled cold: FCN3, 2026-12-01).
    unset = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", precision)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["EARTH2STUDIO_COMPILE_CACHE"] = str(local / "bundles")
    if spec["precision"] == "bf16":
        env[precision] = "bf16"
    warm = local.exists() and any(local.rglob("*"))
    out = caches / f"out-{time.monotonic_ns()}.json"
    start = time.perf_counter()
    launched = time.time()
    spec = {
        **spec,
        "launched": launched,
        "stop_by": launched + timeout,
        "workdir": str(workdir),
    }
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
                stop_child(proc)
                error = f"timed out after {timeout:.0f} s"
                break
            time.sleep(POLL_S)
            if out.exists() and out.stat().st_mtime != seen:
                seen = out.stat().st_mtime
                progress(_rows(spec, out, None, warm))
    process_s = time.perf_counter() - start
    shutil.rmtree(workdir, ignore_errors=True)
    if spec["cache"] is None:
        shutil.rmtree(local, ignore_errors=True)
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


def stop_child(proc: subprocess.Popen[Any]) -> None:
    """Stop a child that leads its own process group: SIGTERM, on which it cancels
    its background builds (:func:`.calls.builds_cancelled_on_sigterm`) and exits,
    then SIGKILL for the group (Inductor's compile workers) once it has exited or
    :data:`STOP_GRACE_S` seconds have passed."""
    proc.terminate()
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # nothing of the group is left
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _failure(lines: list[str]) -> str:
    """A failed child's error: its last exception line (a CUDA error's own message
    precedes three lines of advice), then its last line."""
    raised = [x for x in lines if EXCEPTION.match(x)]
    picked = [raised[-1]] if raised else []
    if lines and lines[-1] not in picked:
        picked.append(lines[-1])
    return " | ".join(picked)


def _base(spec: dict[str, Any], warm: bool) -> dict[str, Any]:
    row = {k: v for k, v in spec.items() if k not in ("launched", "stop_by", "workdir")}
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
        "cache_from": None if args.cache_from is None else str(args.cache_from),
        "attention": args.attention,
    }
    rows: list[dict[str, Any]] = []
    deadline = Deadline(args.deadline, KIND)

    def save(extra: list[dict[str, Any]] = []) -> None:  # noqa: B006 (read only)
        if args.json:
            both = [*rows, *extra]
            derive(both)
            args.json.write_text(json.dumps({"meta": meta, "rows": both}, indent=1))

    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    # A build a child left behind may still be writing there: the rows are saved,
    # and a leftover file must not cost the tables.
    with tempfile.TemporaryDirectory(
        dir=args.workdir, ignore_cleanup_errors=True
    ) as tmp:
        specs = plan(args)
        if args.cache_from is not None:
            seed_caches(specs, args.cache_from, Path(tmp))
        compared = compared_with(specs)
        skipped: set[int] = set()
        for i, spec in enumerate(specs):
            then = [specs[k] for k, eager in compared.items() if i in eager]
            why = deadline.skip(spec, rows, then)
            if why is None and skipped & set(compared.get(i, ())):
                why = "skipped: deadline (an eager row compared with it was)"
            if why is not None:
                skipped.add(i)
                rows.append({**_base(spec, False), "skipped": why})
            else:
                again = (
                    f" (repeat {spec['repeat']})" if spec.get("repeat", 1) > 1 else ""
                )
                print(
                    f"{spec['job']} {spec['precision']} {spec['io']} {spec['way']}"
                    f" {spec.get('run', '')}{again}".rstrip(),
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
