"""Importing Earth2Studio without the noise of optional GPU libraries it loads.

``import earth2studio.run`` imports physicsnemo, whose modules call ``warp.init()``
at import time. On a machine without the NVIDIA driver, Warp's native library then
prints ``Warp CUDA warning: Could not find or load the NVIDIA CUDA driver`` straight
to file descriptor 2 (``fprintf``), where no Python setting reaches it. It tells a
CPU user nothing: Earth2Studio does not run Warp kernels, and PyTorch reports the
same machine as having no CUDA. :func:`quiet_imports` keeps that one line, passes
on everything else the imports print, and logs the dropped line at TRACE.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

from loguru import logger

# Lines printed by native code during imports that say only "no GPU here".
NOISE = ("Warp CUDA warning: Could not find or load the NVIDIA CUDA driver",)


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Drop :data:`NOISE` lines written to file descriptor 2 inside the block.

    Everything else written there is written again, in order, when the block ends.
    Where descriptor 2 cannot be redirected, nothing is dropped.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            kept = []
            for line in text.splitlines(keepends=True):
                if any(noise in line for noise in NOISE):
                    logger.trace(f"Dropped while importing: {line.strip()}")
                else:
                    kept.append(line)
            if kept:
                os.write(2, "".join(kept).encode())
