"""The features of the one package that touches PyTorch internals
(earth2studio_compile._torch.probes): each feature missing, no crash.

The package ``earth2studio_compile._torch`` reaches every private PyTorch name
through a *feature*. A PyTorch that lacks one must cost a figure in the report or a
fallback to eager with a reason, never a crash and never a wrong answer. No module
outside it imports or reaches those names (test_layout.py checks).
"""

from __future__ import annotations

import pytest
import torch
from conftest import eager_backend, messages

from earth2studio_compile import CompileSession, _torch
from earth2studio_compile._torch import probes
from earth2studio_compile.tools import zoo


@pytest.fixture
def without(monkeypatch):
    """Makes a feature's probe fail, as on a PyTorch that lacks the internal."""

    def declare(feature: str) -> None:
        def probe() -> None:
            raise AttributeError(f"{feature} removed (test)")

        purpose = _torch.FEATURES[feature][0]
        monkeypatch.setitem(_torch.FEATURES, feature, (purpose, probe))
        probes._probe.cache_clear()

    yield declare
    probes._probe.cache_clear()  # the real probes run again once restored


@pytest.mark.parametrize("feature", sorted(_torch.FEATURES))
def test_each_feature_missing_costs_no_crash_and_no_wrong_answer(
    feature, without, logs
):
    without(feature)
    # Inductor for the feature only Inductor needs (it then falls back before any
    # build); a tracing-only backend for the rest keeps the test fast.
    name = "sfno" if feature == "reparametrize" else "toy"
    backend = "inductor" if feature == "inductor_wrapper" else eager_backend
    model = zoo.build(name)
    x = torch.randn(
        1,
        *[
            len(v)
            for k, v in model.input_coords().items()
            if k not in ("batch", "lead_time")
        ],
    )
    with torch.no_grad():
        expected = model.model(x)
    with CompileSession(model, backend=backend) as session, torch.no_grad():
        outs = [model.model(x) for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    region = session.report.regions[0]
    if feature in ("inductor_wrapper", "reparametrize"):
        assert region.status == "eager", session.report.summary()
        assert _torch.FEATURES[feature][0] in region.reason
        assert len(messages(logs, "WARNING")) == 1
    else:
        assert region.status == "compiled", session.report.summary()
