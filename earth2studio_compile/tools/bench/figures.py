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

The blocks are declared in :mod:`.figure_catalog`.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from earth2studio_compile.tools.bench.figure_block import Figure
from earth2studio_compile.tools.bench.figure_catalog import FIGURES

ROOT = Path(__file__).resolve().parents[3]
BENCH = "docs/bench"
DOCS = ("README.md", "docs/performance.md", "docs/user-guide.md", "docs/models.md")
_BLOCK = re.compile(
    r"<!-- figures:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /figures:(?P=name) -->",
    re.DOTALL,
)


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
    if isinstance(env.get("environment"), Mapping):  # the workflow mode's meta
        env = {**env, **env["environment"]}
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
    "at most 540 s": "the bound issue 30 sets for one device call, not a measurement",
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
