"""The workflow mode's figures for the docs (:mod:`.figures`): whole calls, each
compiled row beside the eager rows it is paired with, and where a compiled first step
went. The workflow mode's own printed tables are :mod:`.workflow_tables`'.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from earth2studio_compile.tools.bench.calls import OVERLAPPED
from earth2studio_compile.tools.bench.phases import FIRST_STEP
from earth2studio_compile.tools.bench.tables import markdown, number
from earth2studio_compile.tools.bench.workflow_tables import (
    larger_floor_s,
    median_of,
    samples,
)

_WAYS = {
    "cold": "fresh process, empty cache",
    "warm": "fresh process, cache the cold one left (no build())",
}
# Rows of a run whose caches started as a copy of one tools.build filled.
_WAYS_BUILT = {"warm": "fresh process, cache tools.build left (--cache-from)"}
_IOS = {
    "async-zarr": "AsyncZarrBackend (disk)",
    "zarr-disk": "ZarrBackend (disk)",
    "overlapped": "OverlappedIO(ZarrBackend (disk))",
    "memory-zarr": "ZarrBackend (memory)",
    "overlapped-memory": "OverlappedIO(ZarrBackend (memory))",
    "overlapped-async": "OverlappedIO(AsyncZarrBackend (disk))",
}


def _built(data: Mapping[str, Any]) -> bool:
    """Whether ``data``'s run took its cache from ``tools.build`` (``--cache-from``)."""
    return bool((data.get("meta") or {}).get("cache_from"))


def _ways(data: Mapping[str, Any]) -> dict[str, str]:
    """How each way of ``data``'s rows reads: a warm row's cache is the one
    ``tools.build`` left where the run named one."""
    return {**_WAYS, **_WAYS_BUILT} if _built(data) else _WAYS


def _job(r: Mapping[str, Any]) -> str:
    """A workflow row's job in words: model, members x steps (batch), variables."""
    name = f"{str(r['model']).upper()}, "
    if r.get("members", 1) > 1:
        name += f"{r['members']} x {r['steps']} (batch {r.get('batch_size')})"
    else:
        name += f"{r['steps']} steps"
    name += ", 3 variables" if r.get("outputs") == "few" else ", every variable"
    # Rows before --source drew their data during the call (random).
    return name + (", data prefetched" if r.get("source") == "prefetched" else "")


def _ran(regions: list[dict[str, Any]], built: bool) -> str:
    """What a call's regions ran as, where none was building. A region that
    has an artifact but ran eagerly (the probe timed it slower, or compiling
    would not pay) counts as eager, not as the artifact (FCN3, forty-fourth
    session)."""
    compiled = [g for g in regions if g["status"] == "compiled"]
    if not compiled:
        return ", ".join(sorted({g["status"] for g in regions})) or "-"
    source = "tools.build left" if built else "a background build left"
    kept = [g for g in compiled if g.get("reused")]
    aot = [g for g in compiled if not g.get("reused") and g.get("executor") == "aot"]
    rest = sorted({g["status"] for g in regions if g["status"] != "compiled"})
    if not rest:
        if kept:
            return "compiled code kept in the process"
        return f"the artifact {source}" if aot else "compiled"
    here = len(compiled) - len(kept) - len(aot)
    parts = [
        f"{n} {text}"
        for n, text in (
            (len(aot), f"from the artifacts {source}"),
            (len(kept), "kept in the process"),
            (here, "compiled in the process"),
        )
        if n
    ]
    return (
        f"{len(compiled)} of {len(regions)} regions compiled ({', '.join(parts)}); "
        f"the rest {', '.join(rest)}"
    )


