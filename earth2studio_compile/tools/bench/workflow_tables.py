"""The workflow mode's pairs and tables (:mod:`.workflow`): what each row is measured
against, and how it prints.

:func:`derive` pairs every compiled row with upstream's eager call in the same
precision on the same storage, every row with its floor, and a compiled row on an
``OverlappedIO`` also with the eager call through that ``OverlappedIO`` ("eager +
OverlappedIO": our IO path alone, no compile), so that its gain over upstream splits
into writing (eager / eager + OverlappedIO) and compiling (eager + OverlappedIO /
compiled). A row run more than once (``--fresh-repeats``) is its samples' median in
every pair, ratio and table figure. :func:`tables` prints the whole calls, the
per-step medians and floors, then where each process's first step went.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from earth2studio_compile.tools.bench.calls import IN_MEMORY, OVERLAPPED
from earth2studio_compile.tools.bench.phases import FIRST_STEP
from earth2studio_compile.tools.bench.text import format_table

SAME = ("job", "precision")
#: What makes timed rows samples of one row: the fresh processes of a row run again
#: (``repeat``); a warm row that found no cache (``cache``) is a row of its own.
SAMPLE = ("job", "precision", "io", "way", "run", "call", "cache")
#: A row's figures taken as the median of its samples.
MEDIANS: tuple[str, ...] = ("wall_s", "returned_s", "first_step_s", "process_s")
MEDIANS += ("import_s", "setup_s", "background_wait_s")


def samples(rows: Sequence[Mapping[str, Any]]) -> dict[int, list[int]]:
    """Each timed row's index to the indices of its row's samples, in run order."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(rows):
        if "wall_s" in r and r["run"] != "floor":
            groups.setdefault(tuple(r.get(k) for k in SAMPLE), []).append(i)
    return {i: group for group in groups.values() for i in group}


def median_of(r: Mapping[str, Any], key: str) -> Any:
    """``r``'s median of ``key`` over its samples (its own value before derive)."""
    return (r.get("median") or {}).get(key, r.get(key))


def _eager_way(r: dict[str, Any]) -> tuple[str, int | None]:
    return ("second", r["call"]) if r["way"] == "second" else ("fresh", None)


def _eager(rows: list[dict[str, Any]], r: dict[str, Any], io: str) -> int | None:
    """Index of the eager row of ``r``'s job and precision on ``io`` taken the same
    way (a fresh process, or the same call of a second-call process)."""
    for i, e in enumerate(rows):
        if (
            e["run"] == "eager"
            and "wall_s" in e
            and e.get("io") == io
            and all(e.get(k) == r.get(k) for k in SAME)
            and (e["way"], e.get("call")) == _eager_way(r)
        ):
            return i
    return None


