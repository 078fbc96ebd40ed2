"""The build command line (earth2studio_compile.tools.build)."""

from __future__ import annotations


def test_cli_finds_the_artifact(built, monkeypatch, capsys):
    from earth2studio_compile.tools import build as cli

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    code = cli.main(
        ["fcn", "--size", "small", "--device", "cpu", "--precision", "fp32"]
    )
    assert code == 0
    assert f"present: {built.result.path}" in capsys.readouterr().out