def workflow(datas: Sequence[Mapping[str, Any]]) -> str:
    """Whole workflow calls from the bench's workflow mode: each compiled row
    beside the eager row it is paired with (the same job, IO and precision); a row
    run in several processes once, as its samples' median."""

    def wall(r: Mapping[str, Any]) -> str:
        n = len(r.get("walls") or [])
        median = number(median_of(r, "wall_s"), ".2f")
        return median + (f" (median of {n})" if n > 1 else "")

    def first(r: Mapping[str, Any]) -> str:
        return number(median_of(r, "first_step_s"), ".2f")

    def over_larger(r: Mapping[str, Any], floors: Mapping[Any, Any]) -> Any:
        """The row's wall over the larger floor; rows saved before the bench
        derived it: from their file's floor row."""
        if r.get("wall_over_larger") is not None:
            return r["wall_over_larger"]
        floor = floors.get((r.get("job"), r.get("precision")))
        if floor is None:
            return None
        return median_of(r, "wall_s") / larger_floor_s(floor, r.get("io"))

    rows, jobs = [], set()
    for data in datas:
        found = data["rows"]
        ways, built = _ways(data), _built(data)
        groups = samples(found)
        floors = {
            (f.get("job"), f.get("precision")): f
            for f in found
            if f.get("run") == "floor" and "compute_floor_s" in f
        }
        for i, r in enumerate(found):
            if r.get("run") != "compiled" or "wall_s" not in r:
                continue
            if groups[i][0] != i:  # a later sample, in the first one's median
                continue
            e = found[r["pair"]] if "pair" in r else {}
            # Upstream's workflow through our OverlappedIO, no compile: what
            # compile=True adds on the same IO.
            io = found[r["io_pair"]] if "io_pair" in r else {}
            jobs.add((_job(r), r["precision"]))
            ensemble = r.get("members", 1) > 1
            regions = (r.get("report") or {}).get("regions", [])
            # A region kept from an earlier call may still run eagerly while its
            # build goes on (Aurora's second calls): that is what the call ran.
            if any(g["status"] == "building" for g in regions):
                how = "eager while its artifact builds in the background"
            else:
                how = _ran(regions, built)
            way = ways.get(r["way"], f"call {r.get('call')} in one process")
            ref = io or e
            rate = "-"
            if ensemble:
                member_steps = r["members"] * r["steps"]
                rate = "/".join(
                    number(member_steps / w, ".0f") if w else "-"
                    for w in (median_of(x, "wall_s") if x else None for x in (e, io, r))
                )
            rows.append(
                [
                    _job(r),
                    _IOS.get(r["io"], str(r["io"])),
                    way,
                    wall(e) if e else "-",
                    wall(io) if io else "-",
                    wall(r),
                    number(r.get("vs_eager"), ".2f") + "x"
                    if r.get("vs_eager")
                    else "-",
                    number(r.get("vs_io_only"), ".2f") + "x" if io else "-",
                    rate,
                    f"{first(ref)}/{first(r)}",
                    number(r.get("floor_s"), ".2f"),
                    number(r.get("wall_over_floor"), ".2f"),
                    number(over_larger(r, floors), ".2f"),
                    how,
                ]
            )
    header = ["job", "IO backend", "call", "eager s", "eager + OverlappedIO s"]
    header += ["compile=True s", "eager / compiled", "eager + OverlappedIO / compiled"]
    header += ["members x steps / s eager/+OverlappedIO/compiled"]
    header += ["first step s eager/compiled", "floor s", "compiled / floor"]
    header += ["compiled / larger floor", "compile=True ran"]
    if len(jobs) == 1:  # the caption names it
        header, rows = header[1:], [row[1:] for row in rows]
    if not any(row[-6] != "-" for row in rows):  # no ensemble
        header, rows = header[:-6] + header[-5:], [row[:-6] + row[-5:] for row in rows]
    who = "; ".join(sorted(f"{job}, {precision}" for job, precision in jobs))
    note = (
        f"\n\n{who or '-'}: full-size models (random weights), precision set by "
        "the global flags, eager and compiled alike; each call timed from calling "
        "the workflow until the store is "
        "written and the device is idle. eager = upstream's workflow, a fresh "
        "process, on the backend (for OverlappedIO: the one it wraps); eager + "
        "OverlappedIO = upstream's workflow through our OverlappedIO, no compile; a "
        "later call is paired with the eager call before it in the same process. "
        "first step = from the call until the first step reached the IO (eager: the "
        "row compared with on the same IO). floor = the compiled step's time x steps "
        "+ the same bytes written with numpy.save from the writer threads (measured "
        "in the same run; on disk, from 2026-11-27, one file per chunk of the store "
        "in directories laid out as Zarr's chunk keys, before it one file per "
        "variable per step; for a store in memory, the bytes copied into fresh host "
        "memory); larger floor = the larger of those two parts, the floor of writes "
        "that overlap the steps entirely (what the issues' targets are of)."
    )
    return markdown(header, rows) + note


