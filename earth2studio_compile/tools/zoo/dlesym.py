"""The zoo's DLESyM: Earth2Studio's coupled wrapper around random HEALPix UNets.

:class:`earth2studio.models.px.DLESyM` as shipped: an atmosphere model (physicsnemo's
recurrent ``HEALPixRecUNet``, 8 variables, 16 six-hourly output times a call, sea
surface temperature coupled in) and an ocean model (a plain ``HEALPixUNet``, SST
over two 48-hour steps, with the atmosphere's 48-hour means of ``z1000`` and
``ws10m`` coupled in), on a HEALPix grid of ``12 x nside x nside`` pixels. The
wrapper takes ready networks and its grid size, so neither size needs a subclass;
constants, normalisation and the networks' weights are random (seeded), nothing is
downloaded. ``dlesym_latlon`` wraps the same networks in
:class:`earth2studio.models.px.DLESyMLatLon`, which regrids from and to a 721 x 1440
lat/lon grid around them.

Needs ``earth2grid`` (NVlabs), which Earth2Studio's module imports and which is not
on the package index: CI builds it from the source vendored in ``third_party/``
(``.ci/build-earth2grid.sh``) into a folder of its own (``.ci/run``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_LAYERS = "physicsnemo.models.dlwp_healpix.layers."
_GELU = {"_target_": "physicsnemo.nn.CappedGELU", "cap_value": 10}
_CONV = {
    "_target_": _LAYERS + "SymmetricConvNeXtBlock",
    "kernel_size": 3,
    "upscale_factor": 4,
    "activation": _GELU,
}
# The DLESyM authors' networks (AtmosSci-DLESM/DLESyM, models/dlwp and models/dlom
# hydra configurations at 84fac64): UNet widths per level, encoder first (the
# decoder mirrors them), and dilations, the ocean decoder's as its configuration
# lists them (not mirrored). Their per-level block counts are left out: the
# SymmetricConvNeXtBlock they configure ignores them.
_FULL: dict[str, Any] = {
    "nside": 64,
    "atmos": [180, 90, 90],
    "atmos_dilations": [1, 2, 4],
    "ocean": [90, 45, 45],
    "ocean_dilations": [1, 1, 2],
}
# Two levels, not three: on a 2-core CPU, Inductor's cold compile is the C++ of
# physicsnemo's pure-torch HEALPix padding (a kernel of thousands of lines per
# padded convolution, two per level in each half of each UNet); three levels took
# 346 s, two 205 s (with the atmosphere decoder's recompile, which the three-level
# run did not have). The levels are equally wide because the decoder's first
# block must keep its input's width: SymmetricConvNeXtBlock skips with an identity
# where its input is as wide as its latent width (whatever its output width), as
# the published 90, 90 and 45, 45 satisfy.
_SMALL: dict[str, Any] = {
    "nside": 32,
    "atmos": [12, 12],
    "atmos_dilations": [1, 2],
    "ocean": [6, 6],
    "ocean_dilations": [1, 1],
}
_CONSTANTS = 2  # land-sea mask and orography


def _encoder(channels: list[int], dilations: list[int]) -> Any:
    """A physicsnemo ``UNetEncoder`` configuration."""
    from omegaconf import OmegaConf

    # Not recursive: the encoder instantiates its blocks itself, per level.
    return OmegaConf.create(
        {
            "_target_": _LAYERS + "UNetEncoder",
            "_recursive_": False,
            "n_channels": channels,
            "dilations": dilations,
            "conv_block": _CONV,
            "down_sampling_block": {
                "_target_": "physicsnemo.nn.HEALPixAvgPool",
                "pooling": 2,
            },
        }
    )


def _decoder(channels: list[int], dilations: list[int], recurrent: bool) -> Any:
    """A physicsnemo ``UNetDecoder`` configuration; ``channels`` are the encoder's
    reversed (each level concatenates the encoder's skip)."""
    from omegaconf import OmegaConf

    config: dict[str, Any] = {
        "_target_": _LAYERS + "UNetDecoder",
        "_recursive_": False,
        "n_channels": channels,
        "dilations": dilations,
        "conv_block": _CONV,
        "up_sampling_block": {
            "_target_": _LAYERS + "TransposedConvUpsample",
            "upsampling": 2,
            "activation": _GELU,
        },
        "output_layer": {
            "_target_": _LAYERS + "BasicConvBlock",
            "kernel_size": 1,
            "n_layers": 1,
        },
    }
    if recurrent:
        # The authors' configuration also sets `downscale_factor`, which
        # physicsnemo's ConvGRUBlock does not take.
        config["recurrent_block"] = {
            "_target_": _LAYERS + "ConvGRUBlock",
            "_recursive_": False,
            "kernel_size": 1,
        }
    return OmegaConf.create(config)


def _networks(
    widths: dict[str, Any], healpixpad: bool
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The atmosphere's recurrent UNet and the ocean's UNet, as the wrapper's
    module constants (variables, input and output times) require them."""
    from earth2studio.models.px.dlesym import (
        _ATMOS_COUPLING_VARIABLES,
        _ATMOS_VARIABLES,
        _OCEAN_COUPLING_VARIABLES,
        _OCEAN_OUTPUT_TIMES,
        _OCEAN_VARIABLES,
    )
    from physicsnemo.models.dlwp_healpix import HEALPixRecUNet, HEALPixUNet

    atmos, ocean = widths["atmos"], widths["ocean"]
    # Two 6-hourly times in, two out per pass (so 8 passes for the wrapper's 16
    # output times); the first two of the wrapper's four input times warm the
    # GRUs up (presteps), whose state restarts every 24 hours of forecast. SST
    # enters at the last input time, held for the whole call.
    atmos_model = HEALPixRecUNet(
        encoder=_encoder(atmos, widths["atmos_dilations"]),
        decoder=_decoder(atmos[::-1], widths["atmos_dilations"][::-1], recurrent=True),
        input_channels=len(_ATMOS_VARIABLES),
        output_channels=len(_ATMOS_VARIABLES),
        n_constants=_CONSTANTS,
        decoder_input_channels=1,  # insolation
        input_time_dim=2,
        output_time_dim=16,
        delta_time="6h",
        reset_cycle="24h",
        presteps=1,
        enable_nhwc=False,
        enable_healpixpad=healpixpad,
        couplings=[
            {
                "coupler": "ConstantCoupler",
                "params": {
                    "variables": list(_ATMOS_COUPLING_VARIABLES),
                    "input_times": ["0H"],
                },
            }
        ],
    )
    # One pass a call: two 48-hourly times in and out, each with the
    # atmosphere's means over the 48 hours before it.
    hours = [f"{int(t / np.timedelta64(1, 'h'))}H" for t in _OCEAN_OUTPUT_TIMES]
    ocean_model = HEALPixUNet(
        encoder=_encoder(ocean, widths["ocean_dilations"]),
        decoder=_decoder(ocean[::-1], widths["ocean_dilations"], recurrent=False),
        input_channels=len(_OCEAN_VARIABLES),
        output_channels=len(_OCEAN_VARIABLES),
        n_constants=_CONSTANTS,
        decoder_input_channels=1,
        input_time_dim=2,
        output_time_dim=2,
        presteps=0,
        enable_nhwc=False,
        enable_healpixpad=False,
        couplings=[
            {
                "coupler": "TrailingAverageCoupler",
                "params": {
                    "variables": list(_OCEAN_COUPLING_VARIABLES),
                    "input_times": hours,
                    "averaging_window": "48H",
                },
            }
        ],
    )
    return atmos_model, ocean_model


def dlesym(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio DLESyM around random atmosphere and ocean HEALPix UNets.

    Parameters
    ----------
    size : str, optional
        ``"full"``: the published layout, nside 64 (12 x 64 x 64 pixels), UNets of
        widths 180/90/90 (atmosphere, ConvGRU in every decoder level) and 90/45/45
        (ocean), earth2grid's CUDA HEALPix padding in the atmosphere where the
        model is built on a machine with CUDA; ``"small"``: nside 32, two
        levels of widths 12/12 and 6/6, the same variables and times. By default
        "small"
    seed : int, optional
        Seed of the weights, constants and normalisation, by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.DLESyM``, on CPU
    """
    from earth2studio.models.px.dlesym import DLESyM

    return _coupled(DLESyM, size, seed)


def dlesym_latlon(size: str = "small", seed: int = 0) -> torch.nn.Module:
    """Earth2Studio DLESyMLatLon: :func:`dlesym`'s networks behind lat/lon regridding.

    The same networks, constants and normalisation as ``dlesym(size, seed)``; the
    wrapper takes and returns fields on a 721 x 1440 equiangular lat/lon grid
    (whatever ``size``: Earth2Studio fixes it), with the base variables ``u10m``,
    ``v10m``, ``z300`` and ``z700`` in place of the derived ``ws10m`` and
    ``tau300-700``, and regrids to and from the HEALPix grid with earth2grid
    around the networks' HEALPix loop.

    Parameters
    ----------
    size : str, optional
        As for :func:`dlesym` (the HEALPix grid and networks), by default "small"
    seed : int, optional
        As for :func:`dlesym`, by default 0

    Returns
    -------
    torch.nn.Module
        An ``earth2studio.models.px.DLESyMLatLon``, on CPU
    """
    from earth2studio.models.px.dlesym import DLESyMLatLon

    return _coupled(DLESyMLatLon, size, seed)


def _coupled(cls: type[torch.nn.Module], size: str, seed: int) -> torch.nn.Module:
    """``cls`` (DLESyM or a subclass taking its arguments) around the random
    networks, constants and normalisation of ``size`` and ``seed``."""
    import earth2grid
    from earth2studio.models.px.dlesym import (
        _ATMOS_COUPLING_VARIABLES,
        _ATMOS_INPUT_TIMES,
        _ATMOS_OUTPUT_TIMES,
        _ATMOS_VARIABLES,
        _OCEAN_COUPLING_VARIABLES,
        _OCEAN_INPUT_TIMES,
        _OCEAN_OUTPUT_TIMES,
        _OCEAN_VARIABLES,
    )

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    full = size == "full"
    widths = _FULL if full else _SMALL
    nside = widths["nside"]
    # The published atmosphere model pads with earth2grid's CUDA kernel (the
    # authors' `enable_healpixpad`); physicsnemo takes it only where CUDA is
    # available when the layers are built, else its pure-torch padding.
    atmos_model, ocean_model = _networks(widths, healpixpad=full)
    grid = earth2grid.healpix.Grid(
        level=int(np.log2(nside)), pixel_order=earth2grid.healpix.HEALPIX_PAD_XY
    )
    lat, lon = (np.asarray(a).reshape(12, nside, nside) for a in (grid.lat, grid.lon))
    n_out = len(_ATMOS_VARIABLES) + len(_OCEAN_VARIABLES)
    scale = (1, 1, 1, n_out, 1, 1, 1)
    constants = (12, _CONSTANTS, nside, nside)
    return cls(
        atmos_model,
        ocean_model,
        hpx_lat=lat,
        hpx_lon=lon,
        nside=nside,
        center=(0.1 * torch.randn(scale, generator=gen)).double().numpy(),
        scale=(1 + torch.rand(scale, generator=gen)).double().numpy(),
        atmos_constants=torch.randn(constants, generator=gen).numpy(),
        ocean_constants=torch.randn(constants, generator=gen).numpy(),
        atmos_input_times=_ATMOS_INPUT_TIMES,
        ocean_input_times=_OCEAN_INPUT_TIMES,
        atmos_output_times=_ATMOS_OUTPUT_TIMES,
        ocean_output_times=_OCEAN_OUTPUT_TIMES,
        atmos_variables=list(_ATMOS_VARIABLES),
        ocean_variables=list(_OCEAN_VARIABLES),
        atmos_coupling_variables=list(_ATMOS_COUPLING_VARIABLES),
        ocean_coupling_variables=list(_OCEAN_COUPLING_VARIABLES),
        use_cln=False,
    )
