"""The demo and a first import say what is true, labelled, and nothing else."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


# A loaded machine, simulated: the session's per-call speed probe, if the demo ran
# it, would time every compiled call 100x slower and log "runs slower compiled".
_SLOW_PROBE = """
import sys
from earth2studio_compile.region import SpeedProbe
record = SpeedProbe.record
def slow(self, kind, seconds):
    record(self, kind, seconds * (100 if kind == "compiled" else 1))
SpeedProbe.record = slow
from earth2studio_compile.tools.demo import main
sys.exit(main(sys.argv[1:]))
"""


def _demo(
    *args: str, slow_probe: bool = False, **env: str
) -> subprocess.CompletedProcess:
    """The README's demo command on the toy model, in a fresh process."""
    command = (
        ["-c", _SLOW_PROBE] if slow_probe else ["-m", "earth2studio_compile.tools.demo"]
    )
    proc = subprocess.run(
        [sys.executable, *command, "--model", "toy"] + ["--device", "cpu", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess:
    # 8 steps: the session's per-call speed probe needs calls 3 to 7. The precision
    # rows are the GPU demo's (fp32 and a fast precision side by side); bf16 autocast
    # also runs on a CPU.
    return _demo(
        "--steps", "8", "--repeats", "2", "--precision", "fp32,bf16", slow_probe=True
    )


def test_speedup_is_a_result_only_outside_the_spread():
    from earth2studio_compile.tools.demo import speedup_text

    faster = speedup_text([10.0, 12.0, 11.0], [5.0, 5.0, 5.0])
    assert faster == "2.20x (2.00-2.40x over 3 rollouts)"
    hidden = speedup_text([1.0, 1.2, 0.9], [1.1, 1.0, 1.0])
    assert hidden.startswith("no measurable difference")
    assert "0.90-1.20x over 3 rollouts" in hidden
    assert "no spread" in speedup_text([2.0], [1.0])


def test_demo_labels_what_each_figure_measures(demo):
    out = demo.stdout
    assert "Time per whole forecast step (core network and coordinate code)" in out
    assert "median of steps 2..8 in each rollout" in out
    assert "The speedup is the whole step's, from these rollouts" in out
    # Each timing row shows its spread over the 2 rollouts.
    for name in ("eager fp32", "compiled fp32", "eager bf16", "compiled bf16"):
        assert re.search(
            rf"^  {name} +\d+\.\d+ ms/step \(\d+\.\d+-\d+\.\d+\)", out, re.M
        )
    for precision in ("fp32", "bf16"):
        speedup = re.search(rf"^  speedup {precision} +(.*)$", out, re.MULTILINE)
        assert speedup, out
        assert re.fullmatch(
            r"no measurable difference \(eager/compiled .* over 2 rollouts\)"
            r"|\d+\.\d+x \(\d+\.\d+-\d+\.\d+x over 2 rollouts\)",
            speedup.group(1),
        ), speedup.group(1)


def test_demo_gives_one_verdict(demo):
    # The probe saw compiled calls 100x slower (injected): had the demo run it, its
    # WARNING and per-call figures would sit beside the table's own verdict.
    out = demo.stdout + demo.stderr
    verdicts = re.findall(r"^  speedup \S+ +(.*)$", demo.stdout, re.MULTILINE)
    assert verdicts and all(
        v.startswith("no measurable difference") or re.match(r"\d+\.\d+x", v)
        for v in verdicts
    ), verdicts
    for contradiction in ("slower", "does not pay", "per call"):
        assert contradiction not in out, out


def test_demo_prints_no_colour_codes_into_a_file(demo):
    assert "\x1b[" not in demo.stdout + demo.stderr


def test_demo_colours_only_on_a_terminal(monkeypatch):
    import io

    from loguru import logger

    from earth2studio_compile.tools.demo import show_logs

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, coloured in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stdout", stream)
        handler = show_logs("INFO")
        try:
            logger.info("hello")
        finally:
            logger.remove(handler)
        # Earth2Studio's own handler (installed at its import) may write here too,
        # always in colour: the demo removes it; only a plain line tells ours apart.
        lines = [line for line in stream.getvalue().splitlines() if "hello" in line]
        assert lines
        plain = [line for line in lines if "\x1b[" not in line]
        assert bool(plain) != coloured, lines


def test_banner_comes_before_earth2studio_is_imported():
    # The first import of Earth2Studio takes a minute on a small machine: the demo
    # says so first. Stop the demo at that import and look at what it printed.
    script = """
import builtins, sys
from earth2studio_compile.tools import demo
assert not any(m.split(".")[0] == "earth2studio" for m in sys.modules), "too early"
real = builtins.__import__
def guard(name, *args, **kwargs):
    if name.split(".")[0] == "earth2studio":
        print("IMPORTING earth2studio", flush=True)
        sys.exit(0)
    return real(name, *args, **kwargs)
builtins.__import__ = guard
demo.main(["--model", "toy", "--device", "cpu"])
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    banner = proc.stdout.find("first import takes")
    assert 0 <= banner < proc.stdout.index("IMPORTING earth2studio"), proc.stdout


def test_help_texts_are_plain_text(capsys, monkeypatch):
    # The benchmark's entry point sets this variable before it parses: put it back.
    monkeypatch.delenv("EARTH2STUDIO_COMPILE_BACKGROUND", raising=False)
    from earth2studio_compile.tools.bench.__main__ import main as bench
    from earth2studio_compile.tools.demo import main

    for parse in (main, bench):
        with pytest.raises(SystemExit):
            parse(["--help"])
        out = capsys.readouterr().out
        assert "usage:" in out
        assert "`" not in out, out


def test_demo_leads_with_the_relative_error(demo):
    out = demo.stdout
    head = "Error against eager fp32 (TF32 off), relative L2 after step 1 / step 8:"
    assert head in out
    errors = {}
    for name in ("compiled fp32", "eager bf16", "compiled bf16"):
        row = re.search(rf"^  {name} +(\S+) / (\S+) +\((.*)\)$", out, re.MULTILINE)
        assert row, out
        errors[name] = float(row.group(1))
        # An absolute difference only beside the output's magnitude.
        assert re.fullmatch(
            r"max \|difference\| \S+ where \|output\| reaches \S+", row[3]
        )
    # bf16 rounds to 8 bits of mantissa; compiled fp32 only reorders fp32 arithmetic.
    assert errors["compiled bf16"] > errors["compiled fp32"]
    assert "max |compiled - eager|" not in out


def test_demo_prints_no_speedup_for_a_model_that_ran_eager():
    proc = _demo("--steps", "3", "--repeats", "1", CXX="/nonexistent/g++")
    out = proc.stdout
    assert not re.search(r"speedup +\d", out), out
    line = re.search(r"^  speedup +none: nothing ran compiled \((.*)\)$", out, re.M)
    assert line, out
    assert line.group(1).startswith("GridPrognostic.model fell back to eager: ")
    assert "no working C++ compiler" in line.group(1)
    assert "first step" in out and "(eager)" in out


def test_first_run_has_no_gpu_noise_on_a_cpu_machine(demo):
    # Printed by Warp's native code at physicsnemo's import, and by torch's
    # cpp_extension when Inductor compiles for the CPU: neither concerns a CPU run.
    for text in (demo.stdout, demo.stderr):
        assert "Warp CUDA warning" not in text
        assert "No CUDA runtime is found" not in text
    script = subprocess.run(
        [sys.executable, "-c", "import earth2studio_compile.run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert script.returncode == 0, script.stderr[-3000:]
    assert "Warp CUDA warning" not in script.stderr


def test_cpp_extension_cuda_note_is_dropped_and_nothing_else():
    import earth2studio_compile  # noqa: F401  (installs the filter)

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.seen: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.seen.append(record.getMessage())

    log, keep = logging.getLogger("torch.utils.cpp_extension"), Keep()
    log.addHandler(keep)
    try:
        log.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
        log.warning("Error checking compiler version for %s", "c++")
    finally:
        log.removeHandler(keep)
    assert keep.seen == ["Error checking compiler version for c++"]


def test_whole_call_lines_show_the_compiling_first_call():
    """Issue 30: the per-step table said 1.34x while 20 compiled steps took 23 s
    against 0.08 s eagerly, and nothing on screen said so."""
    from earth2studio_compile.tools.demo import Row, whole_call_lines

    report = {"regions": [{"status": "compiled"}]}
    eager = Row(False, None, call_seconds=[0.08, 0.08, 0.08])
    compiled = Row(True, None, report=report, call_seconds=[23.0, 0.06, 0.06])
    lines = whole_call_lines([eager, compiled], 20)
    assert lines[0].startswith("  Whole rollout of 20 steps")
    assert re.fullmatch(r"  eager +0\.08 s / +0\.08 s", lines[1]), lines[1]
    assert re.fullmatch(r"  compiled +23\.00 s / +0\.06 s  \(compiles\)", lines[2])
    # 22.92 s more at first, 0.02 s saved per later call: even after 1146 calls.
    assert lines[3] == (
        "  compiled: the first call takes +22.92 s against eager, later calls "
        "-0.02 s each (even after 1146 later calls)"
    )
    once = whole_call_lines(
        [Row(False, None, call_seconds=[1.0]), Row(True, None, call_seconds=[2.0])], 5
    )
    assert once[-1] == "  compiled: the first call takes +1.00 s against eager"


def test_demo_prints_whole_calls(demo):
    out = demo.stdout
    assert "Whole rollout of 8 steps (a workflow call's model time)" in out
    for name in ("eager fp32", "compiled fp32", "eager bf16", "compiled bf16"):
        assert re.search(rf"^  {name} +\d+\.\d+ s / +\d+\.\d+ s", out, re.M), out
    for precision in ("fp32", "bf16"):
        assert re.search(
            rf"^  compiled {precision}: the first call takes [+-]\d+\.\d+ s against "
            r"eager, later calls [+-]\d+\.\d+ s each",
            out,
            re.M,
        ), out
