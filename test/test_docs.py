"""Every Python block of the README and the user guide that runs on a CPU runs here.

Blocks run in order, each file in its own namespace, after the user guide's block
marked ``<!-- setup: ... -->`` (the offline model and data). A block preceded by
``<!-- no-test: why -->`` is skipped: it downloads, needs a GPU, or names classes of
the reader's own. A compile failure inside a block is a fallback, not an exception,
so any WARNING that a region fell back fails the test too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from loguru import logger

ROOT = Path(__file__).parents[1]
DOCS = ("README.md", "docs/user-guide.md")
_FENCE = re.compile(
    r"(?:^<!-- (?P<mark>[\w-]+):?[^\n]*-->\n)?^```python\n(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


def blocks(path: str) -> list[tuple[str | None, str, int]]:
    """``(mark, code, line)`` of each Python block; ``mark`` names its HTML comment."""
    text = (ROOT / path).read_text()
    return [
        (m["mark"], m["code"], text.count("\n", 0, m.start("code")) + 1)
        for m in _FENCE.finditer(text)
    ]


def _setup() -> str:
    found = [c for mark, c, _ in blocks("docs/user-guide.md") if mark == "setup"]
    assert len(found) == 1, "the user guide needs one <!-- setup --> block"
    return found[0]


def test_every_block_is_run_or_says_why_not():
    for path in DOCS:
        for mark, _, line in blocks(path):
            assert mark in (None, "setup", "no-test"), f"{path}:{line}: {mark}"
    runnable = [b for path in DOCS for b in blocks(path) if b[0] != "no-test"]
    assert len(runnable) >= 5


@pytest.mark.parametrize("path", DOCS)
def test_doc_blocks_run_on_cpu(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    namespace: dict = {"__name__": "__doc_block__"}
    try:
        exec(compile(_setup(), "user-guide setup", "exec"), namespace)
        for mark, code, line in blocks(path):
            if mark is None:
                exec(compile(code, f"{path}:{line}", "exec"), namespace)
                fell_back = [w for w in warnings if "stays eager" in w]
                assert not fell_back, f"{path}:{line}: {fell_back}"
    finally:
        logger.remove(sink)
    # Each block that writes has a store of its own: none rewrites another's arrays.
    rewritten = [w for w in warnings if "already in Zarr Store" in w]
    assert not rewritten, f"{path}: {len(rewritten)} x {rewritten[:1]}"


def test_the_offline_source_gives_the_same_data_for_the_same_request():
    import numpy as np

    from earth2studio_compile.tools import zoo

    data = zoo.random_source(zoo.build("toy"))
    t0, t6 = np.datetime64("2024-01-01T00:00"), np.datetime64("2024-01-01T06:00")
    first = data(np.array([t0]), ["a", "b"])
    np.random.seed(1)  # the global generator plays no part
    again = data(np.array([t0]), ["a", "b"])
    np.testing.assert_array_equal(first.values, again.values)
    later = data(np.array([t6]), ["a", "b"])
    assert not np.allclose(first.values, later.values)
    assert not np.allclose(first.values[0, 0], first.values[0, 1])
    # The same field, whatever else is requested with it.
    both = data(np.array([t0, t6]), ["b"])
    np.testing.assert_array_equal(both.values[0, 0], first.values[0, 1])
    assert first.dims[:2] == ("time", "variable") and first.shape[2:] == (16, 32)


def test_compiled_and_eager_agree_through_the_offline_helpers():
    import torch
    from earth2studio.io import KVBackend

    from earth2studio_compile.run import deterministic
    from earth2studio_compile.tools import zoo

    model = zoo.build("toy")
    data = zoo.random_source(model)
    out = {}
    for compiled in (False, True):  # no reseeding in between, as a user would
        io = KVBackend()
        deterministic(
            ["2024-01-01"], 2, model, data, io, verbose=False, compile=compiled
        )
        out[compiled] = {k: v.clone() for k, v in io.root.items()}
    for name, eager in out[False].items():
        torch.testing.assert_close(out[True][name], eager, rtol=1e-5, atol=1e-5)


# Measured figures: one source (the benchmark's JSON), each figure once, rendered.


def test_every_figure_block_matches_its_json():
    from earth2studio_compile.tools.bench import figures

    problems = figures.check()
    assert not problems, (
        "\n".join(problems)
        + "\nRun python -m earth2studio_compile.tools.bench.figures to re-render."
    )


@pytest.mark.parametrize("path", ("README.md", "docs/*.md"))
def test_no_timing_outside_the_figure_blocks(path):
    from earth2studio_compile.tools.bench import figures

    found = {
        str(p.relative_to(ROOT)): figures.stray(p.read_text())
        for p in sorted(ROOT.glob(path))
    }
    assert found, f"no file matches {path}"
    stray = {p: s for p, s in found.items() if s}
    assert not stray, (
        f"timings outside the rendered blocks: {stray}. Link to the block that holds "
        "the figure instead of repeating it, or render a new JSON "
        "(figure_catalog.FIGURES)."
    )


def test_the_checks_catch_a_changed_json_and_a_stray_figure(tmp_path):
    import shutil

    from earth2studio_compile.tools.bench import figures

    for doc in figures.DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    shutil.copytree(ROOT / figures.BENCH, tmp_path / figures.BENCH)
    assert figures.check(tmp_path) == []
    second = tmp_path / figures.BENCH / "2026-11-25-h100/second_call.json"
    data = second.read_text()
    second.write_text(data.replace('"wall_s": 5.4001', '"wall_s": 4.4001', 1))
    assert figures.check(tmp_path) == [
        "README.md: figures:second-call differs from its JSON"
    ]
    assert figures.stray("DLWP 7.32 → 2.48 ms/step (2.95x), 16.74 ms, 6.50 s") == [
        "line 1: 2.48 ms",
        "line 1: 2.95x",
        "line 1: 16.74 ms",
        "line 1: 6.50 s",
    ]
    assert figures.stray("a 720x1440 grid; FCN >= 1.2x per step; (default 300)") == []
    # A figure inside a block is the block's business.
    text = (tmp_path / "README.md").read_text()
    assert "s |" in text and figures.stray(text) == []
