"""The bench's ``--attention``: a compiled run's attention choice instead of the
model table's (``kernels`` and the rollout mode), to measure a choice before the
table makes it."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from earth2studio_compile.options import attention_backends

HELP = (
    "compiled runs' attention choice instead of the model table's: comma-separated "
    "SDPA backends and 'flex' (e.g. flex,math)"
)


def parse_attention(text: str) -> tuple[str, ...]:
    """``--attention``'s value as checked names (argparse shows the message)."""
    try:
        return attention_backends(text.split(","), "--attention")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


@contextlib.contextmanager
def attention_choice(model: Any, names: tuple[str, ...] | None) -> Iterator[None]:
    """The model's table entry with ``names`` as its attention choice while the
    block runs (None: the entry's own), put back after, also on an exception.

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
