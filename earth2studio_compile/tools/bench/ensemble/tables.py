"""The ensemble mode's tables: per row, the breakdown, the summary, the largest batch.

:func:`summarize` derives the ratios (throughput over upstream eager at its best
batch size, ``async-zarr`` over its ``zarr-disk`` twin) and the largest batch that
fit; :func:`tables` prints them with each row and its breakdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from earth2studio_compile.tools.bench.ensemble.breakdown import STEP
from earth2studio_compile.tools.bench.ensemble.upstream import (
    COMPILED,
    EAGER,
    EAGER_TF32,
)
from earth2studio_compile.tools.bench.text import format_table


def label(r: dict[str, Any]) -> str:
    """``eager``, ``eager-tf32`` or ``compiled tf32``."""
    return f"{r['run']} {r['precision']}" if r["run"] == COMPILED else r["run"]


def row_kind(r: dict[str, Any]) -> tuple[Any, ...]:
    """What a row is, batch size aside: model, IO, outputs, run, precision."""
    return (r["model"], r["io"], r["outputs"], r["run"], r.get("precision"))


def measured(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with a throughput (no prime, no error)."""
    return [r for r in rows if not r.get("prime") and "member_steps_per_s" in r]


def _best(rows: list[dict[str, Any]], r: dict[str, Any], run: str) -> dict | None:
    same = [
        x
        for x in rows
        if x["run"] == run
        and (x["model"], x["io"], x["outputs"]) == (r["model"], r["io"], r["outputs"])
    ]
    return max(same, key=lambda x: x["member_steps_per_s"], default=None)


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Ratios per row and the largest batch that fit per kind.

    Returns
    -------
    dict[str, Any]
        ``rows``: per measured row, ``vs_eager`` and ``vs_eager_tf32`` (its
        throughput over the best batch size of upstream eager fp32 / TF32 with the
        same model, IO and outputs; first step included) and ``async_vs_zarr`` (an
        ``async-zarr`` row over its ``zarr-disk`` twin); ``largest_batch``: per kind,
        the largest batch size that ran and whether a larger one ran out of memory
    """
    done = measured(rows)
    out_rows = []
    for r in done:
        entry = {k: r[k] for k in ("model", "io", "outputs", "run", "precision")}
        entry["batch_size"] = r["batch_size"]
        for run, key in ((EAGER, "vs_eager"), (EAGER_TF32, "vs_eager_tf32")):
            best = _best(done, r, run)
            entry[key] = (
                r["member_steps_per_s"] / best["member_steps_per_s"] if best else None
            )
            entry[f"{key}_batch"] = best["batch_size"] if best else None
        twin = next(
            (
                x
                for x in done
                if r["io"] == "async-zarr"
                and x["io"] == "zarr-disk"
                and row_kind(x)[2:] == row_kind(r)[2:]
                and x["model"] == r["model"]
                and x["batch_size"] == r["batch_size"]
            ),
            None,
        )
        entry["async_vs_zarr"] = (
            r["member_steps_per_s"] / twin["member_steps_per_s"] if twin else None
        )
        out_rows.append(entry)
    largest: dict[str, Any] = {}
    for r in rows:
        if r.get("prime"):
            continue
        key = " ".join(str(x) for x in row_kind(r) if x is not None)
        entry = largest.setdefault(key, {"fits": None, "oom_at": None})
        if "member_steps_per_s" in r:
            entry["fits"] = max(entry["fits"] or 0, r["batch_size"])
        if r.get("oom"):
            entry["oom_at"] = min(entry["oom_at"] or r["batch_size"], r["batch_size"])
    return {"rows": out_rows, "largest_batch": largest}


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _vs(ratio: float | None, batch: int | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f} (B={batch})"


ROW_HEADER = [
    "model",
    "io",
    "out",
    "run",
    "cache",
    "B",
    "mem-steps/s",
    "steady/s",
    "first s",
    "GiB/member",
    "relL2@1",
    "wall s",
]


def row_line(r: dict[str, Any]) -> list[str]:
    """One row of the measurement table."""
    head = [r["model"], r["io"], r["outputs"], label(r), r.get("cache") or ""]
    head.append(str(r["batch_size"]))
    if "error" in r or r.get("skipped"):
        return (
            head
            + [
                ("OOM: " if r.get("oom") else "")
                + (r.get("error") or r["skipped"])[:70]
            ]
            + [""] * 5
        )
    if r.get("prime"):
        return head + ["(prime)", "-", _f(r["first_step_s"], ".2f"), "-", "-", "-"]
    mem = r.get("peak_gpu_bytes_per_member")
    return head + [
        _f(r["member_steps_per_s"], ".2f"),
        _f(r["steady_member_steps_per_s"], ".2f"),
        _f(r["first_step_s"], ".2f"),
        _f(mem / 2**30 if mem else None, ".2f"),
        _f(r.get("rel_l2_first"), ".1e"),
        _f(r["wall_s"], ".2f"),
    ]


#: The compiled precision whose floors an eager row is set beside.
_FLOOR_OF = {EAGER: "fp32", EAGER_TF32: "tf32"}


def floors_of(r: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict | None:
    """The floors a row is set beside: its own (compiled rows measure them), else
    those of a compiled row of the same model, outputs and batch size, on the same
    IO and in the same precision where there is one."""
    if r.get("floors"):
        return r["floors"]  # type: ignore[no-any-return]
    same = [
        x
        for x in rows
        if x.get("floors")
        and (x["model"], x["outputs"], x["batch_size"])
        == (r["model"], r["outputs"], r["batch_size"])
    ]
    want = (r["io"], _FLOOR_OF.get(r["run"], r.get("precision")))
    same.sort(key=lambda x: (x["io"], x.get("precision")) != want)
    return same[0]["floors"] if same else None


def step_ms(b: dict[str, float]) -> float:
    """A breakdown's ms per batched step: its phases but the perturbation (once per
    batch, in the setup)."""
    return sum(b[f"{p}_ms"] for p in STEP if p != "perturb")


def _breakdown(rows: Sequence[dict[str, Any]]) -> str:
    """The per-step table: each phase, beside the compute and storage floors."""
    header = ["model", "io", "out", "run", "B", *(f"{p} ms" for p in STEP), "setup s"]
    header += ["step ms", "compute floor ms", "storage floor ms", "step/floor"]
    header.append("wall/floor")
    lines = []
    for r in measured(rows):
        b = r.get("breakdown")
        if not b:
            continue
        f = floors_of(r, rows) or {}
        step = step_ms(b)
        lines.append(
            [r["model"], r["io"], r["outputs"], label(r), str(r["batch_size"])]
            + [f"{b[f'{p}_ms']:.1f}" for p in STEP]
            + [f"{b['setup_s']:.2f}", f"{step:.1f}"]
            + [_f(f.get("compute_ms"), ".1f"), _f(f.get("storage_ms"), ".1f")]
            + [_f(step / f["floor_ms"] if f else None, ".2f")]
            + [_f(r["wall_s"] / f["floor_s"] if f else None, ".2f")]
        )
    if not lines:
        return ""
    return (
        "\n\nPer batched step (one batch, synchronized around each phase), beside "
        "the floors measured in the compiled row's process: compute = the compiled "
        "model step alone; storage = the store's bytes written with numpy.save from "
        "parallel writers, over the model steps; wall/floor = the whole run over "
        "model steps x (compute + storage):\n" + format_table(header, lines)
    )


def tables(rows: Sequence[dict[str, Any]]) -> str:
    """The measurement table, the breakdown beside the floors, the summary and the
    largest batches."""
    text = format_table(ROW_HEADER, [row_line(r) for r in rows])
    text += _breakdown(rows)
    s = summarize(rows)
    header = ["model", "io", "out", "run", "B", "vs eager fp32", "vs eager tf32"]
    header.append("async/zarr")
    lines = []
    for e in s["rows"]:
        lines.append(
            [e["model"], e["io"], e["outputs"], label(e), str(e["batch_size"])]
            + [
                _vs(e["vs_eager"], e["vs_eager_batch"]),
                _vs(e["vs_eager_tf32"], e["vs_eager_tf32_batch"]),
                _f(e["async_vs_zarr"], ".2f"),
            ]
        )
    if lines:
        text += (
            "\n\nThroughput (members x steps per second, first step included) over "
            "upstream eager at its best batch size:\n" + format_table(header, lines)
        )
    fits = [
        f"{k}: largest batch run {v['fits']}"
        + (f", out of memory at {v['oom_at']}" if v["oom_at"] else "")
        for k, v in s["largest_batch"].items()
    ]
    return text + ("\n\n" + "\n".join(fits) if fits else "")
