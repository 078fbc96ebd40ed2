"""Cores that no ahead-of-time artifact can serve, remembered across processes.

The export refuses a core that updates its buffers or inputs in place, or that
computes with tensors held beside its parameters and buffers
(:func:`~earth2studio_compile.artifacts.aot_build.build_region`): DLESyM's
atmosphere decoder keeps its recurrent state as plain attributes, and its
background build failed after 185 s on an H200 (traced, then refused;
docs/bench/2026-11-29-h200-twentyeighth). The refusal depends only on what the
artifact's key holds (the core's code and settings, the inputs' shapes), so each
later process would start the same build, share its machine with it for minutes,
and see it fail again. :func:`remember` keeps the reason under the cache root's
``aot/refused/<key>.json``; :func:`recall` gives it to a later first call, which
then runs the region eagerly at once (:mod:`earth2studio_compile.executors.
background`). A build that failed for another reason (killed, out of memory, a
compiler error a later PyTorch may not make) is not remembered: it is tried again.
An artifact that was built but gives another answer than eager on the call it was
built for is removed and its key refused (:func:`refuse_artifact`): the key holds
the PyTorch version, whose code generation made it wrong (torch 2.11's for the
zoo's FCN on the CPU, 2026-11-29), so a later PyTorch tries again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from earth2studio_compile.artifacts.store import keep_reason, read_reason

__all__ = ["Refused", "recall", "refuse_artifact", "refused_path", "remember"]


class Refused(RuntimeError):
    """The core cannot be built ahead of time for its key, in any process (the
    Dynamo path still compiles it).

    Parameters
    ----------
    reason : str
        Why, as a sentence: what :func:`remember` keeps and a build's report says
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} It stays on the Dynamo path.")
        #: Why, without what follows from it.
        self.reason = reason


def refused_path(aot: Path, key: str) -> Path:
    """Where the refusal of an artifact is kept.

    Parameters
    ----------
    aot : Path
        The artifacts' directory (``<cache root>/aot``)
    key : str
        The artifact's key

    Returns
    -------
    Path
        ``<aot>/refused/<key>.json``
    """
    return aot / "refused" / f"{key}.json"


def remember(aot: Path, key: str, reason: str) -> None:
    """Keep why the artifact ``key`` cannot be built. Never raises: a cache the
    process cannot write only means a later process tries the build again.

    Parameters
    ----------
    aot : Path
        The artifacts' directory (``<cache root>/aot``)
    key : str
        The artifact's key
    reason : str
        The refusal, as :attr:`Refused.reason` says it
    """
    keep_reason(refused_path(aot, key), reason, f"the refusal of {key}")


def recall(aot: Path | None, key: str) -> str | None:
    """Why an earlier build of ``key`` was refused; None where none was, or the
    record is not readable (the build is tried, as without it).

    Parameters
    ----------
    aot : Path | None
        The artifacts' directory (None: the cache is off)
    key : str
        The artifact's key

    Returns
    -------
    str | None
        The reason :func:`remember` kept
    """
    return None if aot is None else read_reason(refused_path(aot, key))


def refuse_artifact(path: Path, why: str) -> str:
    """Remove the artifact at ``path`` and refuse its key (:func:`remember`): it
    was built, but gives another answer than eager. Never raises.

    Parameters
    ----------
    path : Path
        The artifact's directory (``<cache root>/aot/<key>``)
    why : str
        How it differs from eager (:func:`~.aot_load.verify`'s reason)

    Returns
    -------
    str
        The refusal's reason, as kept
    """
    reason = f"its artifact gives another answer than eager ({why})"
    remember(path.parent, path.name, reason)
    shutil.rmtree(path, ignore_errors=True)
    return reason
