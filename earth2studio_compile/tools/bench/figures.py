"""Measured figures in the docs, rendered from the benchmark's JSON.

Every timing the README and ``docs/*.md`` state comes from a JSON file under
``docs/bench/`` and appears once, in a block this module writes::

    <!-- figures:NAME -->
    ...rendered: when, where, how it was measured, then the table...
    <!-- /figures:NAME -->

Prose elsewhere links to the block instead of repeating its numbers, so a new run
changes one JSON file and one command, and the docs cannot disagree with themselves
(``test/test_docs.py`` re-renders every block and fails on any difference, and on a
timing written outside the blocks).

``python -m earth2studio_compile.tools.bench.figures`` rewrites the blocks in place;
``--check`` only reports the blocks that differ (exit status 1).

Each block states the date, the command, the GPU (or CPU) and the torch version of
every source, read from the JSON: ``environment`` (the bench CLI), ``meta`` (scripts)
or the fields a script wrote. A date a JSON does not record is its directory's, the
``docs/bench/<date>-<machine>/`` convention of the run records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
BENCH = "docs/bench"
DOCS = ("README.md", "docs/performance.md", "docs/user-guide.md", "docs/models.md")
_BLOCK = re.compile(
    r"<!-- figures:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /figures:(?P=name) -->",
    re.DOTALL,
)

Renderer = Callable[[Sequence[Mapping[str, Any]]], str]


@dataclass(frozen=True)
class Figure:
    """One rendered block: the JSON files it shows and how.

    Parameters
    ----------
    name : str
        The block's name in ``<!-- figures:NAME -->``
    doc : str
        The one file, relative to the repository root, that holds the block
    sources : tuple[str, ...]
        JSON files, relative to ``docs/bench/``
    render : Renderer
        Loaded sources in order -> the Markdown table(s)
    """

    name: str
    doc: str
    sources: tuple[str, ...]
    render: Renderer


# ---------------------------------------------------------------- metadata


def _command(argv: Sequence[str]) -> str:
    """A recorded ``argv`` as the command a reader types today.

    The older runs named the tooling's former paths (``earth2studio_compile/bench``);
    the module path is today's, the arguments are as recorded.
    """
    head, rest = argv[0], list(argv[1:])
    if head.endswith("bench/__main__.py"):
        head = "python -m earth2studio_compile.tools.bench"
    elif head.endswith("bench/kernels.py"):
        head = "python -m earth2studio_compile.tools.bench.kernels"
    else:
        head = "python " + head
    return " ".join([head, *rest])


def _dir_date(source: str) -> str:
    match = re.match(r"(\d{4}-\d{2}-\d{2})", source)
    if not match:
        raise ValueError(f"{source}: no date in the JSON nor in its directory name")
    return match[1]


def metadata(source: str, data: Mapping[str, Any]) -> dict[str, str]:
    """``date``, ``machine``, ``torch`` and ``command`` of one JSON file.

    Parameters
    ----------
    source : str
        The file, relative to ``docs/bench/``
    data : Mapping[str, Any]
        Its content

    Returns
    -------
    dict[str, str]
        The four fields; a file that lacks one raises ``ValueError`` naming it
    """
    env = data.get("environment") or data.get("meta") or {}
    date = str(env.get("date") or _dir_date(source))[:10]
    if env.get("gpu") or env.get("device", "").startswith("NVIDIA"):
        machine = env.get("gpu") or env["device"]
    elif env.get("cpu_count") or data.get("cpus") or env.get("cpus"):
        cpus = env.get("cpu_count") or data.get("cpus") or env.get("cpus")
        machine = f"CPU, {cpus} cores"
    else:
        machine = str(env.get("machine", ""))
    torch = env.get("torch") or data.get("torch")
    argv = data.get("argv") or env.get("argv")
    command = _command(argv) if argv else env.get("command")
    missing = [
        k
        for k, v in (("machine", machine), ("torch", torch), ("command", command))
        if not v
    ]
    if missing:
        raise ValueError(
            f"{BENCH}/{source} records no {', '.join(missing)}: add them to its JSON "
            "(only from the log, gpu.txt or script beside it)"
        )
    if not str(command).startswith("python "):
        command = f"python {command}"
    return {"date": date, "machine": machine, "torch": str(torch), "command": command}


def _header(figure: Figure, datas: Sequence[Mapping[str, Any]]) -> str:
    doc_dir = (ROOT / figure.doc).parent
    lines = []
    for source, data in zip(figure.sources, datas):
        meta = metadata(source, data)
        link = os.path.relpath(ROOT / BENCH / source, doc_dir)
        lines.append(
            f"- [`{source}`]({link}): {meta['date']}, {meta['machine']}, "
            f"torch {meta['torch']}; `{meta['command']}`"
        )
    return "\n".join(lines)


def render(figure: Figure, root: Path = ROOT) -> str:
    """The block's body: a note on where it comes from, its sources, its table."""
    datas = [json.loads((root / BENCH / s).read_text()) for s in figure.sources]
    return (
        "<!-- rendered by `python -m earth2studio_compile.tools.bench.figures` from "
        "the JSON below: edit those, not this block -->\n"
        f"{_header(figure, datas)}\n\n{figure.render(datas).rstrip()}\n"
    )


