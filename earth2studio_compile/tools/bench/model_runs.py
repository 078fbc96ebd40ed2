"""Issue 33's column of the model table: where each entry was run, and what it gave.

One row per Earth2Studio class of the model table
(:func:`earth2studio_compile.models.shipped_entries`),
with the strongest evidence the records under ``docs/bench/`` hold for it:

1. speed at published size on a GPU: a rollout of the bench CLI (``results``), one
   of the figure's sources;
2. a GPU test at published size (``test_published_*``): its JUnit record,
   :data:`GPU_TESTS`, passed or failed as recorded; a failed one comes first, and
   its row shows no speed (a wrong answer outranks any);
3. a CPU test at a small size through Earth2Studio's own wrapper: :data:`CPU_TESTS`;
4. else ``read only``: the entry comes from reading the class's source.

Beside it, from the rollouts: compiled per step over eager in the same precision
(TF32, bf16), the relative L2 after step 1 against fp32 eager with TF32 off, and
the first step of eager and of the compiled row (the first-call cost).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from earth2studio_compile.models import shipped_entries
from earth2studio_compile.tools.bench.tables import number

__all__ = ["CPU_TESTS", "GPU_TESTS", "ZOO_CLASSES", "junit_outcome", "model_runs"]

ROOT = Path(__file__).resolve().parents[3]

# The zoo's name of each model that stands for an Earth2Studio class (``sfno`` and
# ``toy`` are user-style models: no class of the table).
ZOO_CLASSES: dict[str, str] = {
    "fcn": "FCN",
    "dlwp": "DLWP",
    "persistence": "Persistence",
    "aurora": "Aurora",
    "stormcast": "StormCast",
    "ace2": "ACE2ERA5",
    "dlesym": "DLESyM",
    "dlesym-latlon": "DLESyMLatLon",
    "aifs2ens": "AIFS2ENS",
    "fcn3": "FCN3",
}

# The test module that runs each class through compile=True on the CPU, small.
CPU_TESTS: dict[str, str] = {
    "FCN": "test/test_run.py",
    "DLWP": "test/test_run.py",
    "Persistence": "test/test_run.py",
    "Aurora": "test/tools/zoo/test_aurora.py",
    "StormCast": "test/tools/zoo/test_stormcast.py",
    "ACE2ERA5": "test/tools/zoo/test_ace2.py",
    "DLESyM": "test/tools/zoo/test_dlesym.py",
    "DLESyMLatLon": "test/tools/zoo/test_dlesym.py",
    "AIFS2ENS": "test/tools/zoo/test_aifs.py",
    "FCN3": "test/tools/zoo/test_fcn3.py",
}

# The latest GPU run at published size of each class's ``test_published_*`` test:
# its JUnit record under docs/bench/ and the test's name.
GPU_TESTS: dict[str, tuple[str, str]] = {
    "Aurora": (
        "2026-11-30-h200-fortyfirst/gpu-suite-1b652ea.xml",
        "test_published_aurora_on_the_gpu_matches_eager",
    ),
    "StormCast": (
        "2026-11-30-h200-fortyfirst/gpu-suite-1b652ea.xml",
        "test_published_stormcast_on_the_gpu_matches_eager",
    ),
    "ACE2ERA5": (
        "2026-11-29-h200-twentyninth/ace2-gpu-740bdf0.xml",
        "test_published_ace2_on_the_gpu_matches_eager",
    ),
    "DLESyM": (
        "2026-11-29-h200-twentyseventh/dlesym-gpu-70e27ba.xml",
        "test_published_dlesym_on_the_gpu_matches_eager[dlesym]",
    ),
    "AIFS2ENS": (
        "2026-11-29-h200-twentyseventh/aifs-gpu-70e27ba.xml",
        "test_published_aifs2ens_on_the_gpu_matches_eager",
    ),
    "FCN3": (
        "2026-11-29-h200-twentysixth/fcn3-gpu-5562bf9.xml",
        "test_published_fcn3_on_the_gpu_matches_eager",
    ),
}

_MACHINE = re.compile(r"^(\d{4}-\d{2}-\d{2})-(h100|h200)\b")


def junit_outcome(record: Path, test: str) -> str:
    """``passed``, ``failed`` or ``skipped``: how ``test`` ended in a JUnit record.

    A strict xfail that passed (pytest records ``[XPASS(strict)]`` as a failure)
    reads ``passed``: every assertion of its body held.

    Parameters
    ----------
    record : Path
        The JUnit XML file
    test : str
        The test function's name (its last testcase of that name counts)

    Returns
    -------
    str
        The outcome

    Raises
    ------
    ValueError
        The record holds no testcase of that name
    """
    outcome = None
    for case in ET.parse(record).iter("testcase"):
        if case.get("name") != test:
            continue
        failure = case.find("failure")
        if case.find("skipped") is not None:
            outcome = "skipped"
        elif failure is not None and failure.get("message", "").startswith(
            "[XPASS(strict)]"
        ):
            # A strict xfail whose body passed: every assertion held.
            outcome = "passed"
        elif failure is not None or case.find("error") is not None:
            outcome = "failed"
        else:
            outcome = "passed"
    if outcome is None:
        raise ValueError(f"{record}: no testcase {test!r}")
    return outcome


def _classes() -> list[str]:
    return [key.rsplit(".", 1)[-1] for key in shipped_entries()]


def _gpu_test(cls: str, bench: Path, link: str) -> tuple[str, str] | None:
    """The outcome of ``cls``'s GPU test and its cell; None without one."""
    if cls not in GPU_TESTS:
        return None
    record, test = GPU_TESTS[cls]
    match = _MACHINE.match(record)
    if match is None:
        raise ValueError(f"{record}: not under a <date>-<h100|h200> directory")
    outcome = junit_outcome(bench / record, test)
    if outcome == "skipped":
        return None
    gpu, date = match[2].upper(), match[1]
    cell = f"GPU test at published size, {outcome} ([{gpu}, {date}]({link}{record}))"
    return outcome, cell


