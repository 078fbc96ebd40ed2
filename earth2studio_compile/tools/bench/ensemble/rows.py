"""The ensemble mode's plan and loop: one fresh process per row, the JSON after each.

:func:`plan_rows` turns the CLI's arguments into one spec per row; :func:`run_rows`
runs them (each through the CLI's fresh-process runner), skipping larger batches of
a kind that ran out of memory and, with ``--deadline``, rows that could not finish
in the time left (:mod:`..deadline`), and prints :func:`.tables.tables`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.deadline import Deadline
from earth2studio_compile.tools.bench.ensemble.tables import (
    ROW_HEADER,
    label,
    row_kind,
    row_line,
    summarize,
    tables,
)
from earth2studio_compile.tools.bench.ensemble.upstream import (
    COMPILED,
    EAGER,
    EAGER_TF32,
)
from earth2studio_compile.tools.bench.text import format_table


def plan_rows(args: Any) -> list[dict[str, Any]]:
    """One spec per row, in order: per model and IO backend, each batch size's
    eager, eager TF32 (CUDA, unless ``--no-precision-eager``) and compiled rows (a
    cold prime then the warm row, or one cold row with ``--no-warm``), then the
    all-variables rows (``--all-variables``: eager and the last precision compiled,
    at the largest batch size)."""
    size = "small" if args.small else "full"
    runs: list[tuple[str, str | None]] = [(EAGER, None)]
    if args.device == "cuda" and args.precision_eager:
        runs.append((EAGER_TF32, None))
    runs += [(COMPILED, p) for p in args.precision_list or ["fp32", "tf32", "bf16"]]
    specs = []
    for model in args.model_list:
        for io in args.io_list or ["zarr-disk"]:
            outputs = [("few", b) for b in args.batch_list]
            if args.all_variables:
                outputs.append(("all", max(args.batch_list)))
            for kind, b in outputs:
                chosen = runs if kind == "few" else [runs[0], runs[-1]]
                for run, precision in chosen:
                    base = {
                        "model": model,
                        "mode": "ensemble",
                        "run": run,
                        "precision": precision,
                        "size": size,
                        "device": args.device,
                        "nensemble": args.ensemble,
                        "steps": args.steps,
                        "batch_size": b,
                        "io": io,
                        "outputs": kind,
                        # One bundle directory and local cache per compiled config:
                        # the warm row reads what its prime saved, nothing else.
                        "tag": f"{model}-ens-{precision or run}-b{b}".replace(":", "_"),
                    }
                    if run == COMPILED and args.warm:
                        specs.append({**base, "cache": "cold", "prime": True})
                        specs.append({**base, "cache": "warm"})
                    else:
                        specs.append(
                            {**base, "cache": "cold" if run == COMPILED else None}
                        )
    return specs


#: What makes two rows the same kind for ``--deadline``'s estimate.
KIND = ("model", "outputs", "run", "precision", "batch_size", "prime")


def _skip_reason(spec: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """A larger batch of a kind that ran out of memory is not tried."""
    for r in rows:
        if (
            r.get("oom")
            and row_kind(r) == row_kind(spec)
            and spec["batch_size"] > r["batch_size"]
        ):
            return f"skipped: batch {r['batch_size']} ran out of memory"
    return None


def run_rows(
    args: Any,
    env: dict[str, Any],
    run_one: Callable[[dict[str, Any], int, Path], dict[str, Any]],
) -> int:
    """The ensemble mode's loop: one fresh process per row, the JSON after each.

    Parameters
    ----------
    args : argparse.Namespace
        The CLI's parsed arguments
    env : dict[str, Any]
        Hardware and versions
    run_one : Callable
        Runs one spec in a fresh process (the CLI's ``_run_one``)

    Returns
    -------
    int
        The exit status: 1 if a row failed other than by running out of memory
    """
    from tqdm import tqdm

    specs = plan_rows(args)
    rows: list[dict[str, Any]] = []
    # A row's time grows with its batch: only the same kind and batch size tells.
    deadline = Deadline(getattr(args, "deadline", None), KIND)
    with (
        tempfile.TemporaryDirectory() as tmp,
        tqdm(total=len(specs), desc="ensemble") as bar,
    ):
        for spec in specs:
            bar.set_postfix_str(f"{spec['model']} {label(spec)} B={spec['batch_size']}")
            skipped = _skip_reason(spec, rows) or deadline.skip(spec, rows)
            name = "-".join(str(spec[k]) for k in ("model", "io", "outputs"))
            ref = Path(tmp) / f"ref-{name.replace(':', '_')}-b{spec['batch_size']}.pt"
            spec = {
                **spec,
                "reference": str(ref),
                "save_reference": spec["run"] == EAGER,
                "workdir": tmp,
            }
            if skipped:
                result = {**spec, "skipped": skipped}
            else:
                start = time.perf_counter()
                timeout = max(1, int(deadline.timeout(args.timeout)))
                result = run_one(spec, timeout, Path(tmp))
                result["process_s"] = time.perf_counter() - start
            for key in ("reference", "save_reference", "workdir"):
                result.pop(key, None)
            rows.append(result)
            bar.write(format_table(ROW_HEADER, [row_line(result)]).splitlines()[-1])
            if args.json:
                payload = {
                    "environment": env,
                    "argv": sys.argv,
                    "ensemble": rows,
                    "summary": summarize(rows),
                }
                args.json.write_text(json.dumps(payload, indent=2))
            bar.update(1)
    print(tables(rows))
    print(
        f"\n{env.get('gpu') or 'CPU'}, torch {env['torch']}, earth2studio "
        f"{env.get('earth2studio')}, {args.ensemble} members x {args.steps} steps, "
        f"{'small' if args.small else 'full'} models, {env['date']}"
    )
    failed = [r for r in rows if "error" in r and not r.get("oom")]
    return 1 if failed else 0