# ---------------------------------------------------------------- tables


def _md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _label(r: Mapping[str, Any]) -> str:
    name = str(r["model"])
    if r.get("size") == "small":
        name += " small"
    if r.get("precision"):
        return f"{name} {r['precision']}"
    return f"{name} fp32" if r.get("fp32") else name


def _regions(r: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((r.get("report") or {}).get("regions", []))


def _counts(r: Mapping[str, Any]) -> str:
    regions = _regions(r)
    if not regions:
        return "-"
    return "/".join(
        str(sum(x[k] for x in regions))
        for k in ("graphs", "graph_breaks", "recompiles")
    )


def _status(r: Mapping[str, Any]) -> str:
    if "error" in r:
        return "error: " + str(r["error"])[:60]
    regions = _regions(r)
    return ",".join(sorted({x["status"] for x in regions})) if regions else "eager"


def _mode(r: Mapping[str, Any]) -> str:
    regions = [x for x in _regions(r) if x.get("mode")]
    return regions[0]["mode"] if regions else str(r["mode"])


def rollouts(forecast: int | None = None) -> Renderer:
    """The bench CLI's rollout rows (``results``): one line per fresh process.

    Parameters
    ----------
    forecast : int | None
        Also show a whole forecast of this many steps: first step + (N - 1) x the
        median step, the figure a user waits for
    """

    def table(datas: Sequence[Mapping[str, Any]]) -> str:
        results = [r for d in datas for r in d["results"]]
        columns: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
            ("model", _label),
            ("compiled as", lambda r: "-" if r["mode"] == "eager" else _mode(r)),
            ("start", lambda r: r.get("cache") or "-"),
            ("status", _status),
            ("first step s", lambda r: _f(r.get("first_step_s"), ".2f")),
            ("ms/step", lambda r: _f(r.get("steady_ms"), ".2f")),
            (
                "speedup",
                lambda r: _f(r.get("speedup"), ".2f") + "x" * bool(r.get("speedup")),
            ),
            ("break-even steps", lambda r: _f(r.get("break_even_steps"), ",.0f")),
            ("warm / cold", lambda r: _f(r.get("warm_over_cold"), ".0%")),
        ]
        if forecast:
            columns.append(
                (
                    f"{forecast}-step forecast s",
                    lambda r: _f(
                        r["first_step_s"] + (forecast - 1) * r["steady_ms"] / 1e3
                        if r.get("steady_ms") is not None
                        else None,
                        ".2f",
                    ),
                )
            )
        columns += [
            ("build s", lambda r: _f(r.get("build_s"), ".0f")),
            (
                "peak GiB",
                lambda r: _f(
                    r["peak_gpu_bytes"] / 2**30 if r.get("peak_gpu_bytes") else None,
                    ".2f",
                ),
            ),
            ("graphs/breaks/recompiles", _counts),
            ("rel. L2 step 1", lambda r: _f(r.get("rel_l2_first"), ".1e")),
            ("step 10", lambda r: _f(r.get("rel_l2_10"), ".1e")),
            ("last step", lambda r: _f(r.get("rel_l2_last"), ".1e")),
        ]
        # A column no row fills (memory on a CPU, build time without --aot) is left out.
        kept = [
            (h, cell)
            for h, cell in columns
            if h in ("model", "start")
            or any(cell(r) not in ("-", "-x") for r in results)
        ]
        rows = [[cell(r) for _, cell in kept] for r in results]
        steps = sorted({int(r["steps"]) for r in results})
        note = (
            f"\n\n{'/'.join(map(str, steps))} steps, batch 1, each row a fresh "
            "process; "
            "ms/step is the median of whole model steps after the first (a DLWP call "
            "makes two 6-h steps: averaged in pairs); speedup and break-even are "
            "against the eager row above; rel. L2 against eager after that step."
        )
        return _md([h for h, _ in kept], rows) + note

    return table


