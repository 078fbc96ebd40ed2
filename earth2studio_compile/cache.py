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
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
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
# Directories of the local Inductor cache that PyTorch's artifacts already carry,
# or that only hold lock files.
_SKIP_DIRS = {"locks", "fxgraph", "aotautograd"}
_META = "meta.json"
_MEGA = "torch-artifacts.bin"
_FILES = "local/"
_TMP = ".e2sc-"  # prefix of files being written; never part of a bundle
# The local cache directory use_local_cache last set, so a later call may move it.
_SET_HERE: str | None = None


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
    local.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _SET_HERE = str(local)
    if current is not None and current != str(local):
        _forget(Path(current), local)
    logger.trace(f"Inductor cache: {local}")
    return local


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
            self.directory.mkdir(parents=True, exist_ok=True)
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
        return self.cache.load()

    def finish(self, misses: int, artifact: str | None) -> str | None:
        """Save a bundle after a compile that built something; the new status.

        Parameters
        ----------
        misses : int
            FX-graph cache misses of the first compile
        artifact : str | None
            The status :meth:`load` returned
        """
        if self.cache is None or not (misses or artifact != "loaded"):
            return artifact
        if not self.cache.save():
            return artifact
        return f"{artifact}; re-saved" if artifact else "saved"
