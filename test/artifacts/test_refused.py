"""The refusals kept across processes (earth2studio_compile.artifacts.refused):
kept and recalled per key, and an unreadable record read as none."""

from __future__ import annotations

from earth2studio_compile.artifacts import refused


def test_a_refusal_is_recalled_for_its_key_only(tmp_path):
    aot = tmp_path / "aot"
    refused.remember(aot, "k1", "it updates its buffers in place")
    assert refused.recall(aot, "k1") == "it updates its buffers in place"
    assert refused.recall(aot, "k2") is None
    assert refused.recall(None, "k1") is None  # the cache is off


def test_an_unreadable_record_is_read_as_none(tmp_path):
    aot = tmp_path / "aot"
    refused.refused_path(aot, "k").parent.mkdir(parents=True)
    for text in ("not json", '{"reason": ""}', '{"reason": 3}', "[]"):
        refused.refused_path(aot, "k").write_text(text)
        assert refused.recall(aot, "k") is None, text


def test_remember_never_raises_where_the_cache_cannot_be_written(tmp_path):
    blocked = tmp_path / "aot"
    blocked.write_text("a file where the directory would go")
    refused.remember(blocked, "k", "why")  # logged at DEBUG, not raised
    assert refused.recall(blocked, "k") is None