def second_call(datas: Sequence[Mapping[str, Any]]) -> str:
    """Whole ``deterministic`` calls, eager and ``compile=True`` in turn in one
    process (``docs/bench/2026-11-25-h100/second_call.py``)."""
    (data,) = datas
    names = {
        "async-zarr": "AsyncZarrBackend (file)",
        "zarr": "ZarrBackend (in memory)",
        "zarr-disk": "ZarrBackend (local disk)",
    }
    rows = []
    by_call: dict[tuple[str, int], dict[bool, Mapping[str, Any]]] = {}
    for r in data["rows"]:
        by_call.setdefault((r["io"], r["repeat"]), {})[r["compile"]] = r
    for (io, repeat), pair in by_call.items():
        comp = pair.get(True, {})
        if comp.get("reused"):
            how = "compiled core kept in the process"
        elif comp.get("first_call_s") is not None:
            cache = "cold" if "cold:" in comp.get("summary", "") else "warm"
            how = f"compiles ({cache} cache), first step {comp['first_call_s']:.1f} s"
        else:
            how = "-"
        eager, compiled = pair.get(False, {}), comp
        ratio = (
            f"{eager['wall_s'] / compiled['wall_s']:.2f}x"
            if eager and compiled
            else "-"
        )
        rows.append(
            [
                names.get(io, io),
                str(repeat),
                _f(eager.get("wall_s"), ".2f"),
                _f(compiled.get("wall_s"), ".2f"),
                ratio,
                how,
            ]
        )
    meta = data["meta"]
    note = (
        "\n\nFCN at full size (720x1440, random weights), "
        f"{meta['nsteps']} steps, all 26 "
        f"variables, {meta['precision']}; each call timed from calling "
        "`earth2studio_compile.run.deterministic` until the store is written and the "
        "device is idle. Eager and compiled calls alternate in one process."
    )
    header = ["IO backend", "call", "eager s", "compile=True s", "eager / compiled"]
    return _md([*header, "compile=True's call"], rows) + note


def kernels(datas: Sequence[Mapping[str, Any]]) -> str:
    """``tools.bench.kernels``: ms per step by kernel family, from the profiler."""
    keys = ("wall", "device", "host", "fft", "gemm", "conv", "triton", "copy", "other")
    rows = [
        [r["model"], r["run"], *(f"{r[f'{k}_ms']:.2f}" for k in keys)]
        for d in datas
        for r in d["rows"]
    ]
    note = (
        "\n\nms per step over steps 17-22 of a rollout (past compiling, CUDA-graph "
        "recording and the speed probe); device = summed kernel time, host = wall - "
        "device."
    )
    return _md(["model", "run", *(f"{k} ms" for k in keys)], rows) + note


PHASES = ("bundle_load", "dynamo", "backend", "first_run", "cudagraph_record")


