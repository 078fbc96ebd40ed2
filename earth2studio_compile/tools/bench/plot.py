"""The benchmark figure: ms/step per model, and cumulative time with the break-even."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from earth2studio_compile.tools.bench.text import model_label


def plot(results: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Write a two-panel PNG.

    Parameters
    ----------
    results : list[dict]
        Measurements from the CLI (eager and compiled rows)
    path : Path
        PNG to write
    title : str, optional
        Figure title
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if "error" not in r]
    models = list(dict.fromkeys(model_label(r) for r in ok))
    # Warm rows differ from cold ones only in the first step: no bar of their own.
    modes = list(dict.fromkeys(r["mode"] for r in ok if r.get("cache") != "warm"))
    fig, (bars, cumul) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        values = [
            next(
                (
                    r["steady_ms"]
                    for r in ok
                    if model_label(r) == m
                    and r["mode"] == mode
                    and r.get("cache") != "warm"
                ),
                np.nan,
            )
            for m in models
        ]
        bars.bar(np.arange(len(models)) + j * width, values, width, label=mode)
    bars.set_xticks(np.arange(len(models)) + width * (len(modes) - 1) / 2, models)
    bars.set_ylabel("ms per step (median, steady state)")
    bars.set_yscale("log")
    bars.legend()
    bars.set_title("Per-step time")
    # Measured steps, then extended with the median step time far enough to show
    # where (if anywhere) the compiled line crosses the eager one.
    evens = [b for r in ok if (b := r.get("break_even_steps"))]
    horizon = int(min(1e5, max([len(ok[0]["step_s"]), *(2 * b for b in evens)])))
    steps = np.unique(np.geomspace(1, horizon, 200).astype(int))
    for i, model in enumerate(models):
        for r in (r for r in ok if model_label(r) == model):
            measured = np.cumsum(r["step_s"])
            extra = np.maximum(steps - len(measured), 0) * r["steady_ms"] / 1e3
            within = measured[np.minimum(steps, len(measured)) - 1]
            cum = np.where(steps <= len(measured), within, measured[-1] + extra)
            style = {"eager": "--", "warm": ":"}.get(r.get("cache") or r["mode"], "-")
            label = f"{model} {r['mode']} {r.get('cache') or ''}".rstrip()
            cumul.plot(steps, cum, style, color=f"C{i}", label=label)
    cumul.set_xlabel("forecast steps (measured, then extended at the median step time)")
    cumul.set_ylabel("cumulative seconds (first step includes compile)")
    cumul.set_xscale("log")
    cumul.set_yscale("log")
    cumul.set_title("Cumulative time: compiled pays back where lines cross")
    cumul.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
