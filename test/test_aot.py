"""Building a model's regions ahead of time (earth2studio_compile.aot.build)."""

from __future__ import annotations


def test_build_again_finds_the_artifact(built, monkeypatch):
    from earth2studio_compile import build

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    [again] = build(built.model, precision="fp32")
    assert again.status == "present"
    assert again.path == built.result.path