def warm_phases(datas: Sequence[Mapping[str, Any]]) -> str:
    """Where each compiled row's first step went (``RegionReport.phases``), and the
    whole forecasts those rows give."""
    rows, totals = [], []
    counts = (40, 60, 240)
    for r in (r for d in datas for r in d["results"]):
        if r.get("steady_ms") is not None:
            forecast = [
                r["first_step_s"] + (n - 1) * r["steady_ms"] / 1e3 for n in counts
            ]
            ens = r["first_step_s"] + (16 * 40 - 1) * r["steady_ms"] / 1e3
            totals.append(
                [_label(r), r.get("cache") or "eager", *(f"{t:.2f}" for t in forecast)]
                + [f"{ens:.2f}"]
            )
        if not _regions(r):
            continue
        phases: dict[str, float] = {}
        for region in _regions(r):
            for k, v in (region.get("phases") or {}).items():
                phases[k] = phases.get(k, 0.0) + v
        rows.append(
            [_label(r), r.get("cache") or "-", f"{r['first_step_s']:.2f}"]
            + [_f(phases.get(k), ".2f") for k in PHASES]
        )
    header = ["model", "start", "first step s", *(f"{k} s" for k in PHASES)]
    total_header = [
        "model",
        "run",
        *(f"{n} steps s" for n in counts),
        "16 x 40 ensemble s",
    ]
    return (
        _md(header, rows)
        + "\n\nWhole forecasts from the same rows, first step + (N - 1) x median "
        "step:\n\n" + _md(total_header, totals)
    )


def e2e_profile(datas: Sequence[Mapping[str, Any]]) -> str:
    """The end-to-end profile of upstream's ``deterministic`` (``--io``, one writer):
    ms per step by phase, then the wall time, synchronous and with OverlappedIO."""
    parts = ("model", "coords", "d2h", "write", "other")
    rows = []
    for d in datas:
        for r in d["e2e"]:
            for io, b in r["e2e"]["backends"].items():
                for run in ("eager", "compiled"):
                    rows.append(
                        [r["model"], io, run]
                        + [f"{b[run][f'{p}_ms']:.1f}" for p in parts]
                        + [
                            f"{b[f'{run}_wall_s']:.2f}",
                            f"{b[f'{run}_overlap_wall_s']:.2f}",
                        ]
                    )
    steps = sorted({r["steps"] for d in datas for r in d["e2e"]})
    note = (
        f"\n\n{'/'.join(map(str, steps))} steps, `Random` data, full-size models; wall "
        "s is the best of 2 runs after a warm-up run (compiled: inside one session "
        "after `session.warmup()`, so without the compile); the ms columns are one "
        "extra run with a device sync around each phase; other = data generation, "
        "`add_array`, the progress bar."
    )
    header = ["model", "io", "run", *(f"{p} ms" for p in parts)]
    return _md([*header, "wall s", "OverlappedIO wall s"], rows) + note


def e2e_writers(datas: Sequence[Mapping[str, Any]]) -> str:
    """``--writers``: wall time against the floor (set-up + N x the model step)."""
    rows, steps = [], []
    for d in datas:
        for r in d["e2e"]:
            steps.append(r["e2e"]["nsteps"])
            for io, b in r["e2e"]["backends"].items():
                for row in b["rows"]:
                    workers = row.get("workers")
                    run = row["run"].split("+")[0]
                    if workers:
                        run += f" + OverlappedIO, {workers} writer{'s' * (workers > 1)}"
                    rows.append(
                        [
                            f"{r['model']} {io}",
                            run,
                            f"{row['wall_s']:.2f}",
                            f"{row['speedup']:.2f}x",
                            f"{row['floor_s']:.2f}",
                            f"{row['floor_ratio']:.2f}",
                            _f(row.get("blocked_s"), ".2f"),
                        ]
                    )
                per_step = [
                    [f"{r['model']} {io}", run]
                    + [
                        f"{b2[f'{p}_ms']:.1f}"
                        for p in ("model", "d2h", "write", "loop")
                    ]
                    for run, b2 in b["breakdown"].items()
                ]
    header = ["model, io", "run", "wall s", "vs eager", "floor s", "wall / floor"]
    note = (
        f"\n\n{'/'.join(map(str, steps))} steps; floor = set-up + N x the model step "
        "of that run; waited = seconds the workflow waited in `OverlappedIO.write` for "
        "storage. Per step, synchronous runs:\n\n"
    )
    step_header = [
        "model, io",
        "run",
        "model ms",
        "d2h ms",
        "write ms",
        "rest of loop ms",
    ]
    return _md([*header, "waited s"], rows) + note + _md(step_header, per_step)


