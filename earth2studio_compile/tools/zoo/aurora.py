"""The zoo's Aurora: Earth2Studio's wrapper around a random ``aurora.Aurora``.

Needs the ``microsoft-aurora`` package (and scipy, which its ``Batch`` imports);
nothing is downloaded. The wrapper (:class:`earth2studio.models.px.Aurora`) is used
as shipped; the small and medium sizes only override its fixed 720x1440 grid
(:func:`.grid.on_grid`).
"""

from __future__ import annotations

from typing import Any

import torch

from earth2studio_compile.tools.zoo.grid import Grid, on_grid
from earth2studio_compile.tools.zoo.weights import scramble

# Aurora 0.25 degree pretrained (``aurora.AuroraPretrained``, which Earth2Studio's
# load_model builds): the architecture's defaults, without LoRA.
_FULL: dict[str, Any] = {}
# The same architecture, shrunk: two Swin stages of two blocks (a shifted-window
# block in each), 2 latent levels, windows that fit the 4x8 patch grid.
_SMALL: dict[str, Any] = {
    "embed_dim": 32,
    "num_heads": 2,
    "encoder_depths": (2, 2),
    "encoder_num_heads": (2, 4),
    "decoder_depths": (2, 2),
    "decoder_num_heads": (4, 2),
    "latent_levels": 2,
    "patch_size": 4,
    "window_size": (2, 2, 4),
}

# The published window structure, shrunk: three Swin stages (one pair of blocks
# each, shifted windows (2, 6, 12) throughout), 4 latent levels, patch 4, on a
# 144x288 grid whose third stage (9x18 patches) pads its windows as the published
# one's (45x90) does; embed 32. On torch 2.11's CPU, Inductor's vectorised C++ for
# its Swin stages did not compile (the regions fell back to eager; torch 2.14
# compiles them, within 6e-7 of eager); the small size never reached that code.
_MEDIUM: dict[str, Any] = {
    "embed_dim": 32,
    "num_heads": 2,
    "encoder_depths": (2, 2, 2),
    "encoder_num_heads": (2, 4, 8),
    "decoder_depths": (2, 2, 2),
    "decoder_num_heads": (8, 4, 2),
    "latent_levels": 4,
    "patch_size": 4,
    "window_size": (2, 6, 12),
}
_CONFIGS = {"small": (_SMALL, Grid(16, 32)), "medium": (_MEDIUM, Grid(144, 288))}


def aurora(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio Aurora around a random ``aurora.Aurora`` core.

    Parameters
    ----------
    size : str, optional
        ``"full"``: the 1.3 B parameter 0.25 degree configuration on 720x1440
        (embed 512, Swin depths (6, 10, 8) / (8, 10, 6), no LoRA, as Earth2Studio
        loads it); ``"medium"``: 144x288, embed 32, the published windows
        (2, 6, 12) over three Swin stages of two blocks, 4 latent levels, the
        last stage padding its windows; ``"small"``: 16x32, embed 32, two Swin
        stages of two blocks, 2 latent levels, windows (2, 2, 4). By default
        "small"
    seed : int, optional
        Weight seed, by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.Aurora`` (subclassed for the small grid)
    """
    from aurora import Aurora as AuroraCore
    from earth2studio.models.px import Aurora

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    full = size == "full"
    config, grid = (_FULL, Grid(720, 1440)) if full else _CONFIGS[size]
    core = AuroraCore(use_lora=False, **config).eval()
    # Aurora zero-initialises its blocks' norm modulations: built as it is, every
    # Swin block returned its input (a bf16 cost of 0.0 in a stage, on an H200).
    scramble(core, gen)
    shape = (grid.nlat, grid.nlon)
    cls = Aurora if full else on_grid(Aurora, grid)
    return cls(
        core,
        z=torch.randn(shape, generator=gen) * 1e4,
        slt=torch.randint(0, 8, shape, generator=gen).float(),
        lsm=(torch.rand(shape, generator=gen) > 0.7).float(),
    )
