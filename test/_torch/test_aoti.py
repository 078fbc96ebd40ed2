"""AOTInductor's package loader (earth2studio_compile._torch.aoti): what every
load does before the library is opened."""

from __future__ import annotations

import sys

import earth2studio.models
import pytest
import torch

from earth2studio_compile._torch import aoti


@pytest.fixture
def loads(monkeypatch):
    """The loader's constructions, each with whether Earth2Studio's prognostic
    models were imported when it ran; ``earth2studio.models.px`` unimported."""
    seen: list[tuple[bool, tuple]] = []

    class Loader:
        def __init__(self, *args) -> None:
            seen.append(("earth2studio.models.px" in sys.modules, args))

    monkeypatch.setattr(earth2studio.models, "px", earth2studio.models.px)
    monkeypatch.delitem(sys.modules, "earth2studio.models.px")
    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", Loader)
    return seen


def test_a_cuda_load_imports_the_prognostic_models_first(loads):
    # Without the import, the loader crashed an H100 process (a background
    # build's package check, 2026-11-27): a crash no caller can catch.
    aoti.aoti_loader("model.pt2", torch.device("cuda", 1))
    assert loads == [(True, ("model.pt2", "model", True, 1, 1))]


def test_a_cpu_load_imports_nothing(loads):
    aoti.aoti_loader("model.pt2", torch.device("cpu"))
    assert loads == [(False, ("model.pt2", "model", True, 1, -1))]
