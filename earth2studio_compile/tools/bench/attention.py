"""The bench's ``--attention``: a compiled run's attention choice instead of the
model table's (``kernels`` and the rollout mode), to measure a choice before the
table makes it."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from earth2studio_compile.options import attention_backends
from earth2studio_compile.tools.bench.tables import markdown

HELP = (
    "compiled runs' attention choice instead of the model table's: comma-separated "
    "SDPA backends and 'flex' (e.g. flex,math; flex on CUDA only)"
)


def parse_attention(text: str) -> tuple[str, ...]:
    """``--attention``'s value as checked names (argparse shows the message)."""
    try:
        return attention_backends(text.split(","), "--attention")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


@contextlib.contextmanager
def attention_choice(model: Any, names: Sequence[str] | None) -> Iterator[None]:
    """The model's table entry with ``names`` as its attention choice while the
    block runs (None: the entry's own; a spec's list or ``--attention``'s tuple),
    put back after, also on an exception.

    Raises
    ------
    ValueError
        The model has no table entry to change
    """
    from earth2studio_compile.models import MODEL_TABLE, lookup

    if names is None:
        yield
        return
    found = lookup(model)
    if found is None:
        raise ValueError(
            f"--attention: {type(model).__name__} has no model table entry to "
            "change; drop --attention for it"
        )
    key, spec = found
    MODEL_TABLE[key] = dataclasses.replace(spec, attention_backends=tuple(names))
    try:
        yield
    finally:
        MODEL_TABLE[key] = spec


def attention_calls(datas: Sequence[Mapping[str, Any]]) -> str:
    """Figure renderer: one attention call per stage, mask and way (the rows of
    ``docs/bench/2026-11-30-h200-fortyfirst/swin_attention.py``), with each way's
    speed against eager SDPA's on the same call."""
    found = [r for d in datas for r in d["rows"] if "median_ms" in r]
    eager = {
        (r["stage"], r["masked"]): r["median_ms"] for r in found if r["way"] == "sdpa"
    }
    rows = [
        [
            r["stage"],
            "yes" if r["masked"] else "no",
            f"{r['windows']} x {r['heads']}",
            r["way"],
            f"{r['median_ms']:.3f}",
            f"{r['tflops']:.1f}",
            f"{eager[(r['stage'], r['masked'])] / r['median_ms']:.2f}x",
            f"{r['rel_l2']:.1e}",
        ]
        for r in found
    ]
    header = ["stage", "masked", "windows x heads", "way", "ms a call", "TFLOP/s"]
    header += ["vs eager SDPA", "rel. L2 vs fp32"]
    note = (
        "\n\nOne call, median of `torch.utils.benchmark` runs (which synchronize "
        "CUDA); fp32 tensors with TF32 matmuls, windows of 144 tokens, heads of 64; "
        "rel. L2 against fp32 eager with TF32 off."
    )
    return markdown(header, rows) + note