def cluster(datas: Sequence[Mapping[str, Any]]) -> str:
    """``cluster_wall.py``: N processes on one cache root, started together."""
    rows = []
    for d in datas:
        for r in d["rows"]:
            what = sorted(x["artifact"] for x in r["results"])
            rows.append(
                [
                    str(r["processes"]),
                    f"{r['wall_s']:.1f}",
                    f"{r['ratio_to_first_row']:.2f}x",
                    "; ".join(what),
                    ", ".join(f"{x['imports_and_eager_s']:.0f}" for x in r["results"]),
                    f"{max(x['max_abs_diff'] for x in r['results']):.1e}",
                ]
            )
    header = ["processes", "wall s", "vs one cold process", "what each did"]
    header += ["imports + eager call s, each", "max abs. diff vs eager"]
    return _md(header, rows)


def overlap(datas: Sequence[Mapping[str, Any]]) -> str:
    """``io_compare.py``: synchronous writing against the two OverlappedIO writers."""
    (d,) = datas
    names = {
        "sync": "synchronous",
        "old": "hand-built writer (ce16c1e)",
        "new": "`concurrent.futures` writer",
    }
    rows = [
        [
            names[k],
            f"{d[k]['median_s']:.2f}",
            f"{min(d[k]['all']):.2f}-{max(d[k]['all']):.2f}",
        ]
        for k in ("sync", "old", "new")
    ]
    note = (
        "\n\n`Persistence` (no compute), 26 variables on a 181x360 grid, 12 steps, "
        f"on-disk `ZarrBackend`, {len(d['sync']['all'])} interleaved repetitions; "
        f"{d['machine']}."
    )
    return _md(["writer", "median s", "range s"], rows) + note


# ---------------------------------------------------------------- the figures

_H23 = "2026-11-23-h100/"
PERF = "docs/performance.md"
FIGURES: tuple[Figure, ...] = (
    Figure(
        "second-call", "README.md", ("2026-11-25-h100/second_call.json",), second_call
    ),
    Figure(
        "rollouts",
        "docs/user-guide.md",
        tuple(
            _H23 + f
            for f in (
                "bench-fcn-max-autotune.json",
                "bench-dlwp-40.json",
                "bench-sfno-final.json",
                "bench-sfno-final-fp32.json",
                "bench-persistence.json",
            )
        ),
        rollouts(),
    ),
    Figure(
        "aot",
        PERF,
        ("2026-11-24-h100/bench-fcn-aot.json", "2026-11-24-h100/bench-dlwp-aot.json"),
        rollouts(forecast=40),
    ),
    Figure(
        "cpu-aot", PERF, ("2026-11-24-cpu-aot/bench-fcn-small-aot.json",), rollouts()
    ),
    Figure("cpu-small", PERF, ("2026-11-23-cpu-small.json",), rollouts()),
    Figure(
        "cpu-cluster",
        PERF,
        ("2026-11-24-cpu-cluster/wall.json", "2026-11-24-cpu-cluster/wall-4.json"),
        cluster,
    ),
    Figure("cpu-overlap", PERF, ("2026-11-24-cpu-overlap/result.json",), overlap),
    Figure(
        "runs-1-3",
        PERF,
        (_H23 + "bench-fcn-dlwp.json", _H23 + "bench-dlwp-sfno.json"),
        rollouts(),
    ),
    Figure("run-6", PERF, (_H23 + "bench-dlwp-warmfix.json",), rollouts()),
    Figure("run-7-fp32", PERF, (_H23 + "bench-fp32.json",), rollouts()),
    Figure(
        "kernels", PERF, (_H23 + "kernels.json", _H23 + "kernels-sfno.json"), kernels
    ),
    Figure("run-11-sfno-opaque", PERF, (_H23 + "bench-sfno-opaque.json",), rollouts()),
    Figure(
        "run-13-sfno-fp32-options",
        PERF,
        (_H23 + "bench-sfno-fp32-default-options.json",),
        rollouts(),
    ),
    Figure("warm-phases", PERF, (_H23 + "bench-warm-phases.json",), warm_phases),
    Figure("e2e", PERF, (_H23 + "bench-e2e.json",), e2e_profile),
    Figure("e2e-writers", PERF, (_H23 + "bench-e2e-writers.json",), e2e_writers),
    Figure(
        "precision",
        PERF,
        tuple(
            _H23 + f"bench-precision-{m}.json" for m in ("fcn-tf32", "fcn-bf16", "dlwp")
        ),
        rollouts(),
    ),
)


