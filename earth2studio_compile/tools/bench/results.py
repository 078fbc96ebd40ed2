"""The rollout mode's results: figures derived from its rows, and their text.

:func:`derive` (speedup, break-even, memory) and :func:`against_eager` compare a row
with its eager row; :func:`table`, :func:`warm_lines` and :func:`forecast_totals`
print the rows; :func:`render` is ``--render``: earlier ``--json`` files merged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.measure import EAGER
from earth2studio_compile.tools.bench.text import format_table, model_label


def derive(eager: dict[str, Any], comp: dict[str, Any]) -> dict[str, Any]:
    """Speedup and break-even of a compiled run against its eager run."""
    if "error" in eager or "error" in comp:
        return {}
    saved = eager["steady_ms"] - comp["steady_ms"]
    extra = comp["first_step_s"] - eager["first_step_s"]
    out = {"speedup": eager["steady_ms"] / comp["steady_ms"]}
    # First step n at which compiled cumulative time <= eager cumulative time.
    out["break_even_steps"] = (1 + max(0.0, extra) * 1e3 / saved) if saved > 0 else None
    if eager.get("peak_gpu_bytes") and comp.get("peak_gpu_bytes"):
        out["memory_ratio"] = comp["peak_gpu_bytes"] / eager["peak_gpu_bytes"]
    return out


def against_eager(
    results: list[dict[str, Any]],
    model: str,
    chosen: str | None,
    result: dict[str, Any],
) -> dict[str, Any]:
    """Speedup against the first eager run (with --precision, fp32 with TF32 off);
    break-even against eager in the same precision where that was run, since that
    is what a user who already runs in that precision would compare with."""
    eagers = [r for r in results if r["model"] == model and r["mode"] == EAGER]
    out = derive(eagers[0], result)
    same = next((r for r in eagers if r.get("precision") == chosen), None)
    if same is not None and same is not eagers[0] and result["mode"] != EAGER:
        out["break_even_steps"] = derive(same, result).get("break_even_steps")
        out["break_even_against"] = f"eager {chosen}"
    return out


#: Forecast lengths of the totals table: 10, 15 and 60 days at 6 h steps.
FORECAST_STEPS = (40, 60, 240)
#: Members of the ensemble row, each ``FORECAST_STEPS[0]`` steps, one session.
ENSEMBLE = 16


def forecast_totals(results: list[dict[str, Any]]) -> str:
    """Total seconds of whole forecasts, eager vs compiled, cold and warm.

    Derived from the rows: first step + (N - 1) x median step. The ensemble row is
    ``ENSEMBLE`` members of ``FORECAST_STEPS[0]`` steps run in one session, so it
    compiles once.
    """
    header = ["model", "mode", "cache"] + [f"{n} steps s" for n in FORECAST_STEPS]
    header.append(f"{ENSEMBLE}x{FORECAST_STEPS[0]} ens. s")
    rows = []
    for r in results:
        if "error" in r or r.get("steady_ms") is None:
            continue
        counts = [*FORECAST_STEPS, ENSEMBLE * FORECAST_STEPS[0]]
        totals = [r["first_step_s"] + (n - 1) * r["steady_ms"] / 1e3 for n in counts]
        rows.append(
            [model_label(r), r["mode"], r.get("cache") or ""]
            + [f"{t:.2f}" for t in totals]
        )
    return format_table(header, rows)


def _worst(pair: list | None) -> str:
    """A variable and its relative L2, e.g. ``q200 3.9e-02``; ``-`` if none."""
    return "-" if not pair else f"{pair[0]} {pair[1]:.1e}"


def _row(r: dict[str, Any]) -> list[str]:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    if "error" in r:
        return [model_label(r), r["mode"], "", "error: " + r["error"][:60]] + [""] * 11
    regions = (r.get("report") or {}).get("regions", [])
    graphs = sum(x["graphs"] for x in regions) if regions else None
    breaks = sum(x["graph_breaks"] for x in regions) if regions else None
    recompiles = sum(x["recompiles"] for x in regions) if regions else None
    status = ",".join(sorted({x["status"] for x in regions})) if regions else "eager"
    mem = r.get("peak_gpu_bytes")
    return [
        model_label(r),
        r["mode"],
        r.get("cache") or "",
        status,
        f(r["first_step_s"], ".2f"),
        f(r["steady_ms"], ".2f"),
        f(r.get("speedup"), ".2f"),
        f(r.get("break_even_steps"), ".0f"),
        f(mem / 2**30 if mem else None, ".2f"),
        f"{f(graphs, 'd')}/{f(breaks, 'd')}/{f(recompiles, 'd')}",
        f(r.get("rel_l2_first"), ".1e"),
        _worst(r.get("rel_l2_first_worst")),
        f(r.get("rel_l2_10"), ".1e"),
        f(r.get("rel_l2_last"), ".1e"),
        f(r.get("e2e_s"), ".2f"),
    ]


HEADER = [
    "model",
    "mode",
    "cache",
    "status",
    "first s",
    "ms/step",
    "speedup",
    "break-even",
    "peak GiB",
    "graphs/breaks/recomp",
    "relL2@1",
    "worst var@1",
    "relL2@10",
    "relL2@N",
    "e2e s",
]


def table(results: list[dict[str, Any]]) -> str:
    """Plain-text table of the results."""
    return format_table(HEADER, [_row(r) for r in results])


def _phases(r: dict[str, Any]) -> str:
    """``"; bundle_load 0.31 s, dynamo 2.10 s, ..."`` summed over regions."""
    total: dict[str, float] = {}
    for region in (r.get("report") or {}).get("regions", []):
        for k, v in (region.get("phases") or {}).items():
            total[k] = total.get(k, 0.0) + v
    return "".join(f", {k} {v:.2f} s" for k, v in total.items()).replace(", ", "; ", 1)


def _start_kind(r: dict[str, Any]) -> str:
    if r.get("cache") != "aot":
        return "warm start"
    built = f" (built beforehand in {r['build_s']:.0f} s)" if r.get("build_s") else ""
    return f"ahead-of-time start{built}"


def _precision_of(r: dict[str, Any]) -> str:
    return f" {r['precision']}" if r.get("precision") else ""


def warm_lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per warm start: first step warm vs cold, and where it went."""
    return [
        f"{_start_kind(r)} {r['model']} {r['mode']}{_precision_of(r)}: first step "
        f"{r['first_step_s']:.2f} s vs "
        f"{r['first_step_s'] / r['warm_over_cold']:.2f} s cold "
        f"({100 * r['warm_over_cold']:.0f}%){_phases(r)}"
        for r in results
        if r.get("warm_over_cold")
    ]


def render(paths: list[Path], plot_path: Path | None) -> int:
    """Print (and plot) the merged results of earlier ``--json`` files."""
    runs = [json.loads(p.read_text()) for p in paths]
    results = [r for run in runs for r in run.get("results", [])]
    ensemble = [r for run in runs for r in run.get("ensemble", [])]
    if results:
        print(table(results))
        print("\n".join(warm_lines(results)))
        print(forecast_totals(results))
    if ensemble:  # --ensemble runs, merged: the summary compares across files
        from earth2studio_compile.tools.bench.ensemble import tables

        print(tables(ensemble))
    for p, run in zip(paths, runs):
        env = run["environment"]
        print(
            f"{p.name}: {env.get('gpu', 'CPU')}, driver {env.get('driver')}, torch "
            f"{env['torch']}, triton {env['triton']}, {env['date']}"
        )
    if plot_path:
        from earth2studio_compile.tools.bench.plot import plot

        plot(results, plot_path, title=runs[0]["environment"].get("gpu", "CPU"))
    return 0
