"""The ahead-of-time executor (earth2studio_compile.executors.aot) in a session: the
artifact runs when its key matches, a wrong one or other inputs go to Dynamo, and a
later session runs the loaded artifact again.
"""

from __future__ import annotations

import pytest
import torch
from aot_helpers import (
    another_process,
    eager,
    region_summary,
    session_call,
    unverified,
)

from earth2studio_compile.metrics import rel_l2


def test_a_session_runs_the_artifact_when_its_key_matches(built, monkeypatch):
    unverified(built.root)
    out, again, region = session_call(built, built.root, monkeypatch)
    assert region.status == "compiled" and region.executor == "aot", region
    assert region.graphs == 0  # torch.compile never ran
    for phase in ("key", "checksum", "aot_load", "bind", "first_run", "verify"):
        assert region.phases[phase] >= 0.0, phase
    assert "dynamo" not in region.phases
    # The phases are consecutive laps: together, the whole first call.
    assert region.first_call_seconds == pytest.approx(region.compile_seconds)
    ref = eager(built.core, built.args)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5
    assert "ahead-of-time artifact" in region_summary(region)


def test_the_replayed_convolutions_are_a_phase_of_the_first_call(built, monkeypatch):
    """Where the device warms them (CUDA; here the CPU made to), the replay is a
    lap of its own inside the first run's, and the laps still add up."""
    from earth2studio_compile.artifacts import aot_runner

    monkeypatch.setattr(aot_runner, "WARM_DEVICES", frozenset({"cpu", "cuda"}))
    unverified(built.root)
    out, _, region = session_call(built, built.root, monkeypatch)
    assert region.executor == "aot", region
    assert region.phases["warm_convolutions"] >= 0.0
    assert region.phases["first_run"] >= 0.0
    assert region.first_call_seconds == pytest.approx(region.compile_seconds)
    assert rel_l2(out, eager(built.core, built.args)) < 1e-5


def test_a_wrong_artifact_takes_the_dynamo_path_with_one_warning(
    built, planted, monkeypatch
):
    from loguru import logger

    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        out, again, region = session_call(built, planted, monkeypatch)
    finally:
        logger.remove(sink)
    assert region.status == "compiled" and region.executor == "dynamo", region
    assert any("failed verification" in d for d in region.declined), region.declined
    # The artifact's load, run and verification are part of the first call.
    assert region.phases["declined"] > 0
    assert region.first_call_seconds == pytest.approx(region.compile_seconds)
    assert sum("another answer than eager" in w for w in warnings) == 1, warnings
    ref = eager(built.core, built.args)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5
    assert "aot not used" in region_summary(region)


def test_inputs_the_artifact_was_not_built_for_go_to_dynamo_not_eager(
    built, monkeypatch, logs
):
    """A later call with another batch size: the artifact declines it before
    running, and Dynamo compiles it (a recompile) instead of the region turning
    eager for good with a WARNING."""
    from conftest import messages

    from earth2studio_compile import CompileSession

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    wider = tuple(
        torch.cat([a, a]) if isinstance(a, torch.Tensor) else a for a in built.args
    )
    with CompileSession(built.model, precision="fp32", probe=False) as session:
        with torch.no_grad():
            first = built.core(*built.args)
            out = built.core(*wider)
            again = built.core(*wider)
    [region] = session.report.regions
    assert region.status == "compiled" and region.executor == "dynamo", region
    assert region.recompiles == 1 and region.eager_calls == 0, region
    assert any("built for other inputs" in d for d in region.declined), region
    assert not messages(logs, "WARNING")
    assert rel_l2(first, eager(built.core, built.args)) < 1e-5
    ref = eager(built.core, wider)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5


def test_a_later_session_runs_the_loaded_artifact_again(built, monkeypatch):
    """The loaded artifact is kept for the next session in the process: nothing
    is loaded or verified again."""
    session_call(built, built.root, monkeypatch)
    out, again, region = session_call(built, built.root, monkeypatch)
    assert region.status == "compiled" and region.executor == "aot", region
    assert region.reused is not None and region.compile_seconds == 0.0, region
    ref = eager(built.core, built.args)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5


def test_a_later_process_with_the_same_weights_does_not_verify_again(
    built, planted, monkeypatch, tmp_path
):
    """An artifact that gave eager's answer records it: another process with the
    same weights skips the eager call; other weights, or another package under the
    key (planted beside the record), are verified again."""
    import shutil

    from earth2studio_compile.artifacts import verified

    root = tmp_path / "cache"
    shutil.copytree(built.root, root)
    unverified(root)
    _, _, first = session_call(another_process(built), root, monkeypatch)
    assert "verify" in first.phases and "verified_earlier" not in first.phases
    [record] = root.glob(f"**/{verified.FILE}")

    later = another_process(built)
    out, again, region = session_call(later, root, monkeypatch)
    assert (region.status, region.executor) == ("compiled", "aot"), region
    assert "verify" not in region.phases and region.phases["verified_earlier"] >= 0
    assert "in an earlier process, same weights" in region_summary(region)
    ref = eager(later.core, later.args)
    assert rel_l2(out, ref) < 1e-5 and rel_l2(again, ref) < 1e-5

    changed = another_process(built)
    with torch.no_grad():
        next(changed.core.parameters()).view(-1)[0] += 1e-3
    _, _, region = session_call(changed, root, monkeypatch)
    assert "verify" in region.phases, region.phases

    # The record does not vouch for another package under the same key.
    [planted_dir] = planted.glob("aot/*")
    shutil.copy(record, planted_dir / verified.FILE)
    _, _, region = session_call(another_process(built), planted, monkeypatch)
    assert region.executor == "dynamo", region
    assert any("failed verification" in d for d in region.declined), region.declined
