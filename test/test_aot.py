"""Building a model's regions ahead of time (earth2studio_compile.aot.build)."""

from __future__ import annotations


def test_build_again_finds_the_artifact(built, monkeypatch):
    from earth2studio_compile import build

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    [again] = build(built.model, precision="fp32")
    assert again.status == "present"
    assert again.path == built.result.path


def test_build_verifies_its_artifact_against_eager_and_seals_it(built, monkeypatch):
    """What build() built, and an artifact it found present, ran once against eager
    on the captured call here, and the seal of the model's weights is recorded: a
    forecast's first call in the next process skips its own eager call (0.41 s of
    FCN's first step on an H100)."""
    from aot_helpers import unverified

    from earth2studio_compile import build
    from earth2studio_compile.artifacts import verified

    assert built.result.verified
    path = built.result.path
    weights = verified.weights_print(built.core)
    unverified(built.root)
    assert not verified.known(path, verified.seal(path, weights))
    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    [again] = build(built.model, precision="fp32")
    assert again.status == "present" and again.verified
    assert verified.known(path, verified.seal(path, weights))
