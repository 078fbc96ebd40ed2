"""Plain-text tables, the benchmark's one output format for terminals and logs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def model_label(result: Mapping[str, Any]) -> str:
    """A result's model name, marked with its precision (``--precision``), or ``fp32``
    when TF32 was off (``--fp32``).

    Runs of one model at two precisions are different comparisons: tables and plots
    keep them apart.
    """
    if result.get("precision"):
        return f"{result['model']} {result['precision']}"
    return f"{result['model']} fp32" if result.get("fp32") else str(result["model"])


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart, a dashed rule under the header.

    Parameters
    ----------
    header : Sequence[str]
        Column names
    rows : Sequence[Sequence[str]]
        Cells, already formatted

    Returns
    -------
    str
        The table, without a trailing newline
    """
    table = [list(header), *(list(map(str, row)) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
