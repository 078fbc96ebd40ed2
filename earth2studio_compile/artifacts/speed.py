"""A region's speed probe, kept beside its ahead-of-time artifact.

The speed probe (:mod:`earth2studio_compile.probe`) times three compiled and three
eager calls in every process, each synchronised with the device: in a fresh
process after ``build()``, three eager steps, and six waits for the device that
the workflow's host work cannot overlap. On an H100, FCN's eager step took 105.6
ms against the artifact's 73.2 (docs/bench/2026-11-28-h100-nineteenth). The
artifact computes the same in every process on the same kind of device and torch,
so its figures, once judged, are kept beside it (``speed-<hash>.json``, one per
device name, torch version and the TF32 flags the region's calls run under: eager
matmuls and convolutions read them, and so does the artifact where its precision
is PyTorch's global flags. A region in ``"tf32"`` runs under TF32 whatever the
flags outside it say, so a ``build(precision="tf32")`` stands for a forecast under
the TF32 flags, as its artifact does), and a later process's first call reports
them (as measured in an earlier process) instead of timing eager calls again.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from earth2studio_compile.artifacts import store
from earth2studio_compile.precision import tf32_under
from earth2studio_compile.probe import is_slower

__all__ = ["FIGURES", "recall", "remember", "speed_file", "timing_text"]

#: The report's fields the probe fills (``RegionReport``), kept and recalled.
FIGURES = ("compiled_ms", "eager_ms", "compiled_range", "eager_range", "slower")


def timing_text(device: torch.device, precision: str | None) -> str:
    """What a region's timings depend on beyond the region: the device's kind (a
    GPU by its name: another model times otherwise), torch, and on CUDA the TF32
    flags its calls run under (:func:`~earth2studio_compile.precision.tf32_under`).

    Parameters
    ----------
    device : torch.device
        The device the calls run on
    precision : str | None
        The region's precision (None: PyTorch's flags)

    Returns
    -------
    str
        ``"<kind>|<torch version>|<TF32 flags>"``, without the flags off CUDA
    """
    if device.type != "cuda":
        # TF32 flags change nothing off CUDA: figures stand whatever they say.
        return f"{device.type}|{torch.__version__}"
    kind = torch.cuda.get_device_name(device)
    return f"{kind}|{torch.__version__}|{tf32_under(precision)}"


def speed_file(artifact: Path, device: torch.device, precision: str | None) -> Path:
    """Where the figures of ``artifact`` on ``device``'s kind of device are kept.

    Parameters
    ----------
    artifact : Path
        The artifact's directory
    device : torch.device
        The device it ran on (a GPU by its name: another model times otherwise)
    precision : str | None
        The region's precision (None: PyTorch's flags)

    Returns
    -------
    Path
        ``speed-<hash>.json`` in the artifact's directory, for the TF32 flags
        the region's calls run under
        (:func:`~earth2studio_compile.precision.tf32_under`)
    """
    text = timing_text(device, precision)
    return artifact / f"speed-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def remember(
    artifact: Path, device: torch.device, precision: str | None, report: Any
) -> None:
    """Keep the probe's figures of ``report`` beside ``artifact``. Never raises: a
    cache the process cannot write only means the next process probes again.

    Parameters
    ----------
    artifact : Path
        The artifact's directory
    device : torch.device
        The device the probe timed
    precision : str | None
        The region's precision (None: PyTorch's flags)
    report : RegionReport
        The region's report, its probe judged (``compiled_ms`` set)
    """
    figures = {name: getattr(report, name) for name in FIGURES}
    if figures["compiled_ms"] is None:
        return
    try:
        store.write_file(
            speed_file(artifact, device, precision), json.dumps(figures).encode()
        )
    except Exception as err:
        logger.debug(f"Could not keep the speed of {artifact}: {err!r}")


def recall(
    artifact: Path, device: torch.device, precision: str | None
) -> dict[str, Any] | None:
    """The figures an earlier process kept for ``artifact`` on this kind of device.

    Parameters
    ----------
    artifact : Path
        The artifact's directory
    device : torch.device
        The device it runs on now
    precision : str | None
        The region's precision (None: PyTorch's flags)

    Returns
    -------
    dict[str, Any] | None
        The report's :data:`FIGURES`; None where none were kept, or they are not
        readable as such
    """
    try:
        kept = json.loads(speed_file(artifact, device, precision).read_text())
        figures = {name: kept[name] for name in FIGURES}
        for name in ("compiled_ms", "eager_ms"):
            if not (isinstance(figures[name], float) and math.isfinite(figures[name])):
                return None
        for name in ("compiled_range", "eager_range"):
            low, high = figures[name]
            figures[name] = (float(low), float(high))
        if not isinstance(figures["slower"], bool):
            return None
        # The verdict as this version judges: figures kept under another rule
        # (ranges apart by 5% once) would keep a region compiled that runs slower.
        figures["slower"] = is_slower(
            figures["compiled_ms"],
            figures["eager_ms"],
            figures["compiled_range"],
            figures["eager_range"],
        )
        return figures
    except Exception:  # none kept, or damaged: the probe times again
        return None
