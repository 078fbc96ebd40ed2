"""The environment a benchmark run records (tools.bench.env)."""

from __future__ import annotations


def test_a_commit_named_by_the_command_is_recorded_instead_of_git_s(monkeypatch):
    """The device machines' copy of ``.git`` is stale: their runs recorded an older
    commit, "+dirty", for every tree sent (the thirteenth to fifteenth sessions'
    JSONs); the command names the tree instead."""
    from earth2studio_compile.tools.bench import env

    monkeypatch.delenv(env.COMMIT_ENV, raising=False)
    from_git = env.git_commit()
    monkeypatch.setenv(env.COMMIT_ENV, "0123abc")
    assert env.git_commit() == "0123abc" != from_git
    monkeypatch.setenv(env.COMMIT_ENV, " ")
    assert env.git_commit() == from_git
