"""The store of compiled code on disk: whole entries, checksums, ``meta.json``, locks.

Both kinds of entry under the cache root are kept by these rules: a compile cache
bundle (one tar file, ``artifacts/<key>.tar``, :mod:`.bundles`) and an
ahead-of-time artifact (one directory, ``aot/<key>/``, :mod:`.aot_build`).

- **Whole or not at all.** An entry is written under a temporary name
  (:data:`TMP_PREFIX`) in the directory it goes to and renamed into place
  (:func:`write_file`, :func:`staged` then :func:`install`), replacing an old
  one whole: a reader never sees half of one.
- **Checked before use.** Its ``meta.json`` repeats the key's fields and holds a
  sha256 of every other member (:func:`meta_bytes`, :func:`write_meta`);
  :func:`check_meta` and :func:`check_dir` compare them with what the caller
  expects and with the members' bytes. A damaged, foreign or untrusted entry is
  a reason string (:func:`check_dir`, :func:`distrust`), never an exception.
- **One writer per key.** :func:`file_lock` is an OS lock, freed by the kernel
  if its holder dies, that fails closed where the file system has no flock.

Who may write under the root, and so whose code is loaded, is
:func:`earth2studio_compile.cache.untrusted`'s rule.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock
from loguru import logger

from earth2studio_compile.cache import (
    TMP_PREFIX,
    make_private_dir,
    refuse_untrusted,
    untrusted,
)

__all__ = [
    "META",
    "TMP_PREFIX",
    "check_dir",
    "check_meta",
    "distrust",
    "file_lock",
    "held",
    "identity",
    "install",
    "keep_json",
    "keep_reason",
    "meta_bytes",
    "read_meta",
    "read_reason",
    "sha256_bytes",
    "sha256_file",
    "staged",
    "write_file",
    "write_meta",
]

META = "meta.json"


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path``, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256(member: bytes | Path) -> str:
    return sha256_bytes(member) if isinstance(member, bytes) else sha256_file(member)


def meta_bytes(
    fields: Mapping[str, Any], members: Mapping[str, bytes | Path], **more: Any
) -> bytes:
    """``meta.json`` of an entry: the key's fields and a sha256 of every member.

    Parameters
    ----------
    fields : Mapping[str, Any]
        The key's fields
    members : Mapping[str, bytes | Path]
        Each member's name and its bytes or file
    **more : Any
        Further entries (e.g. ``build_seconds``)

    Returns
    -------
    bytes
        The JSON text
    """
    sums = {name: _sha256(m) for name, m in members.items()}
    meta = {"fields": dict(fields), "sha256": sums, **more}
    return json.dumps(meta, indent=1, default=str).encode()


def write_meta(
    directory: Path, fields: Mapping[str, Any], names: Sequence[str], **more: Any
) -> None:
    """Write ``meta.json`` into an entry directory, for its files ``names``.

    Parameters
    ----------
    directory : Path
        The entry's directory, its files already there
    fields : Mapping[str, Any]
        The key's fields
    names : Sequence[str]
        The entry's files, each checksummed in ``meta.json``
    **more : Any
        Further entries (see :func:`meta_bytes`)
    """
    members = {name: directory / name for name in names}
    (directory / META).write_bytes(meta_bytes(fields, members, **more))


def read_meta(data: bytes | Path) -> dict[str, Any]:
    """A parsed ``meta.json`` (its bytes, or an entry directory holding one).

    Raises
    ------
    ValueError
        It is not JSON, or has no fields
    OSError
        It cannot be read
    """
    if isinstance(data, Path):
        data = (data / META).read_bytes()
    meta = json.loads(data)
    if not isinstance(meta, dict) or not isinstance(meta.get("fields"), dict):
        raise ValueError(f"{META} has no fields")
    return meta


def check_meta(
    meta: Mapping[str, Any],
    fields: Mapping[str, Any],
    members: Mapping[str, bytes | Path],
) -> str | None:
    """Why an entry is not the one for ``fields``, or None when it is.

    Parameters
    ----------
    meta : Mapping[str, Any]
        Its parsed ``meta.json``
    fields : Mapping[str, Any]
        The key's fields as the caller computed them
    members : Mapping[str, bytes | Path]
        Every other member, by name: its bytes or its file

    Returns
    -------
    str | None
        ``"made for a different <fields>"``, ``"no checksums"``,
        ``"checksums and members differ: ..."``, ``"checksum mismatch for <name>"``
    """
    expected = json.loads(json.dumps(dict(fields), default=str))
    found = meta.get("fields")
    if not isinstance(found, dict) or found != expected:
        found = found if isinstance(found, dict) else {}
        diff = sorted(k for k in expected if found.get(k) != expected[k])
        return f"made for a different {', '.join(diff) or 'key'}"
    sums = meta.get("sha256")
    if not isinstance(sums, dict) or not sums:
        return "no checksums"
    if set(sums) != set(members):
        odd = sorted(set(sums) ^ set(members))
        return f"checksums and members differ: {', '.join(odd[:3])}"
    for name, member in members.items():
        if _sha256(member) != sums[name]:
            return f"checksum mismatch for {name}"
    return None


def check_dir(
    directory: Path, fields: Mapping[str, Any], names: Sequence[str]
) -> str | None:
    """Why an entry directory may not be used for ``fields``, or None.

    Never raises: an unreadable entry is a reason like a damaged one.

    Parameters
    ----------
    directory : Path
        The entry, holding ``meta.json`` and the files ``names``
    fields : Mapping[str, Any]
        The key's fields
    names : Sequence[str]
        Its members (each must have a checksum, and each checksum a member)

    Returns
    -------
    str | None
        As :func:`check_meta`, or ``"unreadable (<error>)"``
    """
    try:
        meta = read_meta(directory)
        return check_meta(meta, fields, {n: directory / n for n in names})
    except Exception as err:  # a damaged entry is a reason, not a crash
        return f"unreadable ({type(err).__name__}: {err})"


def distrust(root: Path, *below: str) -> str | None:
    """``"not trusted (<why>)"`` when code under ``root/below...`` must not be
    loaded (:func:`~earth2studio_compile.cache.untrusted`, warned once per
    root), else None.

    Parameters
    ----------
    root : Path
        The cache root checked (the warning names it)
    *below : str
        Path parts under ``root`` down to the code's directory

    Returns
    -------
    str | None
        Why not, or None
    """
    reason = untrusted(root, *below)
    if reason is None:
        return None
    refuse_untrusted(root, reason)
    return f"not trusted ({reason})"


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: a temporary file beside it, renamed.

    Parameters
    ----------
    path : Path
        The file written (replaced if there)
    data : bytes
        Its contents
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def keep_json(path: Path, value: Any, what: str) -> None:
    """Write ``value`` as JSON to ``path`` whole (:func:`write_file`), its
    directory made private. Never raises: a cache the process cannot write only
    loses the record, which a later process then finds missing.

    Parameters
    ----------
    path : Path
        The file written
    value : Any
        What to keep (JSON-serialisable)
    what : str
        The record in words, for the DEBUG line of a failed write
    """
    try:
        make_private_dir(path.parent)
        write_file(path, json.dumps(value).encode())
    except Exception as err:
        logger.debug(f"Could not keep {what}: {err!r}")


def keep_reason(path: Path, reason: str, what: str) -> None:
    """Keep why something cannot be done for a key (:func:`keep_json` of
    ``{"reason": reason}``): a refused build, a judge that kept no figures. Never
    raises.

    Parameters
    ----------
    path : Path
        The record's file
    reason : str
        Why
    what : str
        The record in words, for the DEBUG line of a failed write
    """
    keep_json(path, {"reason": reason}, what)


def read_reason(path: Path) -> str | None:
    """The reason :func:`keep_reason` kept at ``path``; None where none was, or the
    record is not readable (what it stopped is tried, as without it).

    Parameters
    ----------
    path : Path
        The record's file

    Returns
    -------
    str | None
        The reason, a non-empty text
    """
    try:
        reason = json.loads(path.read_text())["reason"]
    except Exception:
        return None
    return reason if isinstance(reason, str) and reason else None


@contextlib.contextmanager
def staged(parent: Path) -> Iterator[Path]:
    """A private temporary directory in ``parent`` to build an entry in.

    Whatever is left of it at the end (an entry not :func:`install`-ed, a build
    that failed) is removed.
    """
    make_private_dir(parent)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=TMP_PREFIX))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install(tmp: Path, target: Path) -> Path:
    """Rename a finished entry directory into place, replacing an old one whole.

    Its files lose group and other write permission first (an entry is code:
    :func:`distrust` refuses what others may write). When another process
    installs the same key meanwhile, both entries are whole and one stays.

    Parameters
    ----------
    tmp : Path
        The entry, built in :func:`staged` in ``target``'s parent
    target : Path
        Where it goes

    Returns
    -------
    Path
        ``target``
    """
    for path in (tmp, *tmp.rglob("*")):
        mode = path.stat().st_mode
        if mode & 0o022:
            path.chmod(mode & ~0o022)
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=TMP_PREFIX))
        with contextlib.suppress(FileNotFoundError):  # another replaced it first
            os.replace(target, old / "old")
    try:
        os.replace(tmp, target)
    except OSError:
        if not target.exists():
            raise
        # Another process installed the same key meanwhile: both are whole.
        shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def identity(path: Path) -> tuple[int, ...] | None:
    """What tells one file at ``path`` from the next (a rename replaces it)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


def _lock_options() -> dict[str, Any]:
    # Fail closed where the file system has no flock: filelock's fallback, a lock
    # file whose existence is the lock, outlives a holder that dies.
    params = inspect.signature(filelock.BaseFileLock.__init__).parameters
    return {"fallback_to_soft": False} if "fallback_to_soft" in params else {}


_LOCK_OPTIONS = _lock_options()


def file_lock(path: Path) -> filelock.BaseFileLock:
    """An OS lock on ``path`` (not taken yet), shared by the threads of a process.

    The kernel frees it when its holder dies; where the file system has no flock,
    taking it raises ``OSError`` instead of falling back to a lock file that would
    outlive a dead holder.
    """
    return filelock.FileLock(path, thread_local=False, **_LOCK_OPTIONS)


def held(path: Path) -> bool:
    """Whether some process holds the :func:`file_lock` on ``path`` now (taken and
    given back at once where none does).

    Parameters
    ----------
    path : Path
        The lock file

    Returns
    -------
    bool
        True while another holder has it

    Raises
    ------
    OSError
        The file system has no flock (:func:`file_lock`)
    """
    lock = file_lock(path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    lock.release()
    return False
