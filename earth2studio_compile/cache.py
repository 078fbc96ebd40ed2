"""Persistent, portable compile cache: pay the compile cost once, not every run.

Two layers, both under :func:`cache_root` (default ``$EARTH2STUDIO_CACHE/compile``,
i.e. ``~/.cache/earth2studio/compile``, next to Earth2Studio's model and data caches):

``inductor/``
    Inductor's local on-disk cache (``TORCHINDUCTOR_CACHE_DIR``), used when you have
    not set that variable yourself. PyTorch's default lives in ``/tmp`` and is lost
    on reboot.
``artifacts/``
    One bundle per compiled region, keyed by model class, core class, parameter and
    input shapes and dtypes, device name, options and torch/triton/Python versions.
    A bundle holds PyTorch's own cache artifacts
    (:func:`torch.compiler.save_cache_artifacts`) plus the kernel files that compile
    wrote into the local Inductor cache: on CPU PyTorch's artifacts do not carry the
    compiled C++ kernels, so without them a "warm" start on a fresh machine rebuilds
    every kernel. Copy ``artifacts/`` to a new node and its first compile is warm.

Set ``EARTH2STUDIO_COMPILE_CACHE`` to move the root, or to ``off`` (``0``,
``false``, ``none``, empty) to disable both layers. A bundle that cannot be read or
was made for something else is ignored with one WARNING and the region compiles
cold: a cache can cost time, never a wrong result or a crash. Whatever a bundle
holds, Inductor checks its own keys before using an entry.
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
from torch.utils._pytree import tree_flatten

ENV = "EARTH2STUDIO_COMPILE_CACHE"
_OFF = {"", "0", "off", "false", "none", "no"}
FORMAT = 1
# Directories of the local Inductor cache that PyTorch's artifacts already carry,
# or that only hold lock files.
_SKIP_DIRS = {"locks", "fxgraph", "aotautograd"}
_META = "meta.json"
_MEGA = "torch-artifacts.bin"
_FILES = "local/"


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
    base = os.environ.get("EARTH2STUDIO_CACHE", str(Path.home() / ".cache" / "earth2studio"))
    return Path(base).expanduser() / "compile"


def use_local_cache(root: Path) -> Path:
    """Point Inductor's local cache at ``root/inductor`` unless the user chose one.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` at each lookup and sets it itself on
    first use, so this only takes effect in a process that has not compiled yet.

    Parameters
    ----------
    root : Path
        The package cache root

    Returns
    -------
    Path
        The local cache directory in effect
    """
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        local = root / "inductor"
        local.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(local)
        logger.debug(f"Inductor cache: {local}")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def device_name(device: torch.device) -> str:
    """The hardware compiled code is specific to: GPU name and capability, or CPU model."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"
    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
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
        """Unpack the bundle into the local caches before the first compile.

        Returns
        -------
        str | None
            ``"loaded"``, ``"ignored: <why>"``, or None when there is no bundle
        """
        self._before = _list_files(self.local)
        if not self.path.exists():
            return None
        try:
            with tarfile.open(self.path) as tar:
                meta = json.loads(tar.extractfile(_META).read())  # type: ignore[union-attr]
                if meta.get("fields") != json.loads(json.dumps(self.fields, default=str)):
                    diff = sorted(
                        k for k in self.fields if meta.get("fields", {}).get(k) != self.fields[k]
                    )
                    raise ValueError(f"made for a different {', '.join(diff) or 'key'}")
                self._unpack(tar)
                names = tar.getnames()
                if _MEGA in names and hasattr(torch.compiler, "load_cache_artifacts"):
                    torch.compiler.load_cache_artifacts(tar.extractfile(_MEGA).read())  # type: ignore[union-attr]
        except Exception as err:  # any unreadable bundle: compile cold instead
            reason = f"{type(err).__name__}: {err}"
            logger.warning(
                f"Ignoring compile cache bundle {self.path} ({reason}); compiling "
                "from scratch. Delete it, or set EARTH2STUDIO_COMPILE_CACHE=off to "
                "disable the cache."
            )
            return f"ignored: {reason}"
        logger.debug(f"Loaded compile cache bundle {self.path}")
        return "loaded"

    def _unpack(self, tar: tarfile.TarFile) -> None:
        local = self.local.resolve()
        for member in tar.getmembers():
            if not member.name.startswith(_FILES) or not member.isfile():
                continue
            rel = member.name[len(_FILES):]
            target = (local / rel).resolve()
            if local not in target.parents:
                raise ValueError(f"unsafe path {member.name!r}")
            if target.exists():
                continue  # never overwrite what this machine built itself
            target.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".e2sc-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
            os.chmod(target, member.mode & 0o777 or 0o644)

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
            self.directory.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                meta = json.dumps({"fields": self.fields}, default=str, indent=1).encode()
                _add_bytes(tar, _META, meta)
                if mega is not None:
                    _add_bytes(tar, _MEGA, mega)
                for rel in new:
                    path = self.local / rel
                    if path.is_file():
                        tar.add(path, arcname=_FILES + rel.replace(os.sep, "/"))
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".e2sc-")
            with os.fdopen(fd, "wb") as f:
                f.write(buffer.getvalue())
            os.replace(tmp, self.path)
        except Exception as err:  # a full disk must not break a forecast
            logger.warning(f"Could not write compile cache bundle {self.path}: {err}")
            return False
        logger.debug(f"Saved compile cache bundle {self.path} ({len(new)} kernel files)")
        return True


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
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