def workflow_phases(datas: Sequence[Mapping[str, Any]]) -> str:
    """Where a compiled call's first step went: the region's measured phases for
    each compiled row of the workflow mode that has them (seconds)."""
    rows, names = [], []
    for data in datas:
        for r in data["rows"]:
            regions = (r.get("report") or {}).get("regions", [])
            for g in regions:
                if r.get("run") != "compiled" or not g.get("phases"):
                    continue
                names += [k for k in g["phases"] if k not in names]
                rows.append((data, r, g))
    header = ["job", "IO backend", "call", "first step s", *names]
    body = [
        [
            _job(r),
            _IOS.get(r["io"], str(r["io"])),
            _ways(data).get(r["way"], f"call {r.get('call')} in one process"),
            number(g.get("first_call_s"), ".3f"),
            *(number(g["phases"].get(k), ".3f") for k in names),
        ]
        for data, r, g in rows
    ]
    if len({_job(r) for _, r, _ in rows}) < 2:  # the runs' caption names it
        header, body = header[1:], [row[1:] for row in body]
    note = (
        "\n\nPhases run in this order, each timed on the host (a phase that "
        "waits for the device, as verify does, also waits for the kernels queued "
        "before it); cudagraph_record is the next step's, not the first's, or "
        "(from dd6e0e2) the first call ahead's second call where it ended before "
        "the workflow's first call: off the workflow's path."
    )
    return markdown(header, body) + note


#: ``thread_s`` keys in the order a step meets them, and their column names.
_THREAD = {
    "iterator_s": "model iterator",
    "map_coords_s": "map_coords",
    "split_coords_s": "split_coords",
    "write_s": "io.write",
    "blocked_s": "of it blocked",
}
#: ``thread_cpu_s`` keys shown, and their column names.
_CPU = {"iterator_s": "model iterator CPU", "write_s": "io.write CPU"}


def _processes(
    datas: Sequence[Mapping[str, Any]], key: str
) -> Iterator[tuple[Mapping[str, Any], list[str]]]:
    """Each process of the workflow mode that timed ``key``, with the cells that
    name it: job, IO backend, run, call."""
    for data in datas:
        for r in data["rows"]:
            if not r.get(key) or "wall_s" not in r:
                continue
            if r["run"] == "compiled":
                run = "compile=True"
            elif r["io"] in OVERLAPPED:
                run = "eager + OverlappedIO"
            else:
                run = "upstream, eager"
            way = _ways(data).get(r["way"], "fresh process")
            yield r, [_job(r), _IOS.get(r["io"], str(r["io"])), run, way]


def _per_process(header: list[str], rows: list[list[str]], note: str) -> str:
    """A table of one line per process (:func:`_processes`'s cells first); one
    job's is named in the caption, not in a column."""
    jobs = list(dict.fromkeys(row[0] for row in rows))
    header = ["job", "IO backend", "run", "call", *header]
    if len(jobs) == 1:
        header, rows = header[1:], [row[1:] for row in rows]
    caption = f"\n\n{'; '.join(jobs) or '-'}: one line per process"
    return markdown(header, rows) + caption + note


