"""Persistent, portable compile cache: pay the compile cost once, not every run.

Two layers, both under :func:`cache_root` (default ``$EARTH2STUDIO_CACHE/compile``,
i.e. ``~/.cache/earth2studio/compile``, next to Earth2Studio's model and data caches):

``inductor/``
    Inductor's local on-disk cache (``TORCHINDUCTOR_CACHE_DIR``), used unless you
    set that variable yourself. PyTorch's default lives in ``/tmp`` and is lost on
    reboot. Importing PyTorch's compiler sets the variable to that default, so a
    value equal to it does not count as yours (see :func:`use_local_cache`).
``artifacts/``
    One bundle per compiled region, keyed by model class, core class, parameter and
    input shapes and dtypes, device name, options and torch/triton/Python versions.
    A bundle holds PyTorch's own cache artifacts
    (:func:`torch.compiler.save_cache_artifacts`) plus the kernel files that compile
    wrote into the local Inductor cache: on CPU PyTorch's artifacts do not carry the
    compiled C++ kernels, so without them a "warm" start on a fresh machine rebuilds
    every kernel. Copy ``artifacts/`` to a new node and its first compile is warm.

Set ``EARTH2STUDIO_COMPILE_CACHE`` to move the root, or to ``off`` (``0``,
``false``, ``none``, empty) to disable both layers. A bundle that cannot be read, was
made for something else or fails its checks is ignored with one WARNING that names
it, and the region compiles cold (and saves a fresh bundle over it): a cache can cost
time, never a wrong result or a crash. ``meta.json`` in each bundle records a sha256
of every other member; a bundle is read and verified whole before anything from it
is written, because Inductor trusts the files in its local cache by name and a
damaged kernel planted there would break every later compile on that cache. Kernel
files are written under temporary names and renamed only when all are written, and
never replace a file already there.

Many processes, one compile. When several processes (``torchrun`` ranks, job-array
tasks) share a root and reach the same region together, the first takes a lock per
bundle key (``artifacts/<key>.lock``, an OS lock from :mod:`filelock`, freed by the
kernel if its holder dies), compiles and saves the bundle; the others wait for the
lock, up to ``EARTH2STUDIO_COMPILE_LOCK_TIMEOUT`` seconds (default 300), and load what
it saved. A waiter that times out compiles itself with one WARNING. Bundles are
written under temporary names and renamed, so a reader never sees half of one.

A bundle is code (compiled kernels and generated Python): whoever can write to the
root can run code in every process that loads from it. Like ssh with its keys,
nothing is loaded, and Inductor's local cache is not pointed at ``inductor/``, unless
the root and every directory and file below it on the way are owned by this user and
writable by no one else, or the root is named in ``EARTH2STUDIO_COMPILE_TRUSTED_ROOT``
(paths separated by ``os.pathsep``). Directories this package creates are private
(``0o700``).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import platform
import sys
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
from earth2studio_compile._torch import tree_flatten

ENV = "EARTH2STUDIO_COMPILE_CACHE"
_OFF = {"", "0", "off", "false", "none", "no"}
# 2: meta.json holds a sha256 of every other member; bundles without them are
# ignored.
FORMAT = 2
# Directories of the local Inductor cache that PyTorch's artifacts already carry,
# or that only hold lock files.
_SKIP_DIRS = {"locks", "fxgraph", "aotautograd"}
_META = "meta.json"
_MEGA = "torch-artifacts.bin"
_FILES = "local/"
_TMP = ".e2sc-"  # prefix of files being written; never part of a bundle
# The local cache directory use_local_cache last set, so a later call may move it.
_SET_HERE: str | None = None
LOCK_TIMEOUT_ENV = "EARTH2STUDIO_COMPILE_LOCK_TIMEOUT"
TRUSTED_ENV = "EARTH2STUDIO_COMPILE_TRUSTED_ROOT"
_LOCK_TIMEOUT = 300.0
# Roots already warned about in this process: one WARNING per root and cause, not
# one per region.
_WARNED: set[tuple[str, str]] = set()


def _uid() -> int:
    """The user whose files may be loaded (tests substitute another)."""
    return os.geteuid()


def _warn_once(root: Path, cause: str, message: str) -> None:
    key = (str(root), cause)
    if key in _WARNED:
        logger.debug(message)
        return
    _WARNED.add(key)
    logger.warning(message)


def _trusted_roots() -> list[Path]:
    value = os.environ.get(TRUSTED_ENV, "")
    return [Path(p).expanduser().resolve() for p in value.split(os.pathsep) if p]


def untrusted(root: Path, *below: str) -> str | None:
    """Why code under ``root`` must not be loaded, or None when it may be.

    ``root`` and each path below it down to ``root/below[0]/below[1]/...`` must be
    owned by this user and writable by no one else (the rule ssh applies to its
    keys): anyone who can write there can put code into every process that loads
    from it. A root named in ``EARTH2STUDIO_COMPILE_TRUSTED_ROOT`` (or below one) is
    trusted as it is. Paths that do not exist yet pass: there is nothing to load.

    Parameters
    ----------
    root : Path
        The package cache root
    *below : str
        Path components under the root, e.g. ``"artifacts", "<key>.tar"``

    Returns
    -------
    str | None
        E.g. ``"/shared/cache is writable by its group"``
    """
    path = root.expanduser().resolve()
    if any(path == t or t in path.parents for t in _trusted_roots()):
        return None
    uid = _uid()
    for part in (None, *below):
        if part is not None:
            path = path / part
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        if st.st_uid != uid:
            return f"{path} is owned by uid {st.st_uid}, not by you (uid {uid})"
        if st.st_mode & 0o022:
            who = "others" if st.st_mode & 0o002 else "its group"
            return f"{path} is writable by {who}"
    return None


def _refuse(root: Path, reason: str) -> None:
    _warn_once(
        root,
        "untrusted",
        f"Not loading compiled code from the compile cache at {root}: {reason}. "
        "Compiled kernels run as code in every process that loads them, so this "
        "process compiles its own. Fix: `chmod go-w` it (and own it), use a cache "
        f"root only you can write (EARTH2STUDIO_COMPILE_CACHE), or, if everyone who "
        f"can write there is trusted, set {TRUSTED_ENV}={root}.",
    )


def _private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) readable and writable by this user only."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o700, exist_ok=True)


def lock_timeout() -> float:
    """Seconds a process waits for another's compile of the same region.

    Returns
    -------
    float
        ``$EARTH2STUDIO_COMPILE_LOCK_TIMEOUT`` if set, else 300
    """
    value = os.environ.get(LOCK_TIMEOUT_ENV)
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            logger.warning(
                f"Ignoring {LOCK_TIMEOUT_ENV}={value!r} (not a number of seconds); "
                f"waiting up to {_LOCK_TIMEOUT:.0f} s."
            )
    return _LOCK_TIMEOUT


def cache_root() -> Path | None:
    """Root of the package's compile cache, or None when disabled.

    Returns
    -------
    Path | None
        ``$EARTH2STUDIO_COMPILE_CACHE`` if set (None if it says ``off``), else
        ``$EARTH2STUDIO_CACHE/compile``, else ``~/.cache/earth2studio/compile``
    """
    value = os.environ.get(ENV)
    if value is not None:
        if value.strip().lower() in _OFF:
            return None
        return Path(value).expanduser()
    base = os.environ.get(
        "EARTH2STUDIO_CACHE", str(Path.home() / ".cache" / "earth2studio")
    )
    return Path(base).expanduser() / "compile"


def usable_root(root: Path) -> Path | None:
    """``root`` if it is (or could be made) a directory, else None with one WARNING.

    A root that cannot exist as a directory (a path under a regular file, a
    parent this process may not write) holds no bundle and takes none: the
    session then compiles without the persistent cache rather than falling back
    to eager at the first compile that touches it. An existing directory is
    returned even when read-only: its bundles are still loaded.

    Parameters
    ----------
    root : Path
        The package cache root (:func:`cache_root`)

    Returns
    -------
    Path | None
        ``root``, or None to compile without persistence
    """
    try:
        _private_dir(root)
        if root.is_dir():
            return root
        reason = "it exists and is not a directory"
    except OSError as err:
        reason = err.strerror or str(err)
    _warn_once(
        root,
        "unusable",
        f"The compile cache is off: its root {root} cannot be a directory "
        f"({reason}). Compiling without it: nothing is loaded from or saved to a "
        "persistent cache, so each process compiles from scratch. Fix: set "
        f'{ENV} to a writable directory, or to "off" to silence this.',
    )
    return None


def use_local_cache(root: Path) -> Path:
    """Point Inductor's local cache at ``root/inductor`` unless the user chose one.

    ``TORCHINDUCTOR_CACHE_DIR`` counts as the user's choice only when it names
    something other than torch's own default (``default_cache_dir()``, e.g.
    ``/tmp/torchinductor_$USER``) and other than a directory this function set
    earlier in the process: importing ``torch._dynamo`` (as this package does) calls
    Inductor's ``cache_dir()``, which sets the variable to that default, so "set"
    alone says nothing about the user.

    Moving it is safe at any time, also after a compile. In torch 2.14.1 Inductor
    calls ``cache_dir()``, which reads the variable, at every lookup and write (FX
    graph, AOTAutograd and kernel caches, locks), and compile workers are handed
    the parent's value with each task. What stays behind: the local autotune cache
    path is memoized (``CacheBase.get_local_cache_path``: cleared here), the first
    Triton kernel sets ``TRITON_CACHE_DIR`` once to ``<cache dir>/triton/<device>``
    (moved here when it points under the old directory), Dynamo's precompile cache
    path is fixed at import (used only with ``caching_precompile``), and precompiled
    C++ headers always go under torch's default. Kernels already loaded in this
    process keep working from wherever they were built.

    Parameters
    ----------
    root : Path
        The package cache root

    Returns
    -------
    Path
        The local cache directory in effect
    """
    global _SET_HERE
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    current = os.path.abspath(value) if value else None
    if current is not None and current not in (
        _torch.default_inductor_cache_dir(),
        _SET_HERE,
    ):
        return Path(value)  # type: ignore[arg-type]
    local = (root / "inductor").expanduser().absolute()
    # Inductor trusts the files in its local cache by name: the same rule as for
    # bundles decides whether it may use the one under this root.
    reason = untrusted(root, "inductor")
    if reason is not None:
        _refuse(root, reason)
    else:
        try:
            _private_dir(local)
            writable = os.access(local, os.W_OK)
        except OSError:
            writable = False
        if not writable:
            _read_only(root)
            reason = "read-only"
    if reason is not None:
        if current is not None and current == _SET_HERE:
            # Set here for an earlier root: back to Inductor's own default.
            default = _torch.default_inductor_cache_dir()
            if default is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = default
                _forget(Path(current), Path(default))
            _SET_HERE = None
        return Path(_torch.inductor_cache_dir())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _SET_HERE = str(local)
    if current is not None and current != str(local):
        _forget(Path(current), local)
    logger.trace(f"Inductor cache: {local}")
    return local


def _read_only(root: Path) -> None:
    _warn_once(
        root,
        "read-only",
        f"The compile cache at {root} is read-only for this process: bundles "
        "already there are loaded, but nothing new is saved and processes cannot "
        "agree who compiles, so each one compiles the regions it lacks. Fix: make "
        "it writable (it holds the lock files that let one process compile for "
        "all), or fill it once from one process before starting the others.",
    )


def _forget(old: Path, new: Path) -> None:
    """Drop what Inductor derived from the local cache directory it used before."""
    triton = os.environ.get("TRITON_CACHE_DIR")
    if triton and Path(triton).parent == old / "triton":
        os.environ["TRITON_CACHE_DIR"] = str(new / "triton" / Path(triton).name)
    _torch.forget_local_cache_paths()


def device_name(device: torch.device) -> str:
    """The hardware compiled code is specific to: GPU name and capability, or CPU."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"
    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(
                (
                    line.split(":", 1)[1].strip()
                    for line in f
                    if line.startswith("model name")
                ),
                model,
            )
    except OSError:
        pass
    return f"{platform.machine()} {model}".strip()


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        triton = version("triton")
    except PackageNotFoundError:
        triton = None
    return {
        "torch": torch.__version__,
        "triton": triton,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _leaf(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return [list(value.shape), str(value.dtype), value.device.type]
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    return type(value).__name__


def key_fields(
    model: str,
    region: str,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    options: str,
    device: torch.device,
) -> dict[str, Any]:
    """Everything a compiled region's artifacts depend on.

    Parameters
    ----------
    model : str
        Qualified class name of the model that owns the region
    region : str
        Dotted path of the region in the model
    module : torch.nn.Module
        The region's module
    args, kwargs : tuple, Mapping
        Its first call's arguments
    options : str
        Compile options, in a stable text form
    device : torch.device
        Device of the first input

    Returns
    -------
    dict[str, Any]
        JSON-serialisable fields; :func:`artifact_key` hashes them
    """
    params = hashlib.sha256(
        json.dumps(
            [[n, list(t.shape), str(t.dtype)] for n, t in module.state_dict().items()]
        ).encode()
    ).hexdigest()[:16]
    leaves, _ = tree_flatten((args, dict(kwargs)))
    return {
        "format": FORMAT,
        "model": model,
        "region": region,
        "core": f"{type(module).__module__}.{type(module).__qualname__}",
        "parameters": params,
        "inputs": [_leaf(x) for x in leaves],
        "device": device_name(device),
        "options": options,
        **_versions(),
    }


def artifact_key(fields: Mapping[str, Any]) -> str:
    """Short stable hash of :func:`key_fields`."""
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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
            if name.startswith(_TMP):
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
        if _META not in members:
            raise ValueError(f"no {_META}")
        meta = json.loads(members.pop(_META)[0])
        fields = meta.get("fields") if isinstance(meta, dict) else None
        expected = json.loads(json.dumps(self.fields, default=str))
        if not isinstance(fields, dict) or fields != expected:
            found = fields if isinstance(fields, dict) else {}
            diff = sorted(k for k in expected if found.get(k) != expected[k])
            raise ValueError(f"made for a different {', '.join(diff) or 'key'}")
        sums = meta.get("sha256")
        if not isinstance(sums, dict) or not sums:
            raise ValueError("no checksums")
        if set(sums) != set(members):
            odd = sorted(set(sums) ^ set(members))
            raise ValueError(f"checksums and members differ: {', '.join(odd[:3])}")
        kernels = []
        for name, (data, mode) in members.items():
            if hashlib.sha256(data).hexdigest() != sums[name]:
                raise ValueError(f"checksum mismatch for {name}")
            if name == _MEGA:
                continue
            if not name.startswith(_FILES):
                raise ValueError(f"unexpected member {name!r}")
            target = (local / name.removeprefix(_FILES)).resolve()
            if local not in target.parents or target.name.startswith(_TMP):
                raise ValueError(f"unsafe path {name!r}")
            kernels.append((target, data, mode & 0o777 or 0o644))
        return kernels, members[_MEGA][0] if _MEGA in members else None

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
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TMP)
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
                members[_MEGA] = (mega, 0o644)
            for rel in new:
                path = self.local / rel
                if path.is_file():
                    members[_FILES + rel.replace(os.sep, "/")] = (
                        path.read_bytes(),
                        path.stat().st_mode & 0o777,
                    )
            sums = {n: hashlib.sha256(d).hexdigest() for n, (d, _) in members.items()}
            meta = {"fields": self.fields, "sha256": sums}
            _private_dir(self.directory)
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                _add_bytes(tar, _META, json.dumps(meta, default=str, indent=1).encode())
                for name, (data, mode) in members.items():
                    _add_bytes(tar, name, data, mode)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=_TMP)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(buffer.getvalue())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
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


