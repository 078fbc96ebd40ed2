"""The tables of the docs' figure blocks, one renderer per kind of bench JSON.

Each renderer takes the block's parsed JSON sources (in the order the block
declares them, :data:`earth2studio_compile.tools.bench.figure_catalog.FIGURES`) and
returns a markdown table, with a note where the table needs one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Renderer = Callable[[Sequence[Mapping[str, Any]]], str]


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def number(v: Any, fmt: str) -> str:
    """``v`` formatted, or ``-`` for None."""
    return "-" if v is None else format(v, fmt)


def _times(v: float | None) -> str:
    """A ratio as ``1.25x``, or ``-`` for None."""
    return number(v, ".2f") + "x" * bool(v)


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


def _same_precision(
    results: Sequence[Mapping[str, Any]], r: Mapping[str, Any]
) -> float | None:
    """A compiled row's speedup over the eager row of its model in its own reduced
    precision (``speedup`` is over fp32 eager, TF32 off, under ``--precision``)."""
    if r["mode"] == "eager" or r.get("precision") in (None, "fp32"):
        return None
    same = [
        e
        for e in results
        if e["mode"] == "eager"
        and (e["model"], e.get("precision")) == (r["model"], r["precision"])
        and e.get("steady_ms")
    ]
    if not same or not r.get("steady_ms"):
        return None
    return float(same[0]["steady_ms"]) / float(r["steady_ms"])


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
            ("first step s", lambda r: number(r.get("first_step_s"), ".2f")),
            ("ms/step", lambda r: number(r.get("steady_ms"), ".2f")),
            ("speedup", lambda r: _times(r.get("speedup"))),
            (
                "over eager, same precision",
                lambda r: _times(_same_precision(results, r)),
            ),
            ("break-even steps", lambda r: number(r.get("break_even_steps"), ",.0f")),
            ("warm / cold", lambda r: number(r.get("warm_over_cold"), ".0%")),
        ]
        if forecast:
            columns.append(
                (
                    f"{forecast}-step forecast s",
                    lambda r: number(
                        r["first_step_s"] + (forecast - 1) * r["steady_ms"] / 1e3
                        if r.get("steady_ms") is not None
                        else None,
                        ".2f",
                    ),
                )
            )
        columns += [
            ("build s", lambda r: number(r.get("build_s"), ".0f")),
            (
                "peak GiB",
                lambda r: number(
                    r["peak_gpu_bytes"] / 2**30 if r.get("peak_gpu_bytes") else None,
                    ".2f",
                ),
            ),
            ("graphs/breaks/recompiles", _counts),
            ("rel. L2 step 1", lambda r: number(r.get("rel_l2_first"), ".1e")),
            ("step 10", lambda r: number(r.get("rel_l2_10"), ".1e")),
            ("last step", lambda r: number(r.get("rel_l2_last"), ".1e")),
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
        return markdown([h for h, _ in kept], rows) + note

    return table


def _summed(regions: Sequence[Mapping[str, Any]]) -> list[str]:
    eager = sum(g["eager_ms"] for g in regions)
    compiled = sum(g["compiled_ms"] for g in regions)
    return [f"{eager:.2f}", f"{compiled:.2f}", _times(eager / compiled)]


def region_probes(datas: Sequence[Mapping[str, Any]]) -> str:
    """The speed probe's figures of each region of the compiled rollout rows: what
    compiling did to the regions alone, beside the whole step that also runs what
    stays outside them (an issue's target of a model's backbone reads here)."""
    rows = []
    for r in (r for d in datas for r in d["results"]):
        probed = [g for g in _regions(r) if g.get("compiled_ms") and g.get("eager_ms")]
        for g in probed:
            rows.append(
                [
                    _label(r),
                    g["region"],
                    f"{g['eager_ms']:.2f}",
                    f"{g['compiled_ms']:.2f}",
                    _times(g["eager_ms"] / g["compiled_ms"]),
                    number(g.get("precision_error"), ".1e"),
                ]
            )
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for g in probed:  # by their first two names: Aurora's model.backbone
            groups.setdefault(".".join(g["region"].split(".")[:2]), []).append(g)
        for parent, members in groups.items():
            if 1 < len(members) < len(probed):
                name = f"{len(members)} regions under {parent} together"
                rows.append([_label(r), name, *_summed(members), "-"])
        if len(probed) > 1:
            together = f"{len(probed)} regions together"
            rows.append([_label(r), together, *_summed(probed), "-"])
    note = (
        "\n\nms per call of each region, from its speed probe (calls 3-8 of the "
        "rollout: compiled calls alternating with eager ones, in the row's "
        "precision); rel. L2 = the region's first call against the same call in "
        "fp32 eager, TF32 off."
    )
    header = ["model", "region", "eager ms", "compiled ms", "eager / compiled"]
    return markdown([*header, "rel. L2 call 1"], rows) + note


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
                number(eager.get("wall_s"), ".2f"),
                number(compiled.get("wall_s"), ".2f"),
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
    return markdown([*header, "compile=True's call"], rows) + note


def loop_calls(datas: Sequence[Mapping[str, Any]]) -> str:
    """``dlesym_calls.py``: a model's own forecast loop, eager against a
    ``CompileSession``, in a fresh process or in turn in one; each source one run."""
    rows = []
    for data in datas:
        eager: Mapping[str, Any] = {}
        for r in data["rows"]:
            if r["run"] == "eager":
                eager = r  # the compiled calls after it are compared with it
                continue
            way = r["label"] + (f", call {r['call']}" if r["way"] == "second" else "")
            ran = sorted({f"{g['status']} ({g['executor']})" for g in r["regions"]})
            rows.append(
                [
                    data["meta"]["run"],
                    way,
                    number(eager.get("wall_s"), ".2f"),
                    number(r["wall_s"], ".2f"),
                    _times(eager["wall_s"] / r["wall_s"] if eager else None),
                    f"{number(eager.get('first_step_s'), '.2f')}/"
                    f"{r['first_step_s']:.2f}",
                    ", ".join(ran),
                    number(r.get("background_wait_s"), ".0f"),
                ]
            )
    meta = datas[0]["meta"]
    note = (
        f"\n\n{meta['steps']} steps, {meta['size']} size (random weights), TF32; "
        "each call timed from creating the model's iterator until the last step's "
        "outputs are on the host. eager = the same loop without a session, the "
        "process's eager call before the compiled one (a fresh process: the run's "
        "fresh eager process); regions = each region's status (executor) at the "
        "call's end; waited = seconds the process waited after its call for the "
        "background builds it launched."
    )
    header = ["run", "process, call", "eager s", "compiled s", "eager / compiled"]
    header += ["first step s eager/compiled", "regions", "waited s"]
    return markdown(header, rows) + note


def _attention_text(row: Mapping[str, Any]) -> str:
    """A kernels row's attention choice, escaped: a bar would end its cell."""
    names = row.get("attention")
    return ", attention=" + "\\|".join(names) if names else ""


