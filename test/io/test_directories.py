"""Chunk directories made once each, side by side, and ahead of the writes."""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from earth2studio_compile.io import directories
from earth2studio_compile.io.directories import (
    Ahead,
    known_directories,
    make_directory,
)


def test_two_directories_are_made_at_once(tmp_path, monkeypatch):
    """Each chunk of Earth2Studio's stores (one per member and lead time) has a
    directory of its own: making one must not wait for another being made (under
    one lock the put threads waited there more than they wrote). Two threads each
    make a directory of another stripe, and each mkdir waits for the other's."""
    candidates = [str(tmp_path / "c" / str(m) / "0") for m in range(64)]
    first = candidates[0]
    second = next(
        d
        for d in candidates
        if directories._stripe(d) is not directories._stripe(first)
    )
    both = threading.Barrier(2, timeout=10)
    mkdir = os.mkdir

    def meeting(path, mode=0o777, **kwargs):
        if os.fspath(path) in (first, second):
            both.wait()  # BrokenBarrierError unless the other is making its own
        return mkdir(path, mode, **kwargs)

    (tmp_path / "c").mkdir()
    monkeypatch.setattr(os, "mkdir", meeting)
    known = {str(tmp_path / "c")}
    top = str(tmp_path)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(make_directory, d, known, top) for d in (first, second)]
        for future in futures:
            future.result()
    assert os.path.isdir(first) and os.path.isdir(second)
    parents = {os.path.dirname(first), os.path.dirname(second)}
    assert known == {str(tmp_path / "c"), first, second, *parents}


def test_the_directories_known_are_a_stores_few_and_go_with_it(tmp_path, monkeypatch):
    """The directories made are kept per store, to its end, and only so many: a
    long forecast's store does not keep every directory it ever made, nor a closed
    one any."""
    from zarr.storage import LocalStore

    monkeypatch.setattr(directories, "_KNOWN_AT_MOST", 3)
    store = LocalStore(tmp_path)
    known = known_directories(store)
    assert known_directories(store) is known
    for m in range(4):
        for step in range(2):
            make_directory(
                str(tmp_path / "c" / str(m) / str(step)), known, str(tmp_path)
            )
    assert all((tmp_path / "c" / str(m) / "1").is_dir() for m in range(4))
    key = id(store)
    assert directories._known[key] is known and 0 < len(known) <= 3
    del store, known
    gc.collect()
    assert key not in directories._known


def test_ahead_stops_when_asked_and_never_raises(logs):
    """Stopped, it waits for the job to see it; a job that failed is logged, not
    raised: the writers make what it left unmade."""
    from conftest import messages

    seen = threading.Event()

    def long(stop: threading.Event) -> int:
        seen.set()
        while not stop.wait(0.01):
            pass
        return 7

    ahead = Ahead(long, "test directories")
    assert seen.wait(10)
    start = time.monotonic()
    ahead.stop()
    assert time.monotonic() - start < 5

    def failing(stop: threading.Event) -> int:
        raise PermissionError("read-only")

    Ahead(failing, "test directories").stop()
    assert any("PermissionError" in m for m in messages(logs, "DEBUG"))
