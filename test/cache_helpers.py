"""The compile cache turned on in a temporary root, and a toy rollout that reads
its region's report: what the cache's and the bundles' tests share."""

from __future__ import annotations

import pytest
import torch

from earth2studio_compile import CompileSession, cache


@pytest.fixture
def bundles(tmp_path, monkeypatch):
    """Turn the package cache on, rooted in a temporary directory; the bundles'
    directory."""
    root = tmp_path / "compile-cache"
    monkeypatch.setenv(cache.ENV, str(root))
    return root / "artifacts"


def toy_rollout(model, session_kwargs=None):
    """One call of the toy model's core in a session: (output, its region's report)."""
    x = torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
    with CompileSession(model, **(session_kwargs or {})) as session, torch.no_grad():
        out = model.model(x)
    return out, session.report.regions[0]
