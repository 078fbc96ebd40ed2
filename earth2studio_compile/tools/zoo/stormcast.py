"""The zoo's StormCast: Earth2Studio's wrapper around random physicsnemo UNets.

:class:`earth2studio.models.px.StormCast` as shipped: a regression
``StormCastUNet`` and an ``EDMPrecond`` diffusion denoiser (both Song UNets),
sampled by physicsnemo's EDM sampler. The wrapper's grid is a window of the HRRR
grid (``hrrr_lat_lim``/``hrrr_lon_lim``), so the small size is a smaller window, not
a subclass. Its global conditioning comes from a :class:`.data.SeededRandom` source
on a coarse lat-lon grid, interpolated to the window by the wrapper as it would
interpolate GFS. Nothing is downloaded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from earth2studio_compile.tools.zoo.data import SeededRandom
from earth2studio_compile.tools.zoo.grid import Grid
from earth2studio_compile.tools.zoo.weights import scramble

# The UNets physicsnemo's StormCast example builds for the published model: Song
# UNets of 128 channels, 4 blocks a level, channel_mult [1, 2, 2, 2, 2], no
# attention, no positional embedding; the regression net has no noise embedding.
_FULL: dict[str, Any] = {"channel_mult": [1, 2, 2, 2, 2], "attn_resolutions": []}
_SMALL: dict[str, Any] = {
    "channel_mult": [1, 2],
    "attn_resolutions": [],
    "model_channels": 16,
    "num_blocks": 1,
}
_SMALL_VARIABLES = ["u10m", "v10m", "t2m", "msl"]
_SMALL_CONDITIONING = ["u10m", "v10m", "t2m"]
_INVARIANTS = 2  # land-sea mask and orography


def stormcast(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio StormCast around random regression and diffusion UNets.

    Parameters
    ----------
    size : str, optional
        ``"full"``: the published layout, 99 HRRR variables on the 512x640 window,
        26 conditioning variables, 18 sampler steps; ``"small"``: 4 variables on a
        16x32 window, 3 conditioning variables, UNets of 16 channels with two
        levels, 4 sampler steps. By default "small"
    seed : int, optional
        Weight seed (the conditioning data's seed too), by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.StormCast``
    """
    from earth2studio.models.px import StormCast
    from earth2studio.models.px.stormcast import CONDITIONING_VARIABLES, VARIABLES
    from physicsnemo.diffusion.preconditioners.legacy import EDMPrecond
    from physicsnemo.models.diffusion_unets import StormCastUNet

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    full = size == "full"
    variables = list(VARIABLES) if full else _SMALL_VARIABLES
    conditioning = list(CONDITIONING_VARIABLES) if full else _SMALL_CONDITIONING
    lat_lim, lon_lim = ((273, 785), (579, 1219)) if full else ((273, 289), (579, 611))
    shape = [lat_lim[1] - lat_lim[0], lon_lim[1] - lon_lim[0]]
    unet = _FULL if full else _SMALL
    n, m = len(variables), len(conditioning)
    regression = StormCastUNet(
        img_resolution=shape,
        img_in_channels=n + m + _INVARIANTS,
        img_out_channels=n,
        model_type="SongUNet",
        embedding_type="zero",
        **unet,
    )
    # The denoiser sees the noisy state and its condition: the state, the
    # regression's estimate and the invariants.
    diffusion = EDMPrecond(
        img_resolution=shape,
        img_channels=n,
        img_in_channels=n + 2 * n + _INVARIANTS,
        img_out_channels=n,
        model_type="SongUNet",
        **unet,
    )
    coarse = Grid(45, 90, south_pole=True)
    source = SeededRandom(OrderedDict({"lat": coarse.lat, "lon": coarse.lon}), seed)
    return StormCast(
        # physicsnemo's Song UNet initializes its output convolutions and each
        # block's second convolution near zero (1e-5): untrained, the networks'
        # outputs are ~1e-5, and a forecast would not show a wrong compiled one.
        scramble(regression, gen),
        scramble(diffusion, gen),
        means=torch.randn(1, n, 1, 1, generator=gen) * 0.1,
        stds=1.0 + torch.rand(1, n, 1, 1, generator=gen),
        invariants=torch.rand(1, _INVARIANTS, *shape, generator=gen),
        hrrr_lat_lim=lat_lim,
        hrrr_lon_lim=lon_lim,
        variables=np.array(variables),
        conditioning_means=torch.randn(1, m, 1, 1, generator=gen) * 0.1,
        conditioning_stds=1.0 + torch.rand(1, m, 1, 1, generator=gen),
        conditioning_variables=np.array(conditioning),
        conditioning_data_source=source,
        sampler_steps=18 if full else 4,
    )