def cache_state(hits: int, misses: int) -> str | None:
    """``"warm"``, ``"cold"`` or ``"partial"`` from Inductor's FX-graph cache counts."""
    if misses and hits:
        return "partial"
    if misses:
        return "cold"
    if hits:
        return "warm"
    return None


def local_cache_source(local: str) -> str:
    """Which Inductor local cache ``local`` is, for the report.

    A warm compile may come from this package's cache, from a directory the user
    chose, or from PyTorch's default (``/tmp``) when this package's cache is off:
    the report says which, so "warm" never suggests a cache the user turned off.

    Parameters
    ----------
    local : str
        Inductor's local cache directory in effect

    Returns
    -------
    str
        E.g. ``"this package's cache (~/.cache/earth2studio/compile/inductor)"``
    """
    path = os.path.abspath(local)
    root = cache_root()
    if root is not None and path == os.path.abspath(root / "inductor"):
        return f"this package's cache ({path})"
    if path == _torch.default_inductor_cache_dir():
        return f"PyTorch's default cache ({path}), not this package's"
    return f"your cache (TORCHINDUCTOR_CACHE_DIR, {path})"


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
    owner : str
        Qualified class name of the model that owns the region
    region : str
        Dotted path of the region in the model
    module : torch.nn.Module
        The region's module
    """

    def __init__(
        self, directory: Path, owner: str, region: str, module: torch.nn.Module
    ) -> None:
        self.directory = directory
        self.owner = owner
        self.region = region
        self.module = module
        self.cache: ArtifactCache | None = None
        #: Seconds this process waited for another's compile of the same key.
        self.waited: float | None = None
        self._lock: filelock.BaseFileLock | None = None
        self._save = True  # False where nothing may be written (read-only, untrusted)

    @property
    def path(self) -> Path | None:
        """The bundle file of the first call's key, once known."""
        return self.cache.path if self.cache is not None else None

    def load(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        device: torch.device,
        options: str,
    ) -> str | None:
        """Key the bundle on the first call and unpack it if there is one.

        Without a usable bundle, this process takes the key's lock and holds it
        until :meth:`finish` or :meth:`release`. If another process holds it, this
        one waits (``EARTH2STUDIO_COMPILE_LOCK_TIMEOUT``) and loads the bundle that
        process saved; if it died without saving, this one compiles.

        Returns
        -------
        str | None
            ``"loaded"``, ``"ignored: <why>"``, or None (no bundle, or no key)
        """
        if _torch.missing("cache_dir"):
            return None
        try:
            fields = key_fields(
                self.owner, self.region, self.module, args, kwargs, options, device
            )
        except Exception as err:  # an odd argument must not stop the compile
            logger.trace(f"No compile cache key for {self.owner}.{self.region}: {err}")
            return None
        self.cache = ArtifactCache(
            self.directory, Path(_torch.inductor_cache_dir()), fields
        )
        seen = _identity(self.cache.path)
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
        reason = untrusted(root, self.directory.name, self.cache.path.name)
        if reason is not None:
            _refuse(root, reason)
            self._save = False
            return f"ignored: not trusted ({reason})"
        return self.cache.load()

    def _lock_or_wait(self, seen: tuple[int, ...] | None) -> bool:
        """Hold the key's lock for this process's compile, waiting for a holder.

        Parameters
        ----------
        seen : tuple[int, ...] | None
            :func:`_identity` of the bundle file before :meth:`load` read it

        Returns
        -------
        bool
            True when a bundle other than ``seen`` is there now (another process
            saved it; the lock is not held), False when this process compiles
        """
        assert self.cache is not None
        root = self.directory.parent
        label = f"{self.owner}.{self.region}"
        try:
            _private_dir(self.directory)
            lock = filelock.FileLock(
                self.cache.path.with_suffix(".lock"),
                thread_local=False,
                **_LOCK_OPTIONS,
            )
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
                _read_only(root)
                self._save = False
            else:
                _warn_once(
                    root,
                    "lock",
                    f"Cannot lock {self.directory} ({err}): processes sharing this "
                    "compile cache each compile the regions they lack. Fix: a cache "
                    "root on a file system with flock (local disk, NFS; Lustre "
                    "mounted with -o flock).",
                )
            return False
        if _identity(self.cache.path) != seen:
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


def _identity(path: Path) -> tuple[int, ...] | None:
    """What tells one file at ``path`` from the next (a rename replaces it)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


def _lock_options() -> dict[str, Any]:
    import inspect

    # Fail closed where the file system has no flock: filelock's fallback, a lock
    # file whose existence is the lock, outlives a holder that dies.
    params = inspect.signature(filelock.BaseFileLock.__init__).parameters
    return {"fallback_to_soft": False} if "fallback_to_soft" in params else {}


_LOCK_OPTIONS = _lock_options()
