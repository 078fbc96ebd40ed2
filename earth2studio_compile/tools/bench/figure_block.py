"""One figure block of the docs: its name, document, JSON files and renderer
(:mod:`.figure_catalog` lists them, :mod:`.figures` renders them)."""

from __future__ import annotations

from dataclasses import dataclass

from earth2studio_compile.tools.bench.tables import Renderer

__all__ = ["Figure"]


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
