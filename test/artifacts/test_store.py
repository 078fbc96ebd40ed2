"""The store of compiled code on disk (earth2studio_compile.artifacts.store).

Entries here are small files standing for bundles and artifacts: what the store
promises (whole entries, checks that answer with a reason, one writer per key)
does not depend on what they hold.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import filelock
import pytest

from earth2studio_compile import cache
from earth2studio_compile.artifacts import store

FIELDS = {"model": "m.Model", "region": "model", "inputs": [[1, 4], "float32"]}


def _entry(parent: Path, key: str, payload: bytes, **more) -> Path:
    """Build and install an entry of one member, ``code.bin``."""
    with store.staged(parent) as tmp:
        (tmp / "code.bin").write_bytes(payload)
        (tmp / "notes.txt").write_text(payload.hex())
        store.write_meta(tmp, FIELDS, ["code.bin", "notes.txt"], **more)
        return store.install(tmp, parent / key)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".e2sc-"))


def test_an_installed_entry_is_whole_and_checks(tmp_path):
    path = _entry(tmp_path / "aot", "k1", b"one", build_seconds={"compile": 1.5})
    assert path == tmp_path / "aot" / "k1"
    assert sorted(p.name for p in path.iterdir()) == [
        "code.bin",
        "meta.json",
        "notes.txt",
    ]
    meta = store.read_meta(path)
    assert meta["fields"] == FIELDS and meta["build_seconds"] == {"compile": 1.5}
    assert meta["sha256"]["code.bin"] == store.sha256_bytes(b"one")
    assert store.check_dir(path, FIELDS, ["code.bin", "notes.txt"]) is None
    assert _leftovers(tmp_path / "aot") == []
    # Nothing of it is writable by others (an entry is code).
    assert all(not p.stat().st_mode & 0o022 for p in (path, *path.iterdir()))


def test_a_new_entry_replaces_the_old_one_whole(tmp_path):
    parent = tmp_path / "aot"
    old = _entry(parent, "k", b"old")
    (old / "stale.txt").write_text("only in the old entry")
    new = _entry(parent, "k", b"new")
    assert not (new / "stale.txt").exists()
    assert (new / "code.bin").read_bytes() == b"new"
    assert store.check_dir(new, FIELDS, ["code.bin", "notes.txt"]) is None
    assert _leftovers(parent) == []


def test_a_failed_build_leaves_nothing(tmp_path):
    parent = tmp_path / "aot"
    with pytest.raises(RuntimeError, match="export failed"):
        with store.staged(parent) as tmp:
            (tmp / "code.bin").write_bytes(b"half")
            raise RuntimeError("export failed")
    assert list(parent.iterdir()) == []


def test_write_file_is_whole_or_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "k.tar"
    store.write_file(path, b"first")
    seen = store.identity(path)

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        store.write_file(path, b"second")
    monkeypatch.undo()
    assert path.read_bytes() == b"first" and store.identity(path) == seen
    assert _leftovers(tmp_path) == []
    store.write_file(path, b"second, longer")
    assert path.read_bytes() == b"second, longer"
    assert store.identity(path) != seen


def _damage_member(path: Path) -> None:
    data = bytearray((path / "code.bin").read_bytes())
    data[0] ^= 0xFF
    (path / "code.bin").write_bytes(bytes(data))


def _garble_meta(path: Path) -> None:
    (path / "meta.json").write_text('{"fields": {"model": ')


def _drop_meta(path: Path) -> None:
    (path / "meta.json").unlink()


def _drop_checksums(path: Path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta.pop("sha256")
    (path / "meta.json").write_text(json.dumps(meta))


def _extra_checksum(path: Path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["sha256"]["planted.so"] = "0" * 64
    (path / "meta.json").write_text(json.dumps(meta))


def _foreign(path: Path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["fields"]["region"] = "other"
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_damage_member, "checksum mismatch for code.bin"),
        (_garble_meta, "unreadable (JSONDecodeError"),
        (_drop_meta, "unreadable (FileNotFoundError"),
        (_drop_checksums, "no checksums"),
        (_extra_checksum, "checksums and members differ: planted.so"),
        (_foreign, "made for a different region"),
    ],
    ids=["checksum", "garbled-meta", "no-meta", "no-checksums", "extra", "foreign"],
)
def test_a_damaged_or_foreign_entry_is_a_reason(tmp_path, change, reason):
    path = _entry(tmp_path / "aot", "k", b"payload")
    change(path)
    found = store.check_dir(path, FIELDS, ["code.bin", "notes.txt"])
    assert found is not None and found.startswith(reason), found


def test_check_meta_takes_members_as_bytes(tmp_path):
    meta = json.loads(store.meta_bytes(FIELDS, {"a": b"x", "b": b"y"}))
    assert store.check_meta(meta, FIELDS, {"a": b"x", "b": b"y"}) is None
    assert store.check_meta(meta, FIELDS, {"a": b"x", "b": b"z"}) == (
        "checksum mismatch for b"
    )
    assert store.check_meta(meta, {**FIELDS, "format": 9}, {"a": b"x"}) == (
        "made for a different format"
    )
    with pytest.raises(ValueError, match="no fields"):
        store.read_meta(b"[1, 2]")


def test_an_entry_others_may_write_is_not_trusted(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.TRUSTED_ENV, raising=False)
    root = tmp_path / "root"
    path = _entry(root / "aot", "k", b"payload")
    assert store.distrust(root, "aot", "k", "code.bin") is None
    (path / "code.bin").chmod(0o664)
    reason = store.distrust(root, "aot", "k", "code.bin")
    assert reason is not None and reason.startswith("not trusted (")
    assert "writable by its group" in reason
    monkeypatch.setenv(cache.TRUSTED_ENV, str(root))
    assert store.distrust(root, "aot", "k", "code.bin") is None


def _install_many(parent: str, worker: int, rounds: int) -> None:
    for i in range(rounds):
        _entry(Path(parent), "k", f"worker {worker} round {i}".encode() * 512)


def test_concurrent_installs_of_one_key_leave_one_whole_entry(tmp_path):
    parent = tmp_path / "aot"
    parent.mkdir()
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_install_many, args=(str(parent), w, 15))
        for w in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    path = parent / "k"
    assert store.check_dir(path, FIELDS, ["code.bin", "notes.txt"]) is None
    payload = (path / "code.bin").read_bytes()
    # Both members come from the same writer's entry.
    assert (path / "notes.txt").read_text() == payload.hex()
    assert sorted(p.name for p in parent.iterdir()) == ["k"]


def test_a_file_lock_is_held_across_lock_objects(tmp_path):
    path = tmp_path / "k.lock"
    holder = store.file_lock(path)
    holder.acquire(timeout=0)
    try:
        with pytest.raises(filelock.Timeout):
            store.file_lock(path).acquire(timeout=0)
    finally:
        holder.release()
    other = store.file_lock(path)
    other.acquire(timeout=0)
    other.release()
