"""The bundles of the compile cache: one region's compiled code, packed to travel.

A bundle (``cache_root()/artifacts/<key>.tar``) holds PyTorch's own cache artifacts
(:func:`torch.compiler.save_cache_artifacts`) plus the kernel files that compile
wrote into the local Inductor cache, and a ``meta.json`` with the key's fields and a
sha256 of every other member. :class:`RegionBundle` is one region's bundle around
its first compile: loaded (verified whole) before, saved after, with a lock per key
so that processes sharing the root compile once. Its key is
:meth:`.key.RegionTarget.bundle_fields`; writing it whole, checking it and the
lock are :mod:`.store`'s; the rules it keeps (trust, read-only roots, never a
wrong result) are in :mod:`earth2studio_compile.cache`.
"""

from __future__ import annotations

import errno
import io
import os
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile.artifacts import store
from earth2studio_compile.artifacts.key import RegionTarget
from earth2studio_compile.artifacts.store import META, TMP_PREFIX
from earth2studio_compile.cache import (
    LOCK_TIMEOUT_ENV,
    artifact_key,
    lock_timeout,
    make_private_dir,
    warn_once,
    warn_read_only,
)

# Directories of the local Inductor cache that PyTorch's artifacts already carry,
# or that only hold lock files.
_SKIP_DIRS = {"locks", "fxgraph", "aotautograd"}

MEGA = "torch-artifacts.bin"
FILES = "local/"


def _list_files(local: Path) -> set[str]:
    if not local.is_dir():
        return set()
    out = set()
    for dirpath, dirnames, filenames in os.walk(local):
        rel = os.path.relpath(dirpath, local)
        top = rel.split(os.sep, 1)[0]
        if top in _SKIP_DIRS:
            dirnames[:] = []
            continue
        for name in filenames:
            if name.startswith(TMP_PREFIX):
                continue
            out.add(os.path.normpath(os.path.join(rel, name)))
    return out


