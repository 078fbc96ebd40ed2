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
    :mod:`earth2studio_compile.artifacts.bundles` packs and unpacks them.

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

import hashlib
import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile import _torch
from earth2studio_compile._torch import tree_flatten

ENV = "EARTH2STUDIO_COMPILE_CACHE"
_OFF = {"", "0", "off", "false", "none", "no"}
# 2: meta.json holds a sha256 of every other member; bundles without them are
# ignored.
FORMAT = 2
TMP_PREFIX = ".e2sc-"  # prefix of files being written; never part of a bundle
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


def warn_once(root: Path, cause: str, message: str) -> None:
    """Log ``message`` as a WARNING the first time for ``(root, cause)``, then at
    DEBUG.

    Parameters
    ----------
    root : Path
        The cache root the message is about
    cause : str
        What kind of problem (one warning per kind and root)
    message : str
        The message
    """
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


def refuse_untrusted(root: Path, reason: str) -> None:
    """Warn (once per root) that compiled code under ``root`` is not loaded.

    Parameters
    ----------
    root : Path
        The cache root
    reason : str
        Why it is not trusted (:func:`untrusted`'s answer)
    """
    warn_once(
        root,
        "untrusted",
        f"Not loading compiled code from the compile cache at {root}: {reason}. "
        "Compiled kernels run as code in every process that loads them, so this "
        "process compiles its own. Fix: `chmod go-w` it (and own it), use a cache "
        f"root only you can write (EARTH2STUDIO_COMPILE_CACHE), or, if everyone who "
        f"can write there is trusted, set {TRUSTED_ENV}={root}.",
    )


def make_private_dir(path: Path) -> None:
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
        make_private_dir(root)
        if root.is_dir():
            return root
        reason = "it exists and is not a directory"
    except OSError as err:
        reason = err.strerror or str(err)
    warn_once(
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
        refuse_untrusted(root, reason)
    else:
        try:
            make_private_dir(local)
            writable = os.access(local, os.W_OK)
        except OSError:
            writable = False
        if not writable:
            warn_read_only(root)
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


def warn_read_only(root: Path) -> None:
    warn_once(
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


def cache_state(hits: int, misses: int) -> str | None:
    """``"warm"``, ``"cold"`` or ``"partial"`` from Inductor's FX-graph cache counts.

    Parameters
    ----------
    hits, misses : int
        FX-graph cache hits and misses during the compile

    Returns
    -------
    str | None
        The state; None when the cache was not consulted
    """
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
