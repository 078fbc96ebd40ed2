"""Building a region ahead of time (earth2studio_compile.artifacts.aot_build) on CPU."""

from __future__ import annotations

import json

from aot_helpers import eager, load

from earth2studio_compile.artifacts.aot_load import (
    AotRunner,
    verify,
)
from earth2studio_compile.metrics import rel_l2


def test_build_writes_an_artifact_that_matches_eager(built):
    assert built.result.status == "built", built.result
    assert built.result.path.parent == built.root / "aot"
    meta = json.loads((built.result.path / "meta.json").read_text())
    assert set(meta["sha256"]) == {"model.pt2"}
    runner = load(built)
    assert isinstance(runner, AotRunner), runner
    out = runner(*built.args)
    ref = eager(built.core, built.args)
    assert rel_l2(out, ref) <= 1e-5
    assert verify(out, ref, "fp32") is None
    # Each phase measured, none a remainder.
    for phase in ("key", "checksum", "aot_load", "bind", "first_run"):
        assert runner.phases[phase] >= 0.0, phase