@dataclass
class ArtifactCache:
    """The ``artifacts/`` layer for one region's first compile.

    Parameters
    ----------
    directory : Path
        Where bundles live (``cache_root() / "artifacts"``)
    local : Path
        Inductor's local cache directory in effect
    fields : dict[str, Any]
        :func:`key_fields` of the region's first call
    """

    directory: Path
    local: Path
    fields: dict[str, Any]

    def __post_init__(self) -> None:
        self.key = artifact_key(self.fields)
        self.path = self.directory / f"{self.key}.tar"
        self._before: set[str] = set()

    def load(self) -> str | None:
        """Verify the bundle, then unpack it into the local caches before the first
        compile.

        Every member is read and checked against the key fields and the sha256 in
        ``meta.json`` before anything is written: a damaged kernel file planted in
        Inductor's local cache would be loaded by every later compile on that cache,
        whatever this package's settings, since Inductor trusts files by name.

        Returns
        -------
        str | None
            ``"loaded"``, ``"ignored: <why>"``, or None when there is no bundle
        """
        self._before = _list_files(self.local)
        if not self.path.exists():
            return None
        try:
            kernels, mega = self._verified()
            self._plant(kernels, mega)
        except Exception as err:  # any unreadable or damaged bundle: compile cold
            reason = f"{type(err).__name__}: {err}"
            logger.warning(
                f"Ignoring compile cache bundle {self.path} ({reason}); compiling "
                "from scratch. Delete it, or set EARTH2STUDIO_COMPILE_CACHE=off to "
                "disable the cache."
            )
            return f"ignored: {reason}"
        logger.trace(f"Loaded compile cache bundle {self.path}")
        return "loaded"

    def _verified(self) -> tuple[list[tuple[Path, bytes, int]], bytes | None]:
        """Read and check the whole bundle; raise on the first fault.

        Returns
        -------
        tuple[list[tuple[Path, bytes, int]], bytes | None]
            (target path, data, mode) of each kernel file, and PyTorch's artifacts
        """
        local = self.local.resolve()
        with tarfile.open(self.path) as tar:
            members: dict[str, tuple[bytes, int]] = {}
            for member in tar.getmembers():
                if not member.isfile():
                    raise ValueError(f"unexpected member {member.name!r}")
                if member.name in members:
                    raise ValueError(f"duplicate member {member.name!r}")
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                members[member.name] = (data, member.mode)
        if META not in members:
            raise ValueError(f"no {META}")
        meta = store.read_meta(members.pop(META)[0])
        reason = store.check_meta(
            meta, self.fields, {name: data for name, (data, _) in members.items()}
        )
        if reason is not None:
            raise ValueError(reason)
        kernels = []
        for name, (data, mode) in members.items():
            if name == MEGA:
                continue
            if not name.startswith(FILES):
                raise ValueError(f"unexpected member {name!r}")
            target = (local / name.removeprefix(FILES)).resolve()
            if local not in target.parents or target.name.startswith(TMP_PREFIX):
                raise ValueError(f"unsafe path {name!r}")
            kernels.append((target, data, mode & 0o777 or 0o644))
        return kernels, members[MEGA][0] if MEGA in members else None

    @staticmethod
    def _plant(kernels: list[tuple[Path, bytes, int]], mega: bytes | None) -> None:
        """Write verified kernel files, all or none, then load PyTorch's artifacts."""
        staged: list[tuple[str, Path]] = []
        planted: list[Path] = []
        try:
            # Everything goes to temporary names first, so that a full disk or a
            # crash leaves no partial kernel file under a name Inductor would trust.
            for target, data, mode in kernels:
                if target.exists():
                    continue  # never overwrite what this machine built itself
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=TMP_PREFIX)
                staged.append((tmp, target))
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chmod(tmp, mode)
            for tmp, target in staged:
                os.replace(tmp, target)
                planted.append(target)
            if mega is not None and hasattr(torch.compiler, "load_cache_artifacts"):
                torch.compiler.load_cache_artifacts(mega)
        except BaseException:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            for target in planted:
                target.unlink(missing_ok=True)
            raise

    def save(self) -> bool:
        """Write the bundle after a cold first compile.

        Returns
        -------
        bool
            True when a bundle was written
        """
        try:
            new = sorted(_list_files(self.local) - self._before)
            mega = None
            if hasattr(torch.compiler, "save_cache_artifacts"):
                saved = torch.compiler.save_cache_artifacts()
                mega = saved[0] if saved is not None else None
            if mega is None and not new:
                return False
            # Each file is read once, so that its checksum and its bytes in the
            # bundle agree even if Inductor rewrites it meanwhile.
            members: dict[str, tuple[bytes, int]] = {}
            if mega is not None:
                members[MEGA] = (mega, 0o644)
            for rel in new:
                path = self.local / rel
                if path.is_file():
                    members[FILES + rel.replace(os.sep, "/")] = (
                        path.read_bytes(),
                        path.stat().st_mode & 0o777,
                    )
            meta = store.meta_bytes(
                self.fields, {n: data for n, (data, _) in members.items()}
            )
            make_private_dir(self.directory)
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                _add_bytes(tar, META, meta)
                for name, (data, mode) in members.items():
                    _add_bytes(tar, name, data, mode)
            store.write_file(self.path, buffer.getvalue())
        except Exception as err:  # a full disk must not break a forecast
            logger.warning(f"Could not write compile cache bundle {self.path}: {err}")
            return False
        logger.trace(f"Saved compile cache bundle {self.path} ({len(members)} members)")
        return True


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


