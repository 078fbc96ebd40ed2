"""Where a benchmark ran: hardware, versions, date and the project's commit."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def environment(device: str) -> dict[str, Any]:
    """Hardware and versions, for the JSON and the docs."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    env: dict[str, Any] = {
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for pkg in ("triton", "earth2studio", "nvidia-physicsnemo", "torch-harmonics"):
        try:
            env[pkg] = version(pkg)
        except PackageNotFoundError:
            env[pkg] = None
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    return env


#: The commit to record instead of asking git: the device machines get a copy of
#: the working tree beside a stale copy of ``.git``, so their runs recorded an older
#: commit (``+dirty``) for every tree; the command names the tree it sent.
COMMIT_ENV = "EARTH2STUDIO_COMPILE_BENCH_COMMIT"


def git_commit() -> str | None:
    """The commit of the checkout this package runs from, ``+dirty`` if it has
    uncommitted changes; None outside a git checkout (an installed wheel).
    ``EARTH2STUDIO_COMPILE_BENCH_COMMIT``, where set, is recorded as it is."""
    named = os.environ.get(COMMIT_ENV, "").strip()
    if named:
        return named
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")