def _sample(
    precision: str,
    eager_ms: Any,
    compiled_ms: Any,
    env: Mapping[str, Any],
    **more: Any,
) -> dict[str, Any]:
    return {
        "precision": precision,
        "ratio": eager_ms / compiled_ms if eager_ms and compiled_ms else None,
        "env": env,
        **more,
    }


def _from_rollouts(data: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per class, one sample per precision a rollout JSON has compiled rows of."""
    found: dict[str, list[dict[str, Any]]] = {}
    rows = [r for r in data["results"] if r.get("size", "full") == "full"]
    for model in dict.fromkeys(r["model"] for r in rows):
        cls = ZOO_CLASSES.get(model)
        mine = [r for r in rows if r["model"] == model]
        fp32 = [r for r in mine if r["precision"] == "fp32" and r["mode"] == "eager"]
        for precision in ("tf32", "bf16"):
            rows_of = [r for r in mine if r["precision"] == precision]
            compiled = [r for r in rows_of if r["mode"] != "eager"]
            eager = [r for r in rows_of if r["mode"] == "eager"] or fp32
            if cls is None or not compiled:
                continue
            c, e = compiled[-1], eager[-1]  # later rows: the current code's
            same = e["precision"] == precision
            found.setdefault(cls, []).append(
                _sample(
                    precision,
                    e.get("steady_ms") if same else None,
                    c.get("steady_ms"),
                    data["environment"],
                    l2=c.get("rel_l2_first"),
                    first=(e.get("first_step_s"), c.get("first_step_s")),
                )
            )
    return found


def _from_workflow(data: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per class, the workflow mode's per-step medians (its floor rows) and its
    whole calls' first steps: upstream's eager and compile=True's."""
    found: dict[str, list[dict[str, Any]]] = {}
    env = data["meta"]["environment"]
    for floor in (r for r in data["rows"] if r.get("run") == "floor"):
        cls = ZOO_CLASSES.get(floor["model"])
        if cls is None or floor.get("size", "full") != "full":
            continue
        job = [r for r in data["rows"] if r.get("job") == floor["job"]]
        eager = [
            r for r in job if r.get("run") == "eager" and r.get("io") == job[0]["io"]
        ]
        compiled = [r for r in job if r.get("run") == "compiled"]
        first = (
            (eager[0].get("first_step_s"), compiled[0].get("first_step_s"))
            if eager and compiled
            else (None, None)
        )
        batch = floor.get("batch_size")
        found.setdefault(cls, []).append(
            _sample(
                floor["precision"],
                floor.get("eager_step_ms"),
                floor.get("compiled_step_ms"),
                env,
                l2=None,
                first=first,
                batch=batch,
            )
        )
    return found


def _ratio(sample: Mapping[str, Any] | None) -> str:
    if sample is None or sample["ratio"] is None:
        return "-"
    batch = sample.get("batch")
    return f"{sample['ratio']:.2f}x" + (f" (batch {batch})" if batch else "")


def model_runs(link: str = "bench/") -> Callable[[Sequence[Mapping[str, Any]]], str]:
    """The renderer of the run table (see the module's description).

    Parameters
    ----------
    link : str, optional
        ``docs/bench/`` as a link from the document, by default ``"bench/"``
        (``docs/models.md``'s)

    Returns
    -------
    Callable[[Sequence[Mapping[str, Any]]], str]
        Loaded rollout JSONs -> the Markdown table
    """

    def table(datas: Sequence[Mapping[str, Any]]) -> str:
        bench = ROOT / "docs" / "bench"
        by_class: dict[str, list[dict[str, Any]]] = {}
        for data in datas:
            read = _from_rollouts if "results" in data else _from_workflow
            for cls, samples in read(data).items():
                by_class.setdefault(cls, []).extend(samples)
        lines = [
            "| model | run | TF32 over eager TF32 | bf16 over eager bf16 "
            "| rel. L2 step 1 | first step s eager/compiled |",
            "|---|---|---|---|---|---|",
        ]
        for cls in _classes():
            test = _gpu_test(cls, bench, link)
            # A wrong answer outranks any speed: none of it is shown, so the
            # failed test's cell is the row's run.
            failed = test is not None and test[0] == "failed"
            samples = [] if failed else by_class.get(cls, [])
            latest = {s["precision"]: s for s in samples}  # later sources win
            if samples:
                env = samples[-1]["env"]
                run = (
                    f"GPU speed at published size ({env['gpu']}, "
                    f"{str(env['date'])[:10]}, torch {env['torch']})"
                )
            elif test is not None:
                run = test[1]
            elif cls in CPU_TESTS:
                run = f"CPU test, small (`{CPU_TESTS[cls]}`)"
            else:
                run = "read only"
            ratios = [_ratio(latest.get(p)) for p in ("tf32", "bf16")]
            main = latest.get("tf32") or latest.get("bf16")
            l2 = number(main["l2"], ".1e") if main else "-"
            first = "-"
            if main and None not in main["first"]:
                first = "{:.2f}/{:.2f}".format(*main["first"])
            lines.append(f"| {cls} | {run} | {' | '.join(ratios)} | {l2} | {first} |")
        notes = (
            "\n\nrun: the strongest record under docs/bench/ (a failed GPU test "
            "at published size, whose row then shows no speed; speed at published "
            "size on a GPU, a GPU test at published size, a CPU test of a small "
            "configuration through Earth2Studio's wrapper, else read only: the entry "
            "comes from reading the class's source); the GPU tests ran the device "
            "image's torch, which their directories' READMEs name. Over eager: the "
            "median compiled step against eager's in the same precision, from the "
            "latest source that has both (a rollout, or a workflow run's per-step "
            "medians at its batch size); rel. L2 step 1: the compiled row against "
            "fp32 eager with TF32 off (rollouts only); first step: a rollout's "
            "(the compiled row as it started, cold or from artifacts) or, from a "
            "workflow run, its whole calls' (upstream eager and compile=True)."
        )
        return "\n".join(lines) + notes

    return table