class RegionBundle:
    """One region's bundle around its first compile: load before, save after.

    Across processes that share the cache root, one compiles and the others load:
    :meth:`load` takes the key's lock when there is no bundle to load, and
    :meth:`finish` (or :meth:`release`, for a region that does not finish) lets it
    go once the bundle is saved.

    Parameters
    ----------
    directory : Path
        Where bundles live (``cache_root() / "artifacts"``)
    target : RegionTarget
        The region and its settings (:meth:`RegionTarget.bundle_fields` keys it)
    """

    def __init__(self, directory: Path, target: RegionTarget) -> None:
        self.directory = directory
        self.target = target
        self.cache: ArtifactCache | None = None
        #: Seconds this process waited for another's compile of the same key.
        self.waited: float | None = None
        self._lock: filelock.BaseFileLock | None = None
        self._save = True  # False where nothing may be written (read-only, untrusted)

    @property
    def path(self) -> Path | None:
        """The bundle file of the first call's key, once known."""
        return self.cache.path if self.cache is not None else None

    def load(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        """Key the bundle on the first call and unpack it if there is one.

        Without a usable bundle, this process takes the key's lock and holds it
        until :meth:`finish` or :meth:`release`. If another process holds it, this
        one waits (``EARTH2STUDIO_COMPILE_LOCK_TIMEOUT``) and loads the bundle that
        process saved; if it died without saving, this one compiles.

        Parameters
        ----------
        args, kwargs : tuple[Any, ...], Mapping[str, Any]
            The region's first call's arguments (the bundle's key is made of them)

        Returns
        -------
        str | None
            ``"loaded"``, ``"ignored: <why>"``, or None (no bundle, or no key)
        """
        if _torch.missing("cache_dir"):
            return None
        try:
            fields = self.target.bundle_fields(args, kwargs)
        except Exception as err:  # an odd argument must not stop the compile
            logger.trace(f"No compile cache key for {self.target.label}: {err}")
            return None
        self.cache = ArtifactCache(
            self.directory, Path(_torch.inductor_cache_dir()), fields
        )
        seen = store.identity(self.cache.path)
        status = self._load_trusted()
        if status == "loaded" or not self._save:
            return status
        if not self._lock_or_wait(seen):
            return status
        # Another process saved the bundle while this one looked or waited.
        status = self._load_trusted()
        if status != "loaded":
            self.waited = None
        return status

    def _load_trusted(self) -> str | None:
        assert self.cache is not None
        root = self.directory.parent
        reason = store.distrust(root, self.directory.name, self.cache.path.name)
        if reason is not None:
            self._save = False
            return f"ignored: {reason}"
        return self.cache.load()

    def _lock_or_wait(self, seen: tuple[int, ...] | None) -> bool:
        """Hold the key's lock for this process's compile, waiting for a holder.

        Parameters
        ----------
        seen : tuple[int, ...] | None
            :func:`.store.identity` of the bundle file before :meth:`load` read it

        Returns
        -------
        bool
            True when a bundle other than ``seen`` is there now (another process
            saved it; the lock is not held), False when this process compiles
        """
        assert self.cache is not None
        root = self.directory.parent
        label = self.target.label
        try:
            make_private_dir(self.directory)
            lock = store.file_lock(self.cache.path.with_suffix(".lock"))
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                timeout = lock_timeout()
                logger.info(
                    f"Another process is compiling {label}; waiting up to "
                    f"{timeout:.0f} s to load its bundle ({lock.lock_file})"
                )
                start = time.perf_counter()
                try:
                    lock.acquire(timeout=timeout, poll_interval=0.1)
                except filelock.Timeout:
                    logger.warning(
                        f"Waited {timeout:.0f} s for another process to compile "
                        f"{label} (lock {lock.lock_file}); compiling it here too. "
                        f"Raise {LOCK_TIMEOUT_ENV} if its compile takes longer, or "
                        "end that process if it hangs."
                    )
                    return False
                self.waited = time.perf_counter() - start
        except OSError as err:  # read-only root, or no flock on its file system
            if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                warn_read_only(root)
                self._save = False
            else:
                warn_once(
                    root,
                    "lock",
                    f"Cannot lock {self.directory} ({err}): processes sharing this "
                    "compile cache each compile the regions they lack. Fix: a cache "
                    "root on a file system with flock (local disk, NFS; Lustre "
                    "mounted with -o flock).",
                )
            return False
        if store.identity(self.cache.path) != seen:
            lock.release()
            return True
        if self.waited is not None:
            logger.info(
                f"The process compiling {label} ended without saving a bundle; "
                "compiling it here"
            )
            self.waited = None
        self._lock = lock
        return False

    def finish(self, misses: int, artifact: str | None) -> str | None:
        """Save a bundle after a compile that built something; the new status.

        Releases the key's lock, so processes waiting for this compile load the
        bundle.

        Parameters
        ----------
        misses : int
            FX-graph cache misses of the first compile
        artifact : str | None
            The status :meth:`load` returned

        Returns
        -------
        str | None
            ``"saved"``, ``"<artifact>; re-saved"``, ``"loaded after waiting N s"``
            (loaded what another process compiled meanwhile) or ``artifact``
        """
        try:
            if self.cache is None or not (misses or artifact != "loaded"):
                if artifact == "loaded" and self.waited is not None:
                    return f"loaded after waiting {self.waited:.1f} s"
                return artifact
            if not self._save or not self.cache.save():
                return artifact
            return f"{artifact}; re-saved" if artifact else "saved"
        finally:
            self.release()

    def release(self) -> None:
        """Let the key's lock go without saving (the region fell back to eager).

        Processes waiting for this one's compile then take over. Safe to call more
        than once, and when no lock is held.
        """
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release(force=True)