def derive(rows: list[dict[str, Any]]) -> None:
    """Pair the rows, in place.

    Adds to every timed row ``walls`` (the ``wall_s`` of its row's samples: the
    fresh processes of one row, one where it ran once) and ``median`` (the median of
    each of :data:`MEDIANS` over them); every figure below is of medians, the same
    on each sample. Adds ``floor_s`` and ``wall_over_floor`` to every timed row
    whose job and precision have a floor (a store in memory: the in-memory floor),
    and ``larger_floor_s`` and ``wall_over_larger``: the larger of its two parts
    (:func:`larger_floor_s`);
    ``member_steps_per_s`` (members x steps over the whole call) to every timed
    ensemble row; ``pair`` (the index of the first sample), ``eager_wall_s`` and
    ``vs_eager`` (eager seconds over the row's) to compiled rows and to eager rows
    through an ``OverlappedIO``, paired with upstream's eager call on the backend it
    wraps (a compiled row whose storage has no such call: the eager call on its own
    IO); and to compiled rows through an ``OverlappedIO`` ``io_pair``,
    ``io_only_wall_s`` and ``vs_io_only``: the eager call through the same
    ``OverlappedIO``, and its seconds over the compiled row's (the compiling part).
    """
    for index, group in samples(rows).items():
        taken = {
            k: [rows[j][k] for j in group if rows[j].get(k) is not None]
            for k in MEDIANS
        }
        rows[index]["walls"] = taken["wall_s"]
        rows[index]["median"] = {k: statistics.median(v) for k, v in taken.items() if v}
    floors = {
        (r["job"], r["precision"]): r
        for r in rows
        if r["run"] == "floor" and "floor_s" in r
    }
    for r in rows:
        if "wall_s" not in r:
            continue
        floor = floors.get((r["job"], r["precision"]))
        f = _floor_s(floor, r.get("io")) if floor else None
        wall = median_of(r, "wall_s")
        if f and floor:
            r.update(floor_s=f, wall_over_floor=wall / f)
            larger = larger_floor_s(floor, r.get("io"))
            r.update(larger_floor_s=larger, wall_over_larger=wall / larger)
        if r.get("workflow") == "ensemble" and r.get("members") and r.get("steps"):
            r["member_steps_per_s"] = r["members"] * r["steps"] / wall
    for r in rows:
        if "wall_s" not in r or r["run"] == "floor":
            continue
        ours = r.get("io") in OVERLAPPED
        if r["run"] == "eager" and not ours:
            continue
        i = _eager(rows, r, OVERLAPPED.get(r["io"], r["io"]))
        if i is None and r["run"] == "compiled":
            i = _eager(rows, r, r["io"])
        if i is not None:
            e = median_of(rows[i], "wall_s")
            r.update(pair=i, eager_wall_s=e, vs_eager=e / median_of(r, "wall_s"))
        j = _eager(rows, r, r["io"]) if ours and r["run"] == "compiled" else None
        if j is not None:
            o = median_of(rows[j], "wall_s")
            r.update(io_pair=j, io_only_wall_s=o, vs_io_only=o / median_of(r, "wall_s"))


def _floor_s(floor: dict[str, Any], io: str | None) -> float:
    """A floor row's seconds for a row on ``io``: the in-memory floor for a store in
    memory (rows measured before it existed: the files')."""
    return (io in IN_MEMORY and floor.get("memory_floor_s")) or floor["floor_s"]


def larger_floor_s(floor: dict[str, Any], io: str | None) -> float:
    """The larger of a floor row's two parts for a row on ``io``: N x the compiled
    step, or the storage floor (in memory for a store in memory; on disk, the
    store's chunks as files, or for rows measured before that floor, a file per
    variable per step). A workflow whose writes overlap its steps entirely takes no
    less; issue targets ("within 1.25x of the larger of the two floors") are of
    this one, not of their sum."""
    memory = io in IN_MEMORY and floor.get("io_memory_floor_s")
    disk = floor.get("io_chunks_floor_s") or floor["io_floor_s"]
    return max(floor["compute_floor_s"], memory or disk)


