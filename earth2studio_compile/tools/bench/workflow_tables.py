"""The workflow mode's pairs and tables (:mod:`.workflow`): what each row is measured
against, and how it prints.

:func:`derive` pairs every compiled row with upstream's eager call in the same
precision on the same storage, every row with its floor, and a compiled row on an
``OverlappedIO`` also with the eager call through that ``OverlappedIO`` ("eager +
OverlappedIO": our IO path alone, no compile), so that its gain over upstream splits
into writing (eager / eager + OverlappedIO) and compiling (eager + OverlappedIO /
compiled). :func:`tables` prints the whole calls, then the per-step medians and
floors.
"""

from __future__ import annotations

from typing import Any

from earth2studio_compile.tools.bench.calls import OVERLAPPED
from earth2studio_compile.tools.bench.text import format_table

SAME = ("job", "precision")


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

    Adds ``floor_s`` and ``wall_over_floor`` to every timed row whose job and
    precision have a floor; ``member_steps_per_s`` (members x steps over the whole
    call) to every timed ensemble row; ``pair`` (an index), ``eager_wall_s`` and
    ``vs_eager`` (eager seconds over the row's) to compiled rows and to eager rows
    through an ``OverlappedIO``, paired with upstream's eager call on the backend
    it wraps (a compiled row whose storage has no such call: the eager call on its
    own IO); and to compiled rows through an ``OverlappedIO`` ``io_pair``,
    ``io_only_wall_s`` and ``vs_io_only``: the eager call through the same
    ``OverlappedIO``, and its seconds over the compiled row's (the compiling part).
    """
    floors = {(r["job"], r["precision"]): r["floor_s"] for r in rows if "floor_s" in r}
    for r in rows:
        if "wall_s" not in r:
            continue
        f = floors.get((r["job"], r["precision"]))
        if f:
            r.update(floor_s=f, wall_over_floor=r["wall_s"] / f)
        if r.get("workflow") == "ensemble" and r.get("members") and r.get("steps"):
            r["member_steps_per_s"] = r["members"] * r["steps"] / r["wall_s"]
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
            e = rows[i]["wall_s"]
            r.update(pair=i, eager_wall_s=e, vs_eager=e / r["wall_s"])
        j = _eager(rows, r, r["io"]) if ours and r["run"] == "compiled" else None
        if j is not None:
            o = rows[j]["wall_s"]
            r.update(io_pair=j, io_only_wall_s=o, vs_io_only=o / r["wall_s"])


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
    "status",
    "1st step s eager/comp",
    "proc s eager/comp",
    "import s",
]


def _line(rows: list[dict[str, Any]], i: int) -> list[str] | None:
    """A whole call's line: an eager row, alone or as a compiled row's pair, an
    eager + OverlappedIO row, a compiled row; None for a row shown in another's."""
    r = rows[i]
    head = [r["job"], r["precision"], r["io"] or "", r["way"], _f(r.get("call"), "")]
    if "error" in r or r.get("skipped"):
        why = r.get("error") or r["skipped"]
        return head + [f"{r['run']}: {why}"[:70]] + [""] * (len(HEADER) - 6)
    shown = {x.get(k) for x in rows for k in ("pair", "io_pair") if x["run"] != "eager"}
    shown |= {x.get("pair") for x in rows if x.get("io") in OVERLAPPED}
    if r["run"] == "floor" or (r["run"] == "eager" and i in shown):
        return None
    if r["run"] == "compiled":
        c, o = r, rows[r["io_pair"]] if "io_pair" in r else {}
    else:
        c, o = {}, r if r.get("io") in OVERLAPPED else {}
    e = rows[r["pair"]] if "pair" in r else (r if not o and not c else {})
    regions = (c.get("report") or {}).get("regions", [])
    proc = f"{_f(e.get('process_s'), '.1f')}/{_f(c.get('process_s'), '.1f')}"
    rates = [x.get("member_steps_per_s") for x in (e, o, c)]
    return head + [
        _f(e.get("wall_s")),
        _f(o.get("wall_s")),
        _f(c.get("wall_s")),
        _ratio(e.get("wall_s"), c.get("wall_s")),
        _ratio(e.get("wall_s"), o.get("wall_s")),
        _ratio(o.get("wall_s"), c.get("wall_s")),
        "/".join(_f(x, ".1f") for x in rates) if any(rates) else "-",
        _s(r.get("floor_s")),
        _f(e.get("wall_over_floor")),
        _f(c.get("wall_over_floor")),
        ",".join(sorted({x["status"] for x in regions})) or "-",
        f"{_f((o or e).get('first_step_s'))}/{_f(c.get('first_step_s'))}",
        proc if r["way"] != "second" else "-",
        _f(c.get("import_s") if c else (o or e).get("import_s"), ".1f"),
    ]


def tables(rows: list[dict[str, Any]]) -> str:
    """The whole calls, one line per compiled row with its eager pairs (and per row
    that failed), then the per-step medians and floors."""
    lines = [x for i in range(len(rows)) if (x := _line(rows, i)) is not None]
    text = "Whole call, from calling the workflow until the store is written:\n"
    text += format_table(HEADER, lines)
    header = ["job", "prec", "eager ms/step", "compiled ms/step", "speedup"]
    header += ["model steps", "N x step s", "numpy.save s", "1 writer s", "os.sync s"]
    header += ["GB", "floor s"]
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
            + [_f(r["store_bytes_expected"] / 1e9, ".3g"), _s(r["floor_s"])]
        )
    text += (
        "\n\nPer step (medians of a rollout, compiled after its compile) and floors:\n"
    )
    text += format_table(header, lines)
    return text + (
        "\n\neager = upstream's workflow on the backend (an OverlappedIO's: the one it "
        "wraps); eager+OvIO = upstream's workflow through our OverlappedIO, no "
        "compile; writing x = eager/eager+OvIO, compiling x = eager+OvIO/compiled; "
        "m·steps/s = members x steps per second (ensembles). "
        "floor = N x the compiled step + numpy.save s: the same bytes copied to "
        "the host and written with numpy.save from that many writer threads, one file "
        "per variable per step (then a device sync; no fsync, as no backend does one: "
        "os.sync s is what it took after); 1st step s = from the call until the first "
        "forecast step reached the IO (eager: the row compared with, eager+OvIO where "
        "there is one); proc s = the fresh process, start to exit; "
        "import s = interpreter start until torch, earth2studio and "
        "earth2studio_compile are imported"
    )


def storage_floor(r: dict[str, Any]) -> str:
    """A floor row's storage figure named with its writers: ``"0.52 (8 writers)"``.

    Rows written before the floor had parallel writers have no
    ``io_floor_writers``: their figure is one writer's.
    """
    n = r.get("io_floor_writers", 1)
    return f"{_s(r['io_floor_s'])} ({n} writer{'s' * (n != 1)})"