# A timing: "62.65 ms", "4.8 s", "15-90 s", "1.16x", "2x". Grids ("720x1440") are not.
TIMING = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)?(?:\s?[-–]\s?\d+(?:\.\d+)?)?\s?(?:ms|s)\b"
    r"|(?<![\w.])\d+(?:\.\d+)?x(?![\w])"
)
# Figures outside the blocks that are not measurements: the phrase around each, why.
_TARGET = "a target the project set (issues 3, 5, 14), not a measurement"
NOT_MEASURED: dict[str, str] = {
    "FCN >= 1.2x": _TARGET,
    "the 1.2x target": _TARGET,
    "DLWP >= 2.2x": _TARGET,
    "SFNO-class >= 1.1x": _TARGET,
    "the 1.1x target": _TARGET,
    "compiled <= 1.1x eager": _TARGET,
    ">= 2x faster": _TARGET,
    "tf32 >= 3.0x": _TARGET,
    "bf16 >= 3.5x": _TARGET,
    "the 5x target": _TARGET,
}


def stray(text: str) -> list[str]:
    """``"line N: figure"`` for each timing outside the figure blocks.

    Parameters
    ----------
    text : str
        A Markdown file

    Returns
    -------
    list[str]
        One entry per figure that is neither rendered nor in ``NOT_MEASURED``
    """
    # Blank the blocks out, keeping their newlines so line numbers stay right.
    text = _BLOCK.sub(lambda m: "\n" * m[0].count("\n"), text)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        allowed = [
            (m.start(), m.end())
            for phrase in NOT_MEASURED
            for m in re.finditer(re.escape(phrase), line)
        ]
        for m in TIMING.finditer(line):
            if not any(a <= m.start() and m.end() <= b for a, b in allowed):
                found.append(f"line {number}: {m[0]}")
    return found


def blocks(text: str) -> dict[str, str]:
    """``{name: body}`` of the figure blocks in one file's text."""
    found: dict[str, str] = {}
    for m in _BLOCK.finditer(text):
        if m["name"] in found:
            raise ValueError(f"figures:{m['name']} appears twice in one file")
        found[m["name"]] = m["body"]
    return found


def rewrite(text: str, figures: Sequence[Figure], root: Path = ROOT) -> str:
    """``text`` with each of ``figures``' blocks replaced by a fresh rendering."""
    by_name = {f.name: f for f in figures}

    def fresh(m: re.Match[str]) -> str:
        figure = by_name.get(m["name"])
        if figure is None:
            return m[0]
        name = m["name"]
        body = render(figure, root)
        return f"<!-- figures:{name} -->\n{body}<!-- /figures:{name} -->"

    return _BLOCK.sub(fresh, text)


def check(root: Path = ROOT) -> list[str]:
    """What differs between the docs and their JSON, one line per problem."""
    problems = []
    names = {f.name for f in FIGURES}
    for doc in DOCS:
        text = (root / doc).read_text()
        mine = [f for f in FIGURES if f.doc == doc]
        present = blocks(text)
        for figure in mine:
            if figure.name not in present:
                problems.append(f"{doc}: no <!-- figures:{figure.name} --> block")
            elif present[figure.name] != render(figure, root):
                problems.append(f"{doc}: figures:{figure.name} differs from its JSON")
        for name in present:
            if name not in names:
                problems.append(f"{doc}: figures:{name} is not a declared figure")
            elif name not in {f.name for f in mine}:
                problems.append(f"{doc}: figures:{name} belongs in another file")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Rewrite the docs' figure blocks from their JSON (``--check``: only compare)."""
    parser = argparse.ArgumentParser(
        prog="python -m earth2studio_compile.tools.bench.figures",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a block differs"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        print("\n".join(problems) or "every figure block matches its JSON")
        return 1 if problems else 0
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text()
        new = rewrite(text, [f for f in FIGURES if f.doc == doc])
        if new != text:
            path.write_text(new)
            print(f"rewrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