def kernels(datas: Sequence[Mapping[str, Any]]) -> str:
    """``tools.bench.kernels``: ms per step by kernel family, from the profiler."""
    keys: tuple[str, ...] = ("wall", "device", "host", "fft", "gemm", "conv")
    keys += ("triton", "copy", "other")
    found = [r for d in datas for r in d["rows"]]
    if any("attention_ms" in r for r in found):  # a family since 2026-11-27
        keys = ("wall", "device", "host", "attention", *keys[3:])
    rows = [
        [
            r["model"] + (f" {r['precision']}" if r.get("precision") else ""),
            r["run"]
            + "".join(f", {k}={v}" for k, v in (r.get("options") or {}).items())
            + _attention_text(r),
            *(f"{r[f'{k}_ms']:.2f}" for k in keys),
        ]
        for r in found
    ]
    note = (
        "\n\nms per step over the profiled steps of a rollout (its `--steps`, after "
        "16 past compiling, CUDA-graph recording and the speed probe, and 4 more "
        "where background builds switched in); device = summed kernel time, host = "
        "wall - device."
    )
    return markdown(["model", "run", *(f"{k} ms" for k in keys)], rows) + note


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
            + [number(phases.get(k), ".2f") for k in PHASES]
        )
    header = ["model", "start", "first step s", *(f"{k} s" for k in PHASES)]
    total_header = [
        "model",
        "run",
        *(f"{n} steps s" for n in counts),
        "16 x 40 ensemble s",
    ]
    return (
        markdown(header, rows)
        + "\n\nWhole forecasts from the same rows, first step + (N - 1) x median "
        "step:\n\n" + markdown(total_header, totals)
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
    return markdown([*header, "wall s", "OverlappedIO wall s"], rows) + note


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
                            number(row.get("blocked_s"), ".2f"),
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
    return (
        markdown([*header, "waited s"], rows) + note + markdown(step_header, per_step)
    )


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
    return markdown(header, rows)


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
    return markdown(["writer", "median s", "range s"], rows) + note
