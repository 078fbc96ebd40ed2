"""A model's table entry (earth2studio_compile.spec): a ModelSpec compiles something
or says why, its paths are checked with an error that names the fix, and an
argument counts as unused only where none of its readers is held."""

from __future__ import annotations

import pytest
import torch

from earth2studio_compile.patches import DLWP_ZENITH
from earth2studio_compile.spec import ModelSpec, check_paths, unused_arguments


def test_a_spec_compiles_something_or_says_why():
    with pytest.raises(TypeError, match="regions=\\('a',\\)"):
        ModelSpec(regions="a")
    with pytest.raises(ValueError, match="needs a reason"):
        ModelSpec()
    with pytest.raises(TypeError, match="MethodPatch"):
        ModelSpec(regions=("model",), patches=("get_cosine_zenith_fields",))
    assert ModelSpec(regions=("model",), patches=(DLWP_ZENITH,)).patches
    assert ModelSpec(reason="runs through ONNX Runtime").regions == ()


def test_paths_are_checked_and_the_error_names_the_fix():
    assert check_paths(["model", "net.blocks.0"], "regions") == (
        "model",
        "net.blocks.0",
    )
    with pytest.raises(TypeError, match="Write exclude=\\('model',\\)"):
        check_paths("model", "exclude")
    with pytest.raises(TypeError, match="For example regions=\\('model',\\)"):
        check_paths(3, "regions")
    with pytest.raises(TypeError, match="non-empty strings"):
        check_paths(("model", " "), "regions")


def test_an_argument_counts_as_unused_only_without_its_readers():
    class Reader(torch.nn.Module):
        pass

    spec = ModelSpec(regions=("model",), unused_arguments={"step": ("Reader",)})
    assert unused_arguments(spec, torch.nn.Linear(2, 2)) == ("step",)
    assert unused_arguments(spec, torch.nn.Sequential(Reader())) == ()
    assert unused_arguments(ModelSpec(regions=("model",)), Reader()) == ()
