"""The build command line (earth2studio_compile.tools.build)."""

from __future__ import annotations


def test_cli_finds_the_artifact(built, monkeypatch, capsys):
    from earth2studio_compile.tools import build as cli

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    code = cli.main(
        ["fcn", "--size", "small", "--device", "cpu", "--precision", "fp32"]
    )
    assert code == 0
    assert f"present, verified against eager: {built.result.path}" in (
        capsys.readouterr().out
    )


def test_cli_passes_inductor_options_and_refuses_what_is_not_an_object(
    built, monkeypatch, capsys
):
    """``--options`` are part of the artifacts' key: other options, another artifact
    (none yet: the build would start, so an unknown option is used to stop it)."""
    import pytest

    from earth2studio_compile.tools import build as cli

    monkeypatch.setenv("EARTH2STUDIO_COMPILE_CACHE", str(built.root))
    argv = ["fcn", "--size", "small", "--device", "cpu", "--precision", "fp32"]
    with pytest.raises(SystemExit):
        cli.main([*argv, "--options", "[1, 2]"])
    assert "a JSON object of Inductor options" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no_such_inductor_option"):
        cli.main([*argv, "--options", '{"no_such_inductor_option": 1}'])