def _f(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _s(v: float | None) -> str:
    """Seconds: two decimals, three significant digits below 1 s (CPU floors)."""
    return "-" if v is None else format(v, ".2f" if abs(v) >= 1 else ".3g")


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


HEADER = [
    "job",
    "prec",
    "io",
    "way",
    "call",
    "eager s",
    "eager+OvIO s",
    "compiled s",
    "eager/comp",
    "writing x",
    "compiling x",
    "m·steps/s eager/OvIO/comp",
    "floor s",
    "eager/floor",
    "comp/floor",
    "larger floor s",
    "comp/larger",
    "status",
    "1st step s eager/comp",
    "proc s eager/comp",
    "import s",
]


def _wall(r: dict[str, Any]) -> str:
    """A row's whole call: its median, with its samples' range and number where it
    ran more than once: ``"4.02 (3.90-4.14, n=2)"``."""
    walls = r.get("walls") or []
    if len(walls) < 2:
        return _f(median_of(r, "wall_s"))
    spread = f"{min(walls):.2f}-{max(walls):.2f}, n={len(walls)}"
    return f"{median_of(r, 'wall_s'):.2f} ({spread})"


def _line(
    rows: list[dict[str, Any]], i: int, groups: dict[int, list[int]]
) -> list[str] | None:
    """A whole call's line: an eager row, alone or as a compiled row's pair, an
    eager + OverlappedIO row, a compiled row; None for a row shown in another's (a
    later sample of a row included). ``groups``: :func:`samples`."""
    r = rows[i]
    head = [r["job"], r["precision"], r["io"] or "", r["way"], _f(r.get("call"), "")]
    if "error" in r or r.get("skipped"):
        why = r.get("error") or r["skipped"]
        return head + [f"{r['run']}: {why}"[:70]] + [""] * (len(HEADER) - 6)
    shown = {x.get(k) for x in rows for k in ("pair", "io_pair") if x["run"] != "eager"}
    shown |= {x.get("pair") for x in rows if x.get("io") in OVERLAPPED}
    if r["run"] == "floor" or (r["run"] == "eager" and i in shown):
        return None
    if groups.get(i, [i])[0] != i:
        return None
    if r["run"] == "compiled":
        c, o = r, rows[r["io_pair"]] if "io_pair" in r else {}
    else:
        c, o = {}, r if r.get("io") in OVERLAPPED else {}
    e = rows[r["pair"]] if "pair" in r else (r if not o and not c else {})
    statuses = {
        x["status"]
        for j in (groups.get(i, [i]) if c else [])
        for x in (rows[j].get("report") or {}).get("regions", [])
    }
    if c and any(rows[j].get("background_cut") for j in groups.get(i, [i])):
        statuses.add("builds cut")
    proc = "/".join(_f(median_of(x, "process_s"), ".1f") for x in (e, c))
    rates = [x.get("member_steps_per_s") for x in (e, o, c)]
    return head + [
        _wall(e),
        _wall(o),
        _wall(c),
        _ratio(median_of(e, "wall_s"), median_of(c, "wall_s")),
        _ratio(median_of(e, "wall_s"), median_of(o, "wall_s")),
        _ratio(median_of(o, "wall_s"), median_of(c, "wall_s")),
        "/".join(_f(x, ".1f") for x in rates) if any(rates) else "-",
        _s(r.get("floor_s")),
        _f(e.get("wall_over_floor")),
        _f(c.get("wall_over_floor")),
        _s(r.get("larger_floor_s")),
        _f(c.get("wall_over_larger")),
        ",".join(sorted(statuses)) or "-",
        f"{_f(median_of(o or e, 'first_step_s'))}/{_f(median_of(c, 'first_step_s'))}",
        proc if r["way"] != "second" else "-",
        _f(median_of(c, "import_s") if c else median_of(o or e, "import_s"), ".1f"),
    ]


def tables(rows: list[dict[str, Any]]) -> str:
    """The whole calls, one line per compiled row with its eager pairs (and per row
    that failed), then the per-step medians and floors."""
    groups = samples(rows)
    lines = [x for i in range(len(rows)) if (x := _line(rows, i, groups)) is not None]
    text = "Whole call, from calling the workflow until the store is written:\n"
    text += format_table(HEADER, lines)
    header = ["job", "prec", "eager ms/step", "compiled ms/step", "speedup"]
    header += ["model steps", "N x step s", "numpy.save s", "1 writer s", "os.sync s"]
    header += ["as chunks s", "in memory s", "GB", "floor s", "in memory floor s"]
    lines = []
    for r in rows:
        if r["run"] != "floor" or "floor_s" not in r:
            continue
        lines.append(
            [
                r["job"],
                r["precision"],
                _f(r["eager_step_ms"]),
                _f(r["compiled_step_ms"]),
            ]
            + [_f(r["eager_step_ms"] / r["compiled_step_ms"]), str(r["model_steps"])]
            + [_s(r["compute_floor_s"]), storage_floor(r)]
            + [_s(r.get("io_floor_1writer_s")), _s(r.get("io_sync_s"))]
            + [_chunks(r), _s(r.get("io_memory_floor_s"))]
            + [_f(r["store_bytes_expected"] / 1e9, ".3g"), _s(r["floor_s"])]
            + [_s(r.get("memory_floor_s"))]
        )
    text += (
        "\n\nPer step (medians of a rollout, compiled after its compile) and floors:\n"
    )
    text += format_table(header, lines)
    text += first_steps(rows)
    return text + (
        "\n\n"
        "eager = upstream's workflow on the backend (an OverlappedIO's: the one it "
        "wraps); eager+OvIO = upstream's workflow through our OverlappedIO, no "
        "compile; writing x = eager/eager+OvIO, compiling x = eager+OvIO/compiled; "
        "m·steps/s = members x steps per second (ensembles). floor = N x the compiled"
        " step + as chunks s (larger floor: the larger of the two, the floor of "
        "writes that overlap the steps entirely): numpy.save s = the same bytes "
        "copied to the host and written with numpy.save from that many writer "
        "threads, one file per variable per step (then a device sync; no fsync, as "
        "no backend does one: os.sync s is what it took after); as chunks s = the "
        "same, one file per chunk of the store (a member, a variable, a step; the "
        "files' count in brackets), each in directories laid out as Zarr's chunk "
        "keys (rows measured before it: floor = N x the step + numpy.save s); in "
        "memory s = the same bytes copied into "
        "fresh host memory by those threads and kept (the floor of rows whose store "
        "is in memory: memory-zarr, overlapped-memory); 1st step s = from the call "
        "until the first forecast step reached the IO (eager: the row compared with, "
        "eager+OvIO where there is one); proc s = the fresh process, start to exit; "
        "import s = interpreter start until torch, earth2studio and "
        "earth2studio_compile are imported. A row run in several processes "
        "(--fresh-repeats) shows the medians of its samples, their range and number "
        "in brackets; every ratio is of medians"
    )


def first_step_parts(r: Mapping[str, Any]) -> list[float]:
    """A row's first step (``first_step_s``), its parts by :data:`FIRST_STEP`,
    and the rest of it (``other``), in seconds: the columns of both first-step
    tables (this module's, and the docs' figure)."""
    first = r["first_step"]
    total = r["first_step_s"]
    return [
        total,
        *(first.get(k, 0.0) for k in FIRST_STEP),
        total - sum(first.values()),
    ]


def first_steps(rows: list[dict[str, Any]]) -> str:
    """Where each process's first step went (seconds), one line per timed row that
    measured it (``first_step``): upstream's calls before the first forecast step
    reached the IO, the compiled region's first call among them (in the iterator
    or beside it, ahead), the rest of the call (``other``: the workflow's own
    lines, the progress bars, the logging, and other threads holding the GIL),
    and each of the first writes (the initial state's, then the steps')."""
    header = ["job", "io", "way", "run", "1st step s", *FIRST_STEP, "other"]
    header += ["region's 1st call s", "writes 0-7 s"]
    lines = []
    for r in rows:
        first = r.get("first_step")
        if not first or r.get("first_step_s") is None:
            continue
        regions = (r.get("report") or {}).get("regions") or [{}]
        region = sum(x.get("first_call_s") or 0.0 for x in regions)
        lines.append(
            [r["job"], str(r["io"]), r["way"], r["run"]]
            + [_f(v) for v in first_step_parts(r)]
            + [_f(region) if r["run"] == "compiled" else "-"]
            + ["/".join(_f(w) for w in r.get("write_seconds") or []) or "-"]
        )
    if not lines:
        return ""
    return "\n\nFirst step, where it went (s; one line per process):\n" + (
        format_table(header, lines)
    )


def _chunks(r: dict[str, Any]) -> str:
    """A floor row's chunk-layout figure with its files' count: ``"1.71 (2240)"``."""
    if r.get("io_chunks_floor_s") is None:
        return "-"
    return f"{_s(r['io_chunks_floor_s'])} ({r.get('io_chunks', '?')})"


def storage_floor(r: dict[str, Any]) -> str:
    """A floor row's storage figure named with its writers: ``"0.52 (8 writers)"``.

    Rows written before the floor had parallel writers have no
    ``io_floor_writers``: their figure is one writer's.
    """
    n = r.get("io_floor_writers", 1)
    return f"{_s(r['io_floor_s'])} ({n} writer{'s' * (n != 1)})"