def workflow_threads(datas: Sequence[Mapping[str, Any]]) -> str:
    """Where the workflow's own thread spent each process's call (seconds): the
    rows of the workflow mode that timed it (``thread_s``), one line per process."""
    rows = [
        [
            *cells,
            number(r["wall_s"], ".2f"),
            number(r.get("first_step_s"), ".2f"),
            *(number(r["thread_s"].get(k), ".2f") for k in _THREAD),
            *(number(r.get("thread_cpu_s", {}).get(k), ".2f") for k in _CPU),
        ]
        for r, cells in _processes(datas, "thread_s")
    ]
    header = ["call s", "first step s", *_THREAD.values(), *_CPU.values()]
    return _per_process(
        header,
        rows,
        ". The workflow's own "
        "thread, timed around upstream's calls: model iterator = waiting for the "
        "model's next step (its compute, or the GIL while other threads hold it), "
        "io.write = in the IO's write (an OverlappedIO's: its host copies queued, "
        "or blocked on the bound of steps pending when the writers are behind); "
        "CPU = the thread's CPU time in them (from 2026-11-28): well under their "
        "time, it waited for the GIL or a lock (CUDA spins the thread while it "
        "waits for the device, which counts as CPU).",
    )


def workflow_first_steps(datas: Sequence[Mapping[str, Any]]) -> str:
    """Where each process's first step went (seconds): the rows of the workflow
    mode that timed it (``first_step``), one line per process."""
    from earth2studio_compile.tools.bench.workflow_tables import first_step_parts

    rows = []
    for r, cells in _processes(datas, "first_step"):
        if r.get("first_step_s") is None:
            continue
        regions = (r.get("report") or {}).get("regions") or []
        ahead = sum(g.get("phases", {}).get("ahead_eager", 0.0) for g in regions)
        rows.append(
            [
                *cells,
                *(number(v, ".2f") for v in first_step_parts(r)),
                number(ahead, ".2f") if regions else "-",
            ]
        )
    header = ["first step s", *FIRST_STEP, "other"]
    header += ["eager beside the first call ahead (whole call)"]
    return _per_process(
        header,
        rows,
        ", seconds from calling "
        "the workflow until the first forecast step reached the IO, timed around "
        "upstream's calls on the workflow's thread: the model's to, fetch_data (the "
        "data source: Earth2Studio's Random on the host, drawn in the call unless "
        "the job says its data was prefetched), io.add_array, the "
        "perturbation, map_coords, the model iterator (the initial state, then the "
        "first step's model call), io.write (the initial state's); other = the "
        "rest (the workflow's own lines, other threads holding the GIL).",
    )


def workflow_floors(datas: Sequence[Mapping[str, Any]]) -> str:
    """The floors of each run of the workflow mode (seconds): N x the compiled step,
    and the store's bytes written three ways (one file per variable per step, one
    per chunk of the store, kept in memory), with the larger floor of a row on
    disk; one line per floor row."""
    rows = []
    for data in datas:
        for r in data["rows"]:
            if r.get("run") != "floor" or "compute_floor_s" not in r:
                continue
            chunks = r.get("io_chunks_floor_s")
            rows.append(
                [
                    _job(r),
                    number(r["compiled_step_ms"], ".2f"),
                    str(r["model_steps"]),
                    number(r["compute_floor_s"], ".2f"),
                    number(r["store_bytes_expected"] / 1e9, ".2f"),
                    number(r["io_floor_s"], ".2f"),
                    number(chunks, ".2f")
                    + (f" ({r['io_chunks']} files)" if chunks is not None else ""),
                    number(r.get("io_memory_floor_s"), ".2f"),
                    number(larger_floor_s(r, None), ".2f"),  # None: on disk
                ]
            )
    header = ["job", "compiled ms/step", "model steps", "N x step s", "GB"]
    header += ["a file per variable per step s", "a file per chunk s"]
    header += ["in memory s", "larger floor on disk s"]
    return markdown(header, rows) + (
        "\n\nThe floor row of each run, measured in the same run as its calls: N x "
        "the compiled step (median of a rollout), and the store's bytes copied to "
        "the host into reused buffers and written from the writer threads with "
        "numpy.save, one file per variable per step, or one file per chunk of the "
        "store (a member, a variable, a lead time) in directories laid out as "
        "Zarr's chunk keys, or copied into fresh host memory. larger floor on disk "
        "= the larger of N x step and the chunks' floor (where measured; before, "
        "the per-variable files')."
    )
